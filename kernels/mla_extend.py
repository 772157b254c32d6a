"""Multi-head latent attention (MLA) extend (prefill with a cached prefix), absorbed form.

Sequence i has `prefix_lens[i]` latent rows in the pool (read through the page table) and
`qo_indptr[i+1] - qo_indptr[i]` new tokens whose queries sit in `q` and whose latent rows sit in
`kv_new`; the new rows are read from `kv_new`, so the caller may store them into the pool before
or after this call. Every head of a new token attends to the whole prefix and causally to the
new tokens, over the same latent rows (MQA): scores over all Dl + Dr columns, V = the first Dl.
"""

import torch
import torch.nn.functional as F

from kernels.paging import expand_pages


def mla_extend_ref(
    q: torch.Tensor,
    kv_new: torch.Tensor,
    kv_pool: torch.Tensor,
    qo_indptr: torch.Tensor,
    prefix_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    page_size: int,
    sm_scale: float,
    *,
    kv_lora_rank: int = 512,
) -> torch.Tensor:
    """Torch reference of `mla_extend`, in float32 (or q's wider dtype); returns `[T, H, Dl]`.

    One SDPA call per sequence with its n new tokens' H heads in the query length (n * H rows)
    over its prefix rows (gathered through the page table) and its new rows. Reads the lengths
    on the host, a sync on a GPU.
    """
    T, H, D = q.shape
    Dl = kv_lora_rank
    acc = torch.promote_types(q.dtype, torch.float32)
    out = torch.zeros(T, H, Dl, dtype=acc, device=q.device)
    q_starts, page_starts = qo_indptr.tolist(), kv_indptr.tolist()
    for b, prefix in enumerate(prefix_lens.tolist()):
        lo, hi = q_starts[b], q_starts[b + 1]
        n = hi - lo
        if n == 0:
            continue
        slots = expand_pages(kv_indices[page_starts[b] :], prefix, page_size)  # [P]
        rows = torch.cat([kv_pool[slots, 0], kv_new[lo:hi, 0]]).to(acc)  # [P+n, Dl + Dr]
        qi = q[lo:hi].to(acc).reshape(1, 1, n * H, D)  # [1, 1, n*H, D], row = token * H + head
        tok = torch.arange(n * H, device=q.device)[:, None] // H  # [n*H, 1]
        cols = torch.arange(prefix + n, device=q.device)[None, :]  # [1, P+n]
        oi = F.scaled_dot_product_attention(
            qi, rows[None, None], rows[None, None, :, :Dl], attn_mask=cols <= tok + prefix,
            scale=sm_scale,
        )  # [1, 1, n*H, Dl]
        out[lo:hi] = oi.reshape(n, H, Dl)
    return out.to(q.dtype)
