"""Multi-head latent attention (MLA) decode over a paged latent pool, in the absorbed form.

Each token stores one latent row per layer, `[c_kv (Dl) | rotated rope key (Dr)]`. The query
arrives absorbed: its nope part already multiplied by W_UK (Dl wide), then its rope part (Dr).
Attention is then MQA over the latent rows: every head scores `q . row` over all Dl + Dr
columns and sums the first Dl columns (V = c_kv); the model applies W_UV afterwards.
"""

import torch
import torch.nn.functional as F


def mla_decode_ref(
    q: torch.Tensor,
    kv_pool: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    sm_scale: float,
    *,
    kv_lora_rank: int = 512,
    max_seq_len: int | None = None,
) -> torch.Tensor:
    """Torch reference of `mla_decode`, in float32 (or q's wider dtype); returns `[B, H, Dl]`.

    q `[B, H, Dl + Dr]`, kv_pool `[num_slots, 1, Dl + Dr]`, the CSR page table and seq_lens as
    `decode_attention`; Dl = kv_lora_rank. One padded SDPA call with the H heads in the query
    length (padding reads slot 0 and is masked; an empty sequence gives zeros). `max_seq_len`
    (a host int) sizes the padding; None reads seq_lens.max(), a host sync.
    """
    B, H, D = q.shape
    Dl = kv_lora_rank
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max()) if B else 0
    if max_seq_len == 0:
        return q.new_zeros(B, H, Dl)
    cols = torch.arange(max_seq_len, device=q.device)  # [L]
    valid = cols[None, :] < seq_lens[:, None]  # [B, L]
    entries = kv_indptr[:-1, None].long() + cols[None, :] // page_size  # [B, L] into kv_indices
    entries = torch.where(valid, entries, 0)  # padding reads entry 0 (in range)
    slots = kv_indices[entries].long() * page_size + cols[None, :] % page_size  # [B, L]
    slots = torch.where(valid, slots, 0)
    acc = torch.promote_types(q.dtype, torch.float32)
    rows = kv_pool[slots, 0].to(acc)[:, None]  # [B, 1, L, Dl + Dr]
    out = F.scaled_dot_product_attention(
        q.to(acc)[:, None], rows, rows[..., :Dl], attn_mask=valid[:, None, None, :], scale=sm_scale
    )  # [B, 1, H, Dl]
    out = torch.where(seq_lens[:, None, None, None] > 0, out, 0.0)  # all-masked rows are NaN
    return out[:, 0].to(q.dtype)
