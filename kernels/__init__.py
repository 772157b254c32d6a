"""Triton kernels of the Sluice runtime; each module holds a kernel, its launcher and a torch
reference (`name_ref`, or in `name_ref.py` beside it). `kernels` imports nothing from
`runtime`."""

from kernels.attention.decode import DecodeConfig, decode_attention, decode_num_splits
from kernels.attention.extend import extend_attention
from kernels.attention.mla_decode import MlaDecodeConfig, mla_decode, mla_decode_num_splits
from kernels.attention.mla_extend import mla_extend
from kernels.kv.store import store_kv
from kernels.norm_rope.activation import silu_and_mul
from kernels.norm_rope.rmsnorm import rmsnorm
from kernels.norm_rope.rope import apply_rope, rope_cos_sin_cache

__all__ = [
    "DecodeConfig",
    "MlaDecodeConfig",
    "apply_rope",
    "decode_attention",
    "decode_num_splits",
    "extend_attention",
    "mla_decode",
    "mla_decode_num_splits",
    "mla_extend",
    "rmsnorm",
    "rope_cos_sin_cache",
    "silu_and_mul",
    "store_kv",
]
