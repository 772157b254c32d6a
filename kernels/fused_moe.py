"""Mixture-of-experts FFN over routed tokens: silu(x @ gate^T) * (x @ up^T) @ down^T per
picked expert, weighted and summed over the k picks."""

import torch


def fused_moe_ref(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
) -> torch.Tensor:
    """Torch reference of `fused_moe`, in float32 with one pass per expert that is hit."""
    T, H = x.shape
    E, two_i, _ = w13.shape
    inter = two_i // 2
    out = torch.zeros(T, H, dtype=torch.float32, device=x.device)  # [T, H]
    xf = x.float()
    for e in ids.unique().tolist():
        tok, pick = torch.where(ids == e)  # [n] each
        h = xf[tok] @ w13[e].float().t()  # [n, 2I]
        act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]  # [n, I]
        y = act @ w2[e].float().t()  # [n, H]
        out.index_add_(0, tok, y * weights[tok, pick].float().unsqueeze(-1))
    return out.to(x.dtype)
