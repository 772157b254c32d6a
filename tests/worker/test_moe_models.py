"""Qwen3-MoE and Mixtral against transformers on tiny random checkpoints (fp32, CPU): greedy
tokens, logits under tensor parallelism over two gloo ranks, each rank's expert shards, and
the dummy presets. Logits of every position in chunked batches: `test_hf_parity.py`."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from runtime.model_config import resolve_model
from runtime.worker.loader import build_model, load_model
from runtime.worker.model_runner import ModelRunner
from runtime.worker.models.llama_moe import MixtralForCausalLM, Qwen3MoeForCausalLM
from runtime.worker.quant.fp8_linear import Fp8Linear
from runtime.worker.tp import TPGroup, init_tp
from tests.worker.batching import greedy
from tests.worker.checkpoints import BASE, tiny_checkpoint
from tests.worker.test_hf_parity import SCHEDULE, run_schedule
from tests.worker.tp_ranks import assert_rank_slices, leave, spawn_ranks

FAMILIES = ("qwen3_moe", "mixtral")


def prompts(n: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, BASE["vocab_size"], (length,), generator=gen).tolist()
            for length in (7, 12, 19)[:n]]


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_matches_transformers(family, tmp_path):
    hf = tiny_checkpoint(family, tmp_path)
    runner = ModelRunner(resolve_model(str(tmp_path)), "cpu", torch.float32, kv_slots=256,
                         max_rows=4)
    assert type(runner.model) is {"qwen3_moe": Qwen3MoeForCausalLM,
                                  "mixtral": MixtralForCausalLM}[family]
    seqs = prompts(3, seed=4)
    got, _ = greedy(runner, seqs, 8)
    with torch.no_grad():
        for seq, ids in zip(seqs, got):
            want = hf.generate(torch.tensor([seq]), max_new_tokens=8, do_sample=False)[0]
            assert ids == want[len(seq) :].tolist()


def _tp_rank(rank: int, init: str, folder: str, seqs: list[list[int]], out: str) -> None:
    """One TP rank: load its shard of the checkpoint, run the schedule; rank 0 saves the
    (gathered) logits."""
    torch.set_num_threads(1)
    tp = init_tp(rank, 2, torch.device("cpu"), init)
    runner = ModelRunner(resolve_model(folder), "cpu", torch.float32, kv_slots=128, max_rows=4,
                         tp=tp)
    logits = run_schedule(runner, seqs)
    if rank == 0:
        torch.save(logits, out)
    leave()


def test_tp2_logits_match_transformers(tmp_path):
    """Two gloo ranks, each with half the heads, half of the dense MLP and half of every
    expert's width (router replicated), give transformers' logits."""
    hf = tiny_checkpoint("qwen3_moe", tmp_path / "ckpt")
    gen = torch.Generator().manual_seed(6)
    seqs = [torch.randint(0, BASE["vocab_size"], (sum(s),), generator=gen).tolist()
            for s in SCHEDULE]
    out = tmp_path / "logits.pt"
    spawn_ranks(tmp_path, _tp_rank, str(tmp_path / "ckpt"), seqs, str(out))
    with torch.no_grad():
        for got, seq in zip(torch.load(out), seqs):
            want = hf(torch.tensor([seq])).logits[0]  # [n, V]
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_tp_shards_are_slices_of_the_whole_model():
    """At TP 2 every checkpoint tensor lands on each rank as its half: experts' gate (w1) and
    up (w3) by rows, down (w2) by columns; the router and norms whole on both ranks."""
    spec = resolve_model("dummy:mixtral-tiny")  # 4 experts of width 256, hidden 256
    whole = load_model(spec, "cpu", torch.float32, seed=1)
    ranks = [load_model(spec, "cpu", torch.float32, seed=1, tp=TPGroup(r, 2)) for r in range(2)]
    expected_dims = {"w1": 0, "w3": 0, "w2": 1, "gate": None, "q_proj": 0, "o_proj": 1,
                     "input_layernorm": None}
    moe = "model.layers.1.block_sparse_moe."
    for name in ("experts.3.w1.weight", "experts.3.w3.weight", "experts.3.w2.weight",
                 "gate.weight"):
        assert whole.tp_split_dim(moe + name) == expected_dims[name.split(".")[-2]]
    assert_rank_slices(whole, ranks)
    assert ranks[0].model.layers[0].mlp.experts.w13.shape == (4 * 2 * 128, 256)
    assert ranks[0].model.layers[0].mlp.experts.w2.shape == (4 * 256, 128)


@pytest.mark.parametrize("preset", ["qwen3-moe-tiny", "mixtral-tiny"])
def test_tiny_presets_run(preset):
    runner = ModelRunner(resolve_model(f"dummy:{preset}"), "cpu", torch.float32, kv_slots=64,
                         max_rows=2)
    ids, logits = greedy(runner, prompts(2, seed=1), 4)
    assert torch.isfinite(logits).all() and logits.shape == (2, 4, 1024)


def test_full_size_presets():
    """The real shapes, built on the meta device: Qwen3-30B-A3B (3.3B active of 30.5B) and
    all 32 layers of Mixtral-8x7B (46.7B, 93 GB in bf16)."""
    sizes, archs = {}, {}
    for preset in ("qwen3-30b-a3b", "mixtral-8x7b"):
        with torch.device("meta"):
            model = build_model(resolve_model(f"dummy:{preset}").hf_config(), None, "none")
        sizes[preset] = round(sum(p.numel() for p in model.parameters()) / 1e8)
        archs[preset] = a = model.arch
        w13, w2 = model.model.layers[0].mlp.experts.stacked()
        assert w13.shape == (a.num_experts, 2 * a.moe_intermediate_size, a.hidden_size)
        assert w2.shape == (a.num_experts, a.hidden_size, a.moe_intermediate_size)
    assert sizes == {"qwen3-30b-a3b": 305, "mixtral-8x7b": 467}
    qwen, mixtral = archs["qwen3-30b-a3b"], archs["mixtral-8x7b"]
    assert (qwen.num_experts, qwen.num_experts_per_tok, qwen.head_dim, qwen.qk_norm,
            qwen.norm_topk_prob, qwen.rope["rope_theta"]) == (128, 8, 128, True, True, 1e6)
    assert (mixtral.num_experts, mixtral.num_experts_per_tok, mixtral.moe_intermediate_size,
            mixtral.norm_topk_prob, mixtral.sliding_window) == (8, 2, 14336, True, None)


@pytest.mark.parametrize("preset", ["qwen3-moe-tiny", "mixtral-tiny"])
def test_fp8_weights_quantize_attention_and_keep_the_experts(preset):
    """`--quantization fp8` on a 16-bit MoE checkpoint (dummy weights): per-channel fp8
    attention projections; the router and the stacked experts stay in the model's dtype.
    Fed the same tokens, logits stay close to the 16-bit model's (L2, each position; measured
    median 6% and 5%, max 12% and 15%: a position where a token's top-k routing flips)."""
    spec = resolve_model(f"dummy:{preset}")
    exact = ModelRunner(spec, "cpu", torch.float32, kv_slots=64, max_rows=2)
    fp8 = ModelRunner(spec, "cpu", torch.float32, kv_slots=64, max_rows=2, quantization="fp8")
    layer = fp8.model.model.layers[0]
    assert fp8.quantization == "fp8" and isinstance(layer.self_attn.qkv_proj, Fp8Linear)
    assert layer.mlp.experts.w13.dtype == layer.mlp.gate.weight.dtype == torch.float32
    tokens, want = greedy(exact, prompts(2, seed=2), 4)
    _, got = greedy(fp8, prompts(2, seed=2), 4, forced=tokens)
    err = (got - want).norm(dim=-1) / want.norm(dim=-1)
    assert err.median() < 0.08 and err.max() < 0.2, err


def test_unknown_types_are_refused():
    with pytest.raises(NotImplementedError, match=r"model_type 'gpt2'; supported: .*qwen3_moe"):
        build_model(AutoConfig.for_model("gpt2"), None, "none")
