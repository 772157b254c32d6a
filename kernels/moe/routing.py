"""Top-k expert routing of a mixture-of-experts layer, with expert groups (DeepSeek-V2/V3).

Routing is a handful of small ops on `[T, E]`, so it stays in torch; every op is
shape-static and free of host syncs, so it can be captured in a CUDA graph.
"""

import torch

SCORING_FUNCS = ("softmax", "sigmoid", "sqrtsoftplus")


def expert_scores(logits: torch.Tensor, scoring_func: str) -> torch.Tensor:
    """Router logits `[T, E]` scored: softmax (DeepSeek-V2), sigmoid (V3) or
    sqrt(softplus) (V4), in fp32."""
    logits = logits.float()
    if scoring_func == "softmax":
        return logits.softmax(dim=-1)
    if scoring_func == "sigmoid":
        return logits.sigmoid()
    return torch.nn.functional.softplus(logits).sqrt()


def grouped_topk(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    n_group: int = 1,
    topk_group: int = 1,
    scoring_func: str = "softmax",
    correction_bias: torch.Tensor | None = None,
    renormalize: bool = False,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick `top_k` experts per token. Returns (weights `[T, k]` fp32, ids `[T, k]` int32).

    router_logits `[T, E]`: the gate's output, scored by `scoring_func` (`expert_scores`).
    With `n_group > 1` the E experts form `n_group` equal groups; only experts of the
    `topk_group` best groups may be picked. A group's score is its best expert's score
    without `correction_bias` (V2 "group_limited_greedy"; with `n_group == 1` this is plain
    greedy top-k), and the sum of its best two biased scores
    with it (V3 "noaux_tc"). `correction_bias` `[E]` steers the selection only: the weights
    are the unbiased scores of the picked experts, renormalized to sum to 1 if
    `renormalize`, then multiplied by `routed_scaling_factor`. The order of the k picks
    is unspecified.
    """
    assert router_logits.dim() == 2, f"router_logits must be [T, E], got {router_logits.shape}"
    T, E = router_logits.shape
    assert scoring_func in SCORING_FUNCS, f"scoring_func must be one of {SCORING_FUNCS}"
    assert E % n_group == 0, f"{E} experts do not split into {n_group} groups"
    assert 1 <= topk_group <= n_group, f"topk_group {topk_group} not in [1, {n_group}]"
    assert 1 <= top_k <= topk_group * (E // n_group), "top_k exceeds the experts allowed"
    scores = expert_scores(router_logits, scoring_func)  # [T, E]
    choice = scores if correction_bias is None else scores + correction_bias.float()  # [T, E]
    if n_group > 1:
        grouped = choice.view(T, n_group, E // n_group)  # [T, G, E/G]
        if correction_bias is None:
            group_scores = grouped.amax(dim=-1)  # [T, G]
        else:
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [T, G]
        group_idx = group_scores.topk(topk_group, dim=-1, sorted=False).indices  # [T, g]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0)  # [T, G]
        expert_mask = group_mask.unsqueeze(-1).expand(T, n_group, E // n_group).reshape(T, E)
        choice = choice.masked_fill(expert_mask == 0, float("-inf"))  # [T, E]
    ids = choice.topk(top_k, dim=-1, sorted=False).indices  # [T, k] int64
    weights = scores.gather(1, ids)  # [T, k]
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * routed_scaling_factor, ids.to(torch.int32)
