"""Launch configs of extend attention (`ExtendConfig`) and the defaults measured on the H200
(`bench.kernels.extend_sweep`, `bench/results/kernels/2026-12-02-extend-quant-h200.md`,
`bench/results/kernels/2026-12-04-extend-mask-free-h200.md`)."""

import functools
import os
from dataclasses import dataclass

import torch

from kernels.attention.decode_config import FP8_CAPABILITY, LaunchConfig, kernel_capability

# shared memory of each default below (head dim 128, as compiled for sm_90)
QUANT_SMEM = 161 * 1024  # a quantized prefix: 128 x 128 tiles in 2 stages
STAGES3_SMEM = 112 * 1024  # 16-bit: 64 x 64 tiles in 3 stages
SHORT_RUN = 64  # query rows this few leave a 128-row tile half empty


@dataclass(frozen=True)
class ExtendConfig(LaunchConfig):
    """Launch knobs of the extend kernel: `block_m` query rows a program (new tokens of one
    head, or under GQA tokens x one kv head's query heads), over key tiles of `block_n`, with
    `num_stages` of Triton's load pipeline."""

    TILES = ("block_m", "block_n")
    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2


def rows_per_token(q_heads: int, kv_heads: int, pack_heads: bool | None = None) -> int:
    """Query heads an extend program takes per new token: one kv head's group when packed
    (pack_heads None: under GQA), else 1."""
    if pack_heads is None:
        pack_heads = q_heads != kv_heads
    return q_heads // kv_heads if pack_heads else 1


def default_extend_config(
    head_dim: int, quant: bool, device: torch.device, rows: int | None = None
) -> ExtendConfig:
    """The measured default for a batch whose longest run of new tokens fills `rows` query
    rows (its tokens x `rows_per_token`; None: unknown, taken as long)."""
    return _default_config(head_dim, quant, device, rows is not None and rows <= SHORT_RUN)


@functools.cache  # once per (shape, pool, device): every prefill layer asks
def _default_config(head_dim: int, quant: bool, device: torch.device, short: bool) -> ExtendConfig:
    """Head dim <= 128: a quantized prefix takes 128 x 128 tiles over 8 warps (its widening,
    paid once a key tile, then serves twice the rows) unless the rows are `short` (at most
    SHORT_RUN), a 16-bit one (and a short one) 64 x 64 tiles in 3 stages, each where the
    GPU's shared memory holds them (else 64 x 64 in 2 stages); 32 x 32 tiles above head dim
    128. (A 16-bit 128 x 128 tile in 3 stages is
    6-12% faster over a long prefix on the H200 but slower on causal prefill without one:
    `bench/results/kernels/2026-12-02-extend-quant-h200.md`.)"""
    if head_dim > 128:
        return ExtendConfig(block_m=32, block_n=32)
    smem = (torch.cuda.get_device_properties(device).shared_memory_per_block_optin
            if device.type == "cuda" else 0)  # fmt: skip
    if quant and not short and smem >= QUANT_SMEM:
        return ExtendConfig(block_m=128, block_n=128, num_warps=8)
    if (short or not quant) and smem >= STAGES3_SMEM:
        return ExtendConfig(num_stages=3)
    return ExtendConfig()


@functools.cache
def fp8_scores_default(device: torch.device) -> bool:
    """Whether an fp8 prefix without scales is scored on fp8 tensor cores by default: on GPUs
    that have them (sm_89+), never under the Triton interpreter; `SLUICE_FP8_SCORES=0` turns
    it off (q and the prefix in fp16). Measured on the H200:
    `bench/results/kernels/2026-12-02-extend-fp8-scores-h200.md`."""
    return (os.environ.get("SLUICE_FP8_SCORES") != "0"
            and kernel_capability(device) >= FP8_CAPABILITY)
