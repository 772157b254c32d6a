"""`LoraLinear`: a projection of the base model plus the deltas of the adapters in its
slots, and `LoraStep`, the step's adapter segments that every such projection reads."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from kernels.gemm.lora import lora_expand, lora_expand_ref, lora_shrink, lora_shrink_ref
from runtime.worker.lora.batch import LoraBatch
from runtime.worker.ops import GateAct
from runtime.worker.tp import TPGroup


class LoraStep:
    """The `LoraBatch` of the forward running now, set for its duration by `applying`
    (which refuses nesting); None outside a forward or when no token has an adapter."""

    def __init__(self) -> None:
        self.batch: LoraBatch | None = None
        self._active = False

    @contextmanager
    def applying(self, batch: LoraBatch | None) -> Iterator[None]:
        if self._active:
            raise RuntimeError("a LoRA step is already being applied")
        self._active, self.batch = True, batch
        try:
            yield
        finally:
            self._active, self.batch = False, None


class LoraLinear(nn.Module):
    """`base(x)` plus, for each token of an adapter in slot s, (x A[s]^T) B[s]^T.

    The slots' weights live in fixed buffers, filled by copies (`load`): a `[slots, n * R,
    in]`, the n sub-projections' A blocks of a fused projection (q/k/v, gate/up) one after
    the other, and b `[slots, out, R]`, their B rows where the base's output has them
    (`slices`: the n output widths). Under tensor parallelism a column-parallel projection
    holds its rows of B, a row-parallel one (`row_parallel`) its columns of A: the partial
    products x A^T are summed over the group before B.
    """

    def __init__(self, base: nn.Module, slices: tuple[int, ...], rank: int, num_slots: int,
                 step: LoraStep, tp: TPGroup, row_parallel: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.base = base
        self.slices = slices
        self.step = step
        self.tp = tp if row_parallel and tp.size > 1 else None
        device = base.weight.device
        in_local = base.weight.shape[1]
        self.register_buffer("a", torch.zeros(num_slots, len(slices) * rank, in_local,
                                              dtype=dtype, device=device), persistent=False)
        self.register_buffer("b", torch.zeros(num_slots, sum(slices), rank, dtype=dtype,
                                              device=device), persistent=False)
        self.use_kernels = device.type == "cuda"

    def load(self, slot: int, a: torch.Tensor | None, b: torch.Tensor | None) -> None:
        """Copy one adapter's `[n * R, in]` / `[out, R]` (host, in slot layout) into `slot`;
        None: the adapter leaves this projection alone (zeros)."""
        if a is None:
            self.a[slot].zero_()
            self.b[slot].zero_()
            return
        self.a[slot].copy_(a, non_blocking=True)
        self.b[slot].copy_(b, non_blocking=True)

    def forward(self, x: torch.Tensor, gate_act: GateAct | None = None) -> torch.Tensor:
        """x `[T, in]` (`[T, 2 * in]`, gate then up, with the MLP's `gate_act`) -> `[T, out]`."""
        if gate_act is not None:
            x = gate_act(x)  # [T, in]: the base and the adapters both take the activation
        y = self.base(x)  # [T, out]
        batch = self.step.batch
        if batch is None:
            return y
        x = x.contiguous()
        if self.use_kernels:
            tmp = lora_shrink(x, self.a, batch.order, batch.indptr, batch.max_len)  # [T, n*R]
        else:
            tmp = lora_shrink_ref(x, self.a, batch.order, batch.indptr_cpu)  # [T, n*R]
        if self.tp is not None:
            tmp = self.tp.all_reduce(tmp)  # each rank holds a slice of x and of A's columns
        if self.use_kernels:
            lora_expand(y, tmp, self.b, batch.order, batch.indptr, batch.max_len, self.slices)
        else:
            lora_expand_ref(y, tmp, self.b, batch.order, batch.indptr_cpu, self.slices)
        return y
