"""fused_moe (Triton) against fused_moe_ref, and fused_moe_ref against transformers' experts."""

import pytest
import torch

from kernels.moe import MoeConfig, fused_moe, fused_moe_ref, grouped_topk, moe_align_block_size
from kernels.moe.align import max_padded_rows, moe_align_block_size_ref
from tests.kernels.cases import ATTN_TOL, DEVICE, DTYPES, randn


def test_reference_matches_deepseek_experts():
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Experts

    T, H, inter, E, k = 7, 32, 24, 8, 2
    config = DeepseekV2Config(
        hidden_size=H, num_attention_heads=4, moe_intermediate_size=inter, n_routed_experts=E
    )
    experts = DeepseekV2Experts(config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        experts.gate_up_proj.copy_(torch.randn(E, 2 * inter, H, generator=gen) / H**0.5)
        experts.down_proj.copy_(torch.randn(E, H, inter, generator=gen) / inter**0.5)
    x = torch.randn(T, H, generator=gen)  # [T, H]
    weights, ids = grouped_topk(torch.randn(T, E, generator=gen), k)  # [T, k] each
    want = experts(x, ids.long(), weights)
    got = fused_moe_ref(x, experts.gate_up_proj.data, experts.down_proj.data, weights, ids)
    torch.testing.assert_close(got, want)


def moe_inputs(T, H, inter, E, k, dtype, seed):
    """Random activations, experts scaled to keep outputs O(1), and a softmax routing."""
    gen = torch.Generator().manual_seed(seed)
    x = randn(T, H, dtype=dtype, gen=gen)  # [T, H]
    w13 = randn(E, 2 * inter, H, dtype=dtype, gen=gen) / H**0.5  # [E, 2I, H]
    w2 = randn(E, H, inter, dtype=dtype, gen=gen) / inter**0.5  # [E, H, I]
    weights, ids = grouped_topk(randn(T, E, gen=gen), k, renormalize=True)  # [T, k] each
    return x, w13, w2, weights, ids


SMALL_TILES = MoeConfig(16, 32, 16)  # partial N tiles and several K steps on tiny H, I


@pytest.mark.parametrize("T", [1, 7, 33])
@pytest.mark.parametrize("E, k", [(8, 2), (64, 6)])
def test_matches_reference_odd_shapes(T, E, k):
    x, w13, w2, weights, ids = moe_inputs(T, 40, 24, E, k, torch.float32, seed=T * E + k)
    got = fused_moe(x, w13, w2, weights, ids, config=SMALL_TILES)
    want = fused_moe_ref(x, w13, w2, weights, ids)
    tol = ATTN_TOL[torch.float32]
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [1, 33, 300])
def test_matches_reference_default_tiles(dtype, T):
    # T = 300 with E = 8, k = 2 puts 75 rows on each expert: the widest tiles.
    x, w13, w2, weights, ids = moe_inputs(T, 72, 40, 8, 2, dtype, seed=T)
    got = fused_moe(x, w13, w2, weights, ids)
    want = fused_moe_ref(x, w13, w2, weights, ids)
    assert got.dtype == dtype and got.shape == x.shape
    tol = ATTN_TOL[dtype]
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def test_width_shards_sum_to_the_whole():
    """Tensor parallelism: each rank holds a slice of I; the partial outputs add up."""
    x, w13, w2, weights, ids = moe_inputs(7, 40, 24, 8, 2, torch.float32, seed=1)
    gate, up = w13.chunk(2, dim=1)  # [E, I, H] each
    parts = []
    for s in (slice(0, 16), slice(16, 24)):
        w13_s = torch.cat([gate[:, s], up[:, s]], dim=1).contiguous()  # [E, 2I_r, H]
        w2_s = w2[:, :, s].contiguous()  # [E, H, I_r]
        parts.append(fused_moe(x, w13_s, w2_s, weights, ids, config=SMALL_TILES))
    tol = ATTN_TOL[torch.float32]
    want = fused_moe_ref(x, w13, w2, weights, ids)
    torch.testing.assert_close(parts[0] + parts[1], want, atol=tol, rtol=tol)


