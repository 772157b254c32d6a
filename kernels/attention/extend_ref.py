"""Torch reference of extend attention (`kernels.attention.extend`): one SDPA call per
sequence, in float32, over its cached prefix gathered through the page table and its new tokens."""

import torch
import torch.nn.functional as F

from kernels.kv.paging import extend_runs
from kernels.kv.store import dequantize_ref, quantize_ref


def extend_attention_ref(
    q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_buf: torch.Tensor,
    v_buf: torch.Tensor, qo_indptr: torch.Tensor, prefix_lens: torch.Tensor,
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, page_size: int, sm_scale: float, *,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
    fp8_scores: bool = False,
) -> torch.Tensor:  # fmt: skip
    """Torch reference of `extend_attention`, in float32 (or q's wider dtype): one SDPA call
    per sequence over its cached prefix (gathered through the page table) and its new
    tokens (fp8_scores: q's rows quantized to e4m3 against the prefix, as the kernel does).
    Reads the lengths on the host, a sync on a GPU."""
    T, Hq, D = q.shape
    group = Hq // k_new.shape[1]
    acc = torch.promote_types(q.dtype, torch.float32)
    out = torch.zeros(T, Hq, D, dtype=acc, device=q.device)
    for lo, hi, slots in extend_runs(qo_indptr, prefix_lens, kv_indptr, kv_indices, page_size):
        n, prefix = hi - lo, len(slots)  # slots [P] of the cached prefix
        k_pre = dequantize_ref(k_buf[slots], None if k_scale is None else k_scale[slots]).to(acc)
        v_pre = dequantize_ref(v_buf[slots], None if v_scale is None else v_scale[slots]).to(acc)
        # K/V repeated per query head (not enable_gqa) so fused SDPA kernels stay eligible
        k = torch.cat([k_pre, k_new[lo:hi].to(acc)]).repeat_interleave(group, 1)  # [P+n, Hq, D]
        v = torch.cat([v_pre, v_new[lo:hi].to(acc)]).repeat_interleave(group, 1)  # [P+n, Hq, D]
        qi = q[lo:hi].to(acc).transpose(0, 1)[None]  # [1, Hq, n, D]
        ki, vi = k.transpose(0, 1)[None], v.transpose(0, 1)[None]  # [1, Hq, P+n, D] x2
        if fp8_scores and prefix:  # a mask cannot give the prefix its own q: scores by hand
            q8 = dequantize_ref(*quantize_ref(qi, torch.float8_e4m3fn)).to(acc)  # [1, Hq, n, D]
            s = torch.cat([q8 @ ki[..., :prefix, :].mT, qi @ ki[..., prefix:, :].mT], -1)
            causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()  # [n, n]
            s[..., prefix:] = s[..., prefix:].masked_fill(~causal, float("-inf"))
            oi = torch.softmax(s * sm_scale, -1) @ vi  # [1, Hq, n, D]
        elif prefix == 0:
            oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=sm_scale)
        else:  # new token j sees the prefix and new tokens up to itself
            rows = torch.arange(n, device=q.device)[:, None] + prefix  # [n, 1]
            cols = torch.arange(prefix + n, device=q.device)[None, :]  # [1, P+n]
            oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=cols <= rows, scale=sm_scale)
        out[lo:hi] = oi[0].transpose(0, 1)  # [n, Hq, D]
    return out.to(q.dtype)
