"""The KV pool: per-layer K and V tensors indexed by slot, and how many slots fit in memory.

A latent pool (`planes=1`, multi-head latent attention) holds one tensor per layer, `k`,
whose row per slot is the token's compressed latent (`[num_slots, 1, latent_dim]`); its
`v` list is empty, since values are read from the same rows. A model whose layers keep
state of different sizes (DeepSeek-V4) gives each layer its own row width (`layer_dims`).

The scheduler owns which slot holds which token; the worker only owns the tensors. Slot 0
is a padding sink: it is never a real token, so batched gathers may point padding at it.

`kv_dtype` "fp8" (float8_e4m3fn) or "int8" quantizes the pool: each (slot, kv_head) row of
head_dim values keeps one float32 scale beside it (`k_scale`, `v_scale`); the attention
backends write it with `kernels.kv.store` (or its torch reference), and readers dequantize
on load. "fp8_e4m3" stores float8_e4m3fn codes with one scale for the whole tensor, 1 (the
values themselves, clamped to +-448): no scale is stored or read. "auto" stores K/V in the
model's dtype, unscaled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from kernels.kv.store import QUANT_MAX, scale_pairs

GiB = 1 << 30
# kv_dtype -> pool element dtype
KV_STORAGE = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "int8": torch.int8}
UNSCALED = ("fp8_e4m3",)  # the quantized kv_dtypes with a per-tensor scale of 1: no scales
SCALE_DTYPE = torch.float32


def check_latent_kv_dtype(latent: bool, kv_dtype: str) -> None:
    """`ValueError` naming `kv_dtype` if a latent pool (one row a token) cannot store it: its
    unscaled fp8 is for K/V pools only."""
    if latent and kv_dtype in UNSCALED:
        raise ValueError(f"kv_dtype {kv_dtype!r} is for K/V pools; a latent pool takes 'fp8' "
                         "or 'int8'")


def kv_dtype_scaled(kv_dtype: str) -> bool:
    """True for kv dtypes whose pool stores a float32 scale per (token, kv head): "fp8" and
    "int8". False for "auto" and "fp8_e4m3" (one scale of 1 for the whole tensor), and for any
    name that is not a quantized kv dtype."""
    return kv_dtype in KV_STORAGE and kv_dtype not in UNSCALED


def kv_storage_dtype(kv_dtype: str, dtype: torch.dtype) -> torch.dtype:
    """The pool's element dtype: the model's `dtype` for "auto", else float8_e4m3fn / int8."""
    if kv_dtype == "auto":
        return dtype
    if kv_dtype not in KV_STORAGE:
        raise ValueError(
            f"kv_dtype must be 'auto' or one of {sorted(KV_STORAGE)}, got {kv_dtype!r}"
        )
    return KV_STORAGE[kv_dtype]


def kv_bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                       planes: int = 2, scaled: bool = True) -> int:
    """Bytes one token occupies in a pool of element `dtype`: planes (2: K and V; 1: a latent)
    x layers x kv_heads x (head_dim x bytes, plus a float32 scale when `dtype` is quantized
    and `scaled`)."""
    scale = SCALE_DTYPE.itemsize if dtype in QUANT_MAX and scaled else 0
    return planes * num_layers * kv_heads * (head_dim * dtype.itemsize + scale)


def pool_bytes_per_token(layer_dims: Sequence[int], kv_heads: int, dtype: torch.dtype,
                         planes: int = 2, scaled: bool = True) -> int:
    """`kv_bytes_per_token` of a pool whose layers hold `layer_dims[i]` values a head."""
    return sum(kv_bytes_per_token(1, kv_heads, d, dtype, planes, scaled) for d in layer_dims)


def slots_for_memory(
    free_bytes: int, bytes_per_token: int, mem_fraction: float, reserve_bytes: int
) -> int:
    """Slots (padding slot included) that fit in `mem_fraction` of `free_bytes` less a reserve.

    `free_bytes` is measured after the weights are loaded; `reserve_bytes` is kept back for
    activations, logits and sampler temporaries.
    """
    budget = int(free_bytes * mem_fraction) - reserve_bytes
    if budget < 2 * bytes_per_token:
        raise MemoryError(
            f"no room for the KV pool: {free_bytes / GiB:.2f} GiB free x {mem_fraction} "
            f"less a {reserve_bytes / GiB:.2f} GiB reserve leaves {budget / GiB:.2f} GiB, "
            f"and one token needs {bytes_per_token} bytes"
        )
    return budget // bytes_per_token


def cuda_free_bytes(device: torch.device) -> int:
    """Free memory on a CUDA device right now (the allocator's cache counts as used)."""
    free, _total = torch.cuda.mem_get_info(device)
    return free


class LayerKV(NamedTuple):
    """One layer of a pool: K and V `[num_slots, kv_heads, head_dim]` and their scales
    `[num_slots, kv_heads]` float32 (None: no scales; a latent pool has no V)."""

    k: torch.Tensor
    v: torch.Tensor | None
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None


class KVPool:
    """K and V for every layer: `k[layer]`, `v[layer]` are `[num_slots, kv_heads, head_dim]`
    in `self.dtype` (the model's `dtype`, or fp8/int8 for a quantized `kv_dtype`).

    A quantized pool also holds `k_scale[layer]`, `v_scale[layer]` `[num_slots, kv_heads]`
    float32 (`scaled`: the halves of `kv_scales[layer]` `[num_slots, kv_heads, 2]`); an
    unquantized or "fp8_e4m3" one has empty scale lists. With
    `planes=1` (a latent pool) only `k` (and `k_scale`) exist: `v` and `v_scale` are empty.
    `layer_dims`: each layer's own head_dim, where they differ (`head_dim` is their largest).
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        kv_dtype: str = "auto",
        planes: int = 2,
        layer_dims: Sequence[int] | None = None,
    ) -> None:
        if num_slots < 2:
            raise ValueError(f"num_slots must be >= 2 (slot 0 is padding), got {num_slots}")
        if planes not in (1, 2):
            raise ValueError(f"planes must be 1 (latent) or 2 (K and V), got {planes}")
        check_latent_kv_dtype(planes == 1, kv_dtype)
        self.planes = planes
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.layer_dims = tuple(layer_dims or [head_dim] * num_layers)
        if len(self.layer_dims) != num_layers or max(self.layer_dims) != head_dim:
            raise ValueError(f"layer_dims {self.layer_dims}: one a layer ({num_layers}), "
                             f"the largest head_dim ({head_dim})")
        self.dtype = kv_storage_dtype(kv_dtype, dtype)
        self.quantized = self.dtype in QUANT_MAX
        self.scaled = kv_dtype_scaled(kv_dtype)
        # zeros, not empty: padded reads of slot 0 (or a stale slot) must stay finite,
        # because a masked score times a NaN value is still NaN
        shapes = [(num_slots, kv_heads, d) for d in self.layer_dims]
        self.k = [torch.zeros(shape, dtype=self.dtype, device=device) for shape in shapes]
        v_shapes = shapes if planes == 2 else []
        self.v = [torch.zeros(shape, dtype=self.dtype, device=device) for shape in v_shapes]
        # ones: the scale `quantize_ref` gives an all-zero row, so unwritten slots read as 0.
        # K and V's scales are the halves of one [num_slots, kv_heads, 2] tensor a layer
        # (`scale_pairs`: decode reads a key's two with one load); a latent's are its own
        n_scales = num_layers if self.scaled else 0
        if planes == 2:
            self.kv_scales = [scale_pairs(num_slots, kv_heads, device) for _ in range(n_scales)]
            self.k_scale = [pair[..., 0] for pair in self.kv_scales]
            self.v_scale = [pair[..., 1] for pair in self.kv_scales]
        else:
            self.kv_scales, self.v_scale = [], []
            self.k_scale = [torch.ones(num_slots, kv_heads, dtype=SCALE_DTYPE, device=device)
                            for _ in range(n_scales)]

    @property
    def bytes_per_token(self) -> int:
        """K, V (or the latent) and (when quantized) their scales, over all layers."""
        return pool_bytes_per_token(self.layer_dims, self.kv_heads, self.dtype, self.planes,
                                    self.scaled)

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_token * self.num_slots

    def layer_tensors(self) -> list[torch.Tensor]:
        """Every tensor indexed by slot: each layer's K, each layer's V, then the scales (a
        K/V pool's as each layer's `[num_slots, kv_heads, 2]` pair, a latent's `k_scale`)."""
        return self.k + self.v + (self.kv_scales if self.planes == 2 else self.k_scale)

    def layer(self, layer_id: int) -> LayerKV:
        """Layer `layer_id`'s tensors (a latent pool: its rows as `k`, no `v`)."""
        v = self.v[layer_id] if self.planes == 2 else None
        return LayerKV(self.k[layer_id], v, *self.scales(layer_id))

    def scales(self, layer_id: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Layer `layer_id`'s (k_scale, v_scale) `[num_slots, kv_heads]`, or Nones without
        scales (unquantized, or "fp8_e4m3")."""
        if not self.scaled:
            return None, None
        v_scale = self.v_scale[layer_id] if self.planes == 2 else None
        return self.k_scale[layer_id], v_scale
