"""ModelRunner: the model, its weights, the KV pool, the attention backend and the sampler
on one device; `forward(fb)` turns a ForwardBatch into logits for the rows to sample."""

from __future__ import annotations

import contextlib
import logging
import math
import os

import torch

from runtime.model_config import ModelSpec
from runtime.worker.attention import AttentionBackend
from runtime.worker.attention_mla import MlaShape, TorchMLAAttention, TritonMLAAttention
from runtime.worker.attention_torch import TorchAttention
from runtime.worker.attention_triton import TritonAttention
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.graph_runner import GraphRunner
from runtime.worker.kv_pool import (
    GiB,
    KVPool,
    cuda_free_bytes,
    kv_dtype_scaled,
    kv_storage_dtype,
    pool_bytes_per_token,
    slots_for_memory,
)
from runtime.worker.loader import load_model
from runtime.worker.lora.manager import LoraManager, LoraOptions
from runtime.worker.models.deepseek import DeepseekForCausalLM
from runtime.worker.models.deepseek_v4 import DeepseekV4ForCausalLM
from runtime.worker.models.deepseek_v4_entries import (
    check_v4_kv_dtype,
    entry_bytes_per_token,
    entry_count,
)
from runtime.worker.models.deepseek_v4_state import graph_context
from runtime.worker.quant.fp8_linear import check_fp8_support
from runtime.worker.sampler import Sampler
from runtime.worker.tp import TPGroup

CPU_DEFAULT_SLOTS = 16384
CPU_KV_BUDGET = 2 * GiB  # the CPU default never takes more than this
ACTIVATION_RESERVE = 1 * GiB  # on top of the logits and sampler temporaries
ATTENTION_BACKENDS = {"triton": TritonAttention, "torch": TorchAttention}
MLA_BACKENDS = {"triton": TritonMLAAttention, "torch": TorchMLAAttention}
# the most decode rows of a step of several tokens a request without CUDA graphs: each row
# reads its request's whole KV (`BatchBuilder`)
EAGER_DECODE_ROWS = 256

log = logging.getLogger("sluice.worker")


def make_attention(
    name: str, pool: KVPool, device: torch.device, mla: MlaShape | None = None
) -> AttentionBackend:
    """The attention backend `name` (`ServerConfig.attention_backend`) over `pool`: "auto"
    is triton on a CUDA device and torch elsewhere. Triton off CUDA runs only interpreted
    (TRITON_INTERPRET=1, as the tests do). With `mla` (a latent-attention model) the
    backend is that kind's MLA variant over a latent pool."""
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name not in ATTENTION_BACKENDS:
        raise ValueError(
            f"attention backend must be 'auto' or one of {sorted(ATTENTION_BACKENDS)}, got {name!r}"
        )
    if name == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"the triton attention backend needs a CUDA device, not {device} "
            "(or TRITON_INTERPRET=1)"
        )
    if mla is not None:
        return MLA_BACKENDS[name](pool, mla)
    return ATTENTION_BACKENDS[name](pool)


