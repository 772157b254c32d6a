"""Shared inputs and checks of the attention kernel tests (decode, extend, and their MLA forms)."""

import torch

from kernels.kv.store import quantize_ref
from tests.kernels.cases import ATTN_TOL, randn


def assert_matches_ref(kernel, ref, args: tuple, both: dict, dtype: torch.dtype,
                       **kernel_only) -> torch.Tensor:
    """Assert `kernel(*args, **both, **kernel_only)` is within ATTN_TOL[dtype] of its reference
    `ref(*args, **both)`; returns the kernel's output."""
    out = kernel(*args, **both, **kernel_only)
    want = ref(*args, **both)
    tol = ATTN_TOL[dtype]
    torch.testing.assert_close(out, want, atol=tol, rtol=tol)
    return out


def assert_mla_matches_ref(kernel, ref, args: tuple, dtype: torch.dtype, kv_lora_rank: int,
                           kv_scale=None, **kernel_only) -> torch.Tensor:
    """`assert_matches_ref` for an MLA kernel of latent rank `kv_lora_rank` (an 8-bit pool with
    its `kv_scale`)."""
    both = {"kv_lora_rank": kv_lora_rank, "kv_scale": kv_scale}
    return assert_matches_ref(kernel, ref, args, both, dtype, **kernel_only)


def assert_ref_matches_naive(ref, naive, args: tuple, kv_lora_rank: int, shape: tuple) -> None:
    """An MLA reference `ref(*args)` gives `shape` and matches the float64 loop `naive`."""
    out = ref(*args, kv_lora_rank=kv_lora_rank)
    assert out.shape == shape
    tol = ATTN_TOL[torch.float32]
    torch.testing.assert_close(out.double(), naive(*args, kv_lora_rank), atol=tol, rtol=tol)


def kv_pools(num_slots: int, heads: int, dim: int, dtype: torch.dtype, pool_dtype,
             gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Random K and V pools `[S, heads, dim]` in `dtype`, drawn from `gen` (K first); with a
    `pool_dtype`, quantized per (slot, head), their scales `{"k_scale", "v_scale"}` `[S, heads]`
    (else {})."""
    k_buf = randn(num_slots, heads, dim, dtype=dtype, gen=gen)  # [S, Hkv, D]
    v_buf = randn(num_slots, heads, dim, dtype=dtype, gen=gen)  # [S, Hkv, D]
    if pool_dtype is None:
        return k_buf, v_buf, {}
    k_buf, k_scale = quantize_ref(k_buf, pool_dtype)
    v_buf, v_scale = quantize_ref(v_buf, pool_dtype)
    return k_buf, v_buf, {"k_scale": k_scale, "v_scale": v_scale}


def quantize_latent(args: tuple, at: int, pool_dtype) -> tuple[tuple, torch.Tensor]:
    """MLA kernel inputs with the latent pool `args[at]` quantized to pool_dtype, and its
    kv_scale `[S, 1]`."""
    kv_pool, kv_scale = quantize_ref(args[at], pool_dtype)  # [S, 1, D], [S, 1]
    return (*args[:at], kv_pool, *args[at + 1 :]), kv_scale

