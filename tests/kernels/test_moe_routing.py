"""grouped_topk against the DeepSeek-V2/V3 gate modules of transformers, on random inputs."""

import pytest
import torch
from transformers import DeepseekV2Config, DeepseekV3Config
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

from kernels.moe import grouped_topk

HIDDEN = 32


def by_id(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The picks of each token in ascending expert order (the routers leave it unspecified)."""
    ids, order = ids.long().sort(dim=-1)
    return weights.gather(1, order), ids


def random_router(router: torch.nn.Module, seed: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=gen))
    return router


@pytest.mark.parametrize(
    "E, k, n_group, topk_group, method",
    [
        (64, 6, 1, 1, "greedy"),  # V2-Lite
        (8, 2, 1, 1, "greedy"),
        (64, 6, 8, 3, "group_limited_greedy"),  # V2
        (8, 2, 4, 2, "group_limited_greedy"),
    ],
)
@pytest.mark.parametrize("T", [1, 7, 33])
def test_matches_deepseek_v2_gate(T, E, k, n_group, topk_group, method):
    config = DeepseekV2Config(
        hidden_size=HIDDEN, num_attention_heads=4, n_routed_experts=E, num_experts_per_tok=k,
        n_group=n_group, topk_group=topk_group, topk_method=method, routed_scaling_factor=1.5,
    )  # fmt: skip
    router = random_router(DeepseekV2TopkRouter(config), seed=T)
    hidden = torch.randn(T, HIDDEN, generator=torch.Generator().manual_seed(T + 1))
    logits, want_w, want_ids = router(hidden)
    w, ids = grouped_topk(
        logits, k, n_group=n_group, topk_group=topk_group, scoring_func="softmax",
        routed_scaling_factor=1.5,
    )  # fmt: skip
    assert w.shape == (T, k) and w.dtype == torch.float32 and ids.dtype == torch.int32
    got_w, got_ids = by_id(w, ids)
    want_w, want_ids = by_id(want_w, want_ids)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w)


@pytest.mark.parametrize(
    "E, k, n_group, topk_group", [(64, 6, 8, 4), (8, 2, 4, 2), (8, 2, 1, 1), (64, 8, 2, 1)]
)
@pytest.mark.parametrize("T", [1, 7, 33])
@pytest.mark.parametrize("norm", [True, False])
def test_matches_deepseek_v3_gate(T, E, k, n_group, topk_group, norm):
    config = DeepseekV3Config(
        hidden_size=HIDDEN, num_attention_heads=4, n_routed_experts=E, num_experts_per_tok=k,
        n_group=n_group, topk_group=topk_group, norm_topk_prob=norm, routed_scaling_factor=2.5,
    )  # fmt: skip
    router = random_router(DeepseekV3TopkRouter(config), seed=T)
    bias = torch.randn(E, generator=torch.Generator().manual_seed(E)) * 0.5  # [E]
    router.e_score_correction_bias.copy_(bias)
    hidden = torch.randn(T, HIDDEN, generator=torch.Generator().manual_seed(T + 1))
    logits, want_w, want_ids = router(hidden)
    w, ids = grouped_topk(
        logits, k, n_group=n_group, topk_group=topk_group, scoring_func="sigmoid",
        correction_bias=bias, renormalize=norm, routed_scaling_factor=2.5,
    )  # fmt: skip
    got_w, got_ids = by_id(w, ids)
    want_w, want_ids = by_id(want_w, want_ids)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w)


def test_bias_moves_the_choice_but_not_the_weights():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])  # [1, 4]
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0])
    w, ids = grouped_topk(logits, 1, scoring_func="sigmoid", correction_bias=bias)
    assert ids.tolist() == [[3]]
    torch.testing.assert_close(w, torch.sigmoid(torch.tensor([[-1.0]])))


def test_dropped_groups_are_never_picked():
    # group 0 = experts {0, 1} holds the best expert; group 1 = {2, 3} has the best pair,
    # so with the V3 rule (sum of the top two) group 1 wins and expert 0 is out.
    logits = torch.tensor([[3.0, -3.0, 1.0, 1.0]])
    _, ids = grouped_topk(
        logits, 2, n_group=2, topk_group=1, scoring_func="sigmoid", correction_bias=torch.zeros(4)
    )
    assert sorted(ids[0].tolist()) == [2, 3]
    _, ids = grouped_topk(logits, 2, n_group=2, topk_group=1)  # V2: the group with the best
    assert sorted(ids[0].tolist()) == [0, 1]