class ModelRunner:
    """Owns every tensor of the worker on one device; the scheduler owns the slot numbers.

    `kv_slots == 0` sizes the pool from free CUDA memory after the weights (`mem_fraction`
    of it, less a reserve for activations), or takes a default on CPU. `kv_slots` tokens
    fit: the pool holds one more entry, slot 0, the padding sink. `kv_dtype` "fp8" or "int8"
    quantizes the pool (see `KVPool`); sizing and `kv_bytes_per_token` count the stored
    bytes, scales included, so a quantized pool fits about twice the fp16/bf16 tokens.
    `page_size` is the page size of the decode batches the CUDA graphs are captured for;
    `attention_backend` names the attention kernels (`make_attention`), and CUDA graphs
    are captured only for a backend that supports them.
    Under tensor parallelism (`tp`) the runner holds this rank's shard of the model and of
    the KV heads (`kv_bytes_per_token` is this rank's share); the logits are whole.
    A latent-attention (MLA) model gets a latent pool: one `[L + Dr]` row a token and layer;
    DeepSeek-V4 a pool of its own rows (`kv_layout`) and entry pools beside it, their ids
    handed out by the scheduler with `entry_table` (`entry_ids`: how many a rate; the
    token layout), else following the pages of `page_size` (`deepseek_v4_entries`), both
    counted in `kv_bytes_per_token`, attended by the model itself (the backend gives it
    the page table, and in CUDA graphs its static copy: decode graphs up to its
    `graph_context`, padding rows on its sink request row; a capture that fails logs why
    and leaves decode eager), in 16 bits or "fp8" (rows and entries; `V4_KV_DTYPES`), and
    its partial blocks (and entry tables) per request row (`row_state_bytes`), allocated
    before the pool is sized; its prefix hits follow `prefix_align` / `prefix_replay`
    (`CausalLM.prefix_rule`).
    `quantization="fp8"` holds the projections' weights in fp8 (`Fp8Linear`); a device
    without fp8 matmul raises `QuantizationError` before anything is loaded.
    With `lora`, the adapters are read and their device slots allocated (`LoraManager`)
    before the KV pool takes the memory left; a bad adapter raises `AdapterError`.
    `kv_bytes_extra`: bytes a token takes in another pool over the same slots (a draft
    model's), counted when the pool is sized from memory. `graph_rows` (0: `max_rows`):
    the most rows of the decode batches captured in CUDA graphs; a verify step runs as a
    decode batch of one row a token (`BatchBuilder`), so speculation asks for more.
    `capture` (None: none) makes `forward_features` available: the features a draft head
    reads besides the logits (`CausalLM.forward_features`), CUDA graphs included.
    `max_drafts`: the most drafts of a verify step (0: no speculation), for which the
    partial blocks per request row keep room (a verify step may compute that many
    positions past those it keeps).
    """

    def __init__(
        self,
        spec: ModelSpec,
        device: str | torch.device,
        dtype: torch.dtype,
        kv_slots: int,
        max_rows: int,
        seed: int = 0,
        mem_fraction: float = 0.85,
        cuda_graph: bool = True,
        kv_dtype: str = "auto",
        page_size: int = 1,
        tp: TPGroup | None = None,
        attention_backend: str = "auto",
        quantization: str = "none",
        lora: LoraOptions | None = None,
        kv_bytes_extra: int = 0,
        graph_rows: int = 0,
        capture: tuple[int, ...] | None = None,
        entry_table: bool = False,
        max_drafts: int = 0,
    ) -> None:
        self.device = torch.device(device)
        self.dtype = dtype
        self.tp = tp = tp or TPGroup()
        if quantization == "fp8":
            check_fp8_support(self.device)
        self.model = load_model(spec, self.device, dtype, seed, tp, quantization)
        self.capture = capture
        self.quantization = self.model.quantization  # "fp8" for an fp8 checkpoint too
        self.lora = LoraManager(self.model, lora, self.device, dtype) if lora else None
        arch = self.model.arch
        self.vocab_size = arch.vocab_size
        mla = self.model.mla if isinstance(self.model, DeepseekForCausalLM) else None
        rows = isinstance(self.model, DeepseekV4ForCausalLM)  # its own rows, its own attention
        self.own_attention = rows
        self.prefix_align, self.prefix_replay = self.model.prefix_rule()
        self.row_state_bytes = 0  # state kept per request row, beside the pool
        self.entry_ids: dict[int, int] = {}  # ids the scheduler hands out, by rate
        entry_bytes = 0
        if rows:
            check_v4_kv_dtype(kv_dtype)
            planes, kv_heads, layer_dims = self.model.kv_layout()
            head_dim = max(layer_dims)
            # before the pool is sized: its partial blocks per request row take memory first
            self.row_state_bytes = self.model.allocate_rows(max_rows, dtype, spec.max_context,
                                                            entry_table, max_drafts)
            entry_bytes = math.ceil(entry_bytes_per_token(self.model.arch, dtype, page_size,
                                                          entry_table, kv_dtype))
        elif mla is None:  # K and V of this rank's KV heads
            planes, kv_heads, head_dim = 2, arch.num_kv_heads // tp.size, arch.head_dim
        else:  # one latent row a token
            planes, kv_heads, head_dim = 1, 1, arch.latent_dim
        if not rows:
            layer_dims = [head_dim] * arch.num_layers
        self.kv_bytes_per_token = pool_bytes_per_token(
            layer_dims, kv_heads, kv_storage_dtype(kv_dtype, dtype), planes,
            kv_dtype_scaled(kv_dtype),
        ) + entry_bytes
        if kv_slots == 0:
            # never more than every row at full context could use; every rank the same
            kv_slots = tp.min_int(
                min(self._default_slots(max_rows, mem_fraction, kv_bytes_extra),
                    max_rows * spec.max_context)
            )
        self.kv_slots = kv_slots
        # the KV storage by name, as /get_model_info and /metrics show it: fp8, int8, bfloat16...
        self.kv_dtype = kv_dtype if kv_dtype != "auto" else str(dtype).removeprefix("torch.")
        self.kv_pool = KVPool(
            arch.num_layers, kv_slots + 1, kv_heads, head_dim, dtype, self.device, kv_dtype, planes,
            layer_dims,
        )
        if rows:
            store = self.model.allocate_entries(kv_slots + 1, page_size, kv_dtype)
            self.entry_ids = {m: n - 1 for m, n in store.counts.items()} if entry_table else {}
        self.attn = make_attention(attention_backend, self.kv_pool, self.device, mla)
        self.sampler = Sampler(max_rows, self.vocab_size, self.device, seed)
        limits = [spec.max_context, kv_slots]
        if arch.sliding_window is not None:  # exact only while the window covers everything
            limits.append(arch.sliding_window)
        self.max_context = min(limits)
        self.graphs: GraphRunner | None = None
        if self.device.type == "cuda" and cuda_graph:
            if self.attn.supports_graphs:
                self.graphs = self._capture_graphs(graph_rows or max_rows, max_rows,
                                                   page_size)
            else:
                log.warning(
                    "no CUDA graphs: the %s backend does not run in them", type(self.attn).__name__
                )

    def _capture_graphs(self, rows: int, max_rows: int, page_size: int) -> GraphRunner | None:
        """The decode graphs of up to `rows` rows. A model attending by itself gets graphs
        up to its `graph_context`, padding rows on its sink request row (`max_rows`), and
        where its capture fails, the reason in the log and no graphs (eager decode)."""
        own = self.own_attention
        context = (graph_context(self.model.arch, rows, self.max_context) if own
                   else self.max_context)
        graphs = GraphRunner(self.model, self.attn, rows, context, self.device, page_size,
                             self.lora, self.capture, sink_row=max_rows if own else 0)
        if not own:
            graphs.capture()
            return graphs
        try:
            graphs.capture()
        except Exception as err:  # any failure leaves decode eager, and says why
            log.warning("no CUDA graphs for %s decode: capture failed: %s: %s",
                        type(self.model).__name__, type(err).__name__, err)
            torch.cuda.empty_cache()
            return None
        return graphs

    @property
    def max_decode_rows(self) -> int:
        """The most rows (tokens) of a step of several tokens a request that is built as
        a decode batch (`BatchBuilder`): the largest CUDA graph, `EAGER_DECODE_ROWS`
        without graphs, 0 (never) for a model that attends by itself over its sequences."""
        if self.own_attention:
            return 0
        return self.graphs.sizes[-1] if self.graphs is not None else EAGER_DECODE_ROWS

    def host_entry_pools(self, host_slots: int) -> dict[int, tuple[list[torch.Tensor], int]]:
        """For a host tier of `host_slots` slots (`KVTransfer`), by rate: the entry pools
        (DeepSeek-V4's) and the host ids they need (one a window of `rate` host slots, the
        sink included); empty for a model without them."""
        store = self.model.entries if self.own_attention else None
        return {m: (store.pools(m), entry_count(host_slots + 1, m, 1, True, 0))
                for m in (store.rates if store else ())}

    def _default_slots(self, max_rows: int, mem_fraction: float, extra: int) -> int:
        per_token = self.kv_bytes_per_token + extra
        if self.device.type != "cuda":
            return max(2, min(CPU_DEFAULT_SLOTS, CPU_KV_BUDGET // per_token))
        # logits [rows, V] fp32 plus a few same-sized sampler temporaries
        reserve = ACTIVATION_RESERVE + 8 * max_rows * self.vocab_size * 4
        return slots_for_memory(cuda_free_bytes(self.device), per_token, mem_fraction, reserve)

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """Run one step; store the new tokens' KV; logits of rows `fb.sample_idx`: [S, V] fp32."""
        if self.graphs is not None and self.graphs.can_run(fb):
            return self.graphs.replay(fb)[0]  # [B, vocab]
        self.attn.prepare(fb)
        with self._lora(fb):
            hidden = self.model(fb, self.attn)  # [T, hidden]
        return self.model.compute_logits(hidden[fb.sample_idx])  # [S, vocab]

    @torch.inference_mode()
    def forward_features(self, fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward`'s logits [S, V] and every new token's features [T, w] (`capture`)."""
        if self.graphs is not None and self.graphs.can_run(fb):
            return self.graphs.replay(fb)  # [B, vocab], [B, w]
        self.attn.prepare(fb)
        with self._lora(fb):
            hidden, features = self.model.forward_features(fb, self.attn, self.capture)
        return self.model.compute_logits(hidden[fb.sample_idx]), features  # [S, V], [T, w]

    def _lora(self, fb: ForwardBatch):
        """The context applying the step's adapters (none without LoRA)."""
        return self.lora.step.applying(fb.lora) if self.lora else contextlib.nullcontext()