@pytest.mark.parametrize(
    "T, E, k, block_m",
    [(1, 64, 6, 16), (33, 8, 2, 16), (7, 64, 6, 32), (40, 60, 6, 16), (9, 256, 8, 64),
     (300, 8, 2, 64)],
)  # fmt: skip
def test_alignment_groups_every_pick_once(T, E, k, block_m):
    gen = torch.Generator().manual_seed(T)
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)])  # [T, k]
    ids = ids.to(torch.int32).to(DEVICE)
    got = moe_align_block_size(ids, E, block_m)
    want = moe_align_block_size_ref(ids, E, block_m)
    assert torch.equal(got.num_padded, want.num_padded)
    assert torch.equal(got.sorted_ids, want.sorted_ids)
    used = int(want.num_padded) // block_m
    assert torch.equal(got.block_expert[:used], want.block_expert[:used])
    # what the GEMM relies on: every pick once, each block one expert's, padding = T * k
    n, rows = T * k, want.sorted_ids[: int(want.num_padded)].cpu()
    assert sorted(rows[rows < n].tolist()) == list(range(n)) and (rows <= n).all()
    assert got.sorted_ids.numel() == max_padded_rows(n, E, block_m)
    experts = ids.flatten().cpu()[rows.clamp(max=n - 1).long()].view(used, block_m)
    block_expert = want.block_expert[:used, None].cpu()
    assert ((experts == block_expert) | (rows.view(used, block_m) == n)).all()


@pytest.mark.gpu
def test_deepseek_v2_lite_shape_bf16():
    _, w13, w2, _, _ = moe_inputs(1, 2048, 1408, 64, 6, torch.bfloat16, seed=0)  # the experts
    for T in (1, 64, 257):
        x, _, _, weights, ids = moe_inputs(T, 2048, 1, 64, 6, torch.bfloat16, seed=T)
        got = fused_moe(x, w13, w2, weights, ids)
        want = fused_moe_ref(x, w13, w2, weights, ids)
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_cuda_graph_replays_new_routing():
    """Routing and experts captured once replay correctly on other tokens and picks."""
    T, H, inter, E, k = 16, 256, 192, 64, 6
    x, w13, w2, _, _ = moe_inputs(T, H, inter, E, k, torch.bfloat16, seed=0)
    logits = torch.randn(T, E, device=DEVICE)  # [T, E], refilled before each replay

    def step():
        weights, ids = grouped_topk(logits, k, n_group=8, topk_group=3, renormalize=True)
        return fused_moe(x, w13, w2, weights, ids), weights, ids

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, weights, ids = step()
    for seed in (1, 2):
        gen = torch.Generator().manual_seed(seed)
        x.copy_(randn(T, H, dtype=torch.bfloat16, gen=gen))
        logits.copy_(randn(T, E, gen=gen))
        graph.replay()
        want_w, want_ids = grouped_topk(logits, k, n_group=8, topk_group=3, renormalize=True)
        assert torch.equal(ids.sort(dim=-1).values, want_ids.sort(dim=-1).values)
        want = fused_moe_ref(x, w13, w2, want_w, want_ids)
        torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("T", [1, 33])
def test_clamped_swiglu_matches_reference(T):
    """A limit below the activations' range: the clamp decides the output."""
    x, w13, w2, weights, ids = moe_inputs(T, 40, 24, 8, 2, torch.float32, seed=T + 5)
    x = x * 4  # gate / up values well past the limit
    limit = 0.5
    got = fused_moe(x, w13, w2, weights, ids, swiglu_limit=limit, config=SMALL_TILES)
    want = fused_moe_ref(x, w13, w2, weights, ids, swiglu_limit=limit)
    tol = ATTN_TOL[torch.float32]
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    assert not torch.allclose(want, fused_moe_ref(x, w13, w2, weights, ids), atol=1e-2)
    # the reference's clamp is the clamped SwiGLU, expert by expert
    inter = w13.shape[1] // 2
    loop = torch.zeros_like(x)
    for t in range(T):
        for w, e in zip(weights[t], ids[t].tolist()):
            gate, up = (w13[e] @ x[t]).split(inter)
            act = torch.nn.functional.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)
            loop[t] += w * (w2[e] @ act)
    torch.testing.assert_close(want, loop, atol=1e-5, rtol=1e-5)
