"""`Drafter`: the worker's part of speculative decoding, for the algorithms that draft
with a model on the device (`--speculative-algorithm draft|eagle|mtp`), and for n-gram
lookup with overlap (`ngram`, `NgramOnDevice`: no model, one token id a slot, so its
verify steps chain); `load_drafter` picks and loads it.

A drafter's weights load before the target's KV pool is sized, which counts the bytes a
slot costs in the drafter's own pools (`kv_bytes_per_token`); once the target's runner
exists the drafter `allocate`s those pools over the target's slot numbering (and the
host tier, `--host-kv-gib`, copies them with the target's KV: `slot_tensors`). Each step it
wraps the target's forward (`step`): a draft model drafts its verify requests' tokens and
writes the draft KV of its other requests before it (`DraftModel`); an EAGLE head, or the
target checkpoint's MTP layer, drafts before it and takes the target's hidden states after
it (`HeadDrafter`). Either way the drafts are written over the plan's placeholder ids in
the target's input, and the target's samples decide what is kept. Where the target has
decode CUDA graphs, `allocate` captures the drafter's too, as large as the target's, and
its forwards of one token a request replay them (`DraftModel`, `HeadGraphs`).

Under tensor parallelism every rank runs the whole drafter over the same plan, so every
rank writes the same drafts into its input with no exchange of its own. A draft model and
an EAGLE head are replicated (small, and their draft steps are latency-bound: no
collective inside them); they use the target's embedding and, for EAGLE v1/v2, its LM
head, whose vocab-parallel collectives every rank calls in the same order. The MTP layer
of a DeepSeek-V3-family target, one of the target's own layers and as large, is cut over
the group as those are; DeepSeek-V4's (`V4MtpHead`) runs at `--tp 1` only and is refused
at start-up under `--tp N`.
Everything a rank keeps for the drafter a slot (the draft KV, a head's pool row and
whole-width feature row) counts in that rank's pool sizing.
"""

from __future__ import annotations

from typing import Protocol

import torch

from runtime.config.server import ServerConfig
from runtime.config.speculative import worker_drafts
from runtime.model_config import ModelSpec, resolve_model
from runtime.wire.worker_channel import BatchPlan
from runtime.worker.batch_builder import BatchBuilder
from runtime.worker.forward_batch import ForwardBatch
from runtime.worker.model_check import check_draft_model
from runtime.worker.model_runner import ModelRunner
from runtime.worker.speculative.draft_model import DraftModel
from runtime.worker.speculative.eagle_head import EagleHead
from runtime.worker.speculative.eagle_layout import read_layout
from runtime.worker.speculative.head_drafter import HeadDrafter
from runtime.worker.speculative.mtp_head import mtp_head_class
from runtime.worker.speculative.ngram_device import NgramOnDevice
from runtime.worker.tp import TPGroup


class Drafter(Protocol):
    """A drafter on the device, beside the target (see the module docstring)."""

    kv_bytes_per_token: int  # what a KV slot costs in the drafter's own pools
    # the features the target's forward returns besides its logits (`ModelRunner`'s
    # `capture`); None: none
    capture: tuple[int, ...] | None

    def allocate(self, runner: ModelRunner, attention_backend: str) -> None:
        """The drafter's pools over the slots of the target's pool (`runner`), then its
        CUDA graphs where the target has some (`runner.graphs`)."""

    def slot_tensors(self) -> list[torch.Tensor]:
        """Every tensor of the drafter indexed by the target's slots, `[slots, ...]` (once
        allocated): what the host tier copies with the target's KV."""

    def step(self, plan: BatchPlan, fb: ForwardBatch, builder: BatchBuilder,
             runner: ModelRunner) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Step `plan` (built: `fb`) with its drafts: (the target's logits [S + L, V]
        float32, the verify requests' drafts [D] int64 in order, None when it verifies
        nothing)."""


def load_drafter(cfg: ServerConfig, spec: ModelSpec, device: torch.device,
                 dtype: torch.dtype, tp: TPGroup | None = None) -> Drafter | None:
    """The drafter `cfg.speculative_algorithm` asks for, its weights loaded and checked
    against the target `spec` (a DeepSeek-V3-family MTP layer: this rank's shard under
    `tp`); None for an algorithm without one on the device (n-gram lookup without overlap
    drafts on the host)."""
    algo = cfg.speculative_algorithm
    if algo == "draft":
        draft_spec = resolve_model(cfg.speculative_draft_model)
        check_draft_model(spec, draft_spec)
        return DraftModel(draft_spec, device, dtype, cfg.seed)
    if algo == "eagle":
        layout = read_layout(cfg.speculative_draft_model, spec.hf_config())
        return HeadDrafter(EagleHead.load(layout, device, dtype), device, dtype)
    if algo == "mtp":
        head = mtp_head_class(spec).load(spec, device, dtype, cfg.quantization, tp)
        return HeadDrafter(head, device, dtype)
    if worker_drafts(algo, cfg.kv_mode.overlap):  # n-gram lookup, chained with overlap
        return NgramOnDevice(cfg.speculative_ngram_min, cfg.speculative_ngram_max, device)
    return None


def verify_drafts(cfg: ServerConfig) -> int:
    """The most drafts a verify step computes: `speculative_num_draft_tokens`, 0 without
    speculation."""
    return 0 if cfg.speculative_algorithm == "none" else cfg.speculative_num_draft_tokens


def graph_rows(cfg: ServerConfig, max_rows: int) -> int:
    """Rows of the largest decode graph for `max_rows` request rows: a verify step is a
    decode batch of one row a token, up to 1 + `speculative_num_draft_tokens` a request."""
    return max_rows * (1 + verify_drafts(cfg))
