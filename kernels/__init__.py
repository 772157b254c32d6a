"""Triton kernels of the Sluice runtime; each module holds a kernel, its launcher and a torch
reference (`name_ref`). `kernels` imports nothing from `runtime`."""

from kernels.activation import silu_and_mul
from kernels.decode_attention import DecodeConfig, decode_attention, decode_num_splits
from kernels.extend_attention import extend_attention
from kernels.rmsnorm import rmsnorm
from kernels.rope import apply_rope, rope_cos_sin_cache
from kernels.store_kv import store_kv

__all__ = [
    "DecodeConfig",
    "apply_rope",
    "decode_attention",
    "decode_num_splits",
    "extend_attention",
    "rmsnorm",
    "rope_cos_sin_cache",
    "silu_and_mul",
    "store_kv",
]
