"""DeepSeek-V2/V3 (MLA + MoE) against transformers on tiny random checkpoints, fp32 on the
CPU: logits of every position and greedy tokens, with the latent pool laid out as the
token (page size 1), paged and contiguous KV modes lay it out, and a prefix read back
from the pool (a second chunk, as a prefix-cache hit or chunked prefill reads it)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, DeepseekV2Config, DeepseekV3Config

from kernels.kv.paging import expand_pages
from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.worker.model_check import UnsupportedModel, prepare_model
from runtime.worker.model_runner import ModelRunner
from runtime.worker.models.deepseek_arch import DeepseekArch
from runtime.worker.models.deepseek_rope import deepseek_cos_sin_cache
from tests.worker.batching import Chunk, make_batch

BASE = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32,
    qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, n_routed_experts=8,
    num_experts_per_tok=2, first_k_dense_replace=1, max_position_embeddings=512,
)  # fmt: skip
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64,
            mscale=0.707, mscale_all_dim=0.707, beta_fast=32, beta_slow=1)
FAMILIES = {
    # V2-Lite's layout: queries straight from the hidden state, greedy softmax routing
    "v2": (DeepseekV2Config, dict(q_lora_rank=None, n_shared_experts=2, topk_method="greedy")),
    # V3's: a query LoRA, grouped sigmoid routing with a selection bias, YaRN
    "v3": (DeepseekV3Config, dict(q_lora_rank=24, n_shared_experts=1, n_group=4, topk_group=2,
                                  norm_topk_prob=True, routed_scaling_factor=2.5,
                                  rope_parameters=YARN)),
}
# (name, page size of the batch's page table, whether it is rewritten to a per-slot table)
LAYOUTS = [("token", 1, False), ("paged", 4, False), ("contiguous", 64, True)]
SCHEDULE = [[9, 6, 1, 1, 1], [5, 2, 1, 1, 1]]  # tokens per step of each sequence


def random_deepseek(family: str, **changes) -> torch.nn.Module:
    """A random tiny DeepSeek of `family` (fields `changes` of BASE changed), fp32, eval;
    norms near 1, everything else small."""
    config_cls, extra = FAMILIES[family]
    model = AutoModelForCausalLM.from_config(config_cls(**{**BASE, **changes}, **extra),
                                             dtype=torch.float32)
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if "inv_freq" in name:
                continue
            noise = torch.randn(t.shape)
            t.copy_(1 + 0.1 * noise if "norm" in name else 0.1 * noise)
    return model.eval()


def tiny_deepseek(family: str, folder) -> torch.nn.Module:
    """Save a random tiny DeepSeek checkpoint to `folder`; return it (fp32, eval)."""
    torch.manual_seed(0)
    model = random_deepseek(family)
    model.save_pretrained(folder)
    return model


def slot_table(fb):
    """`fb` with its page table rewritten to one entry a slot (page size 1): with one page
    a sequence, each sequence's slots form one contiguous run, as the contiguous mode
    lays them out."""
    lens = fb.seq_lens_cpu
    slots = [expand_pages(fb.kv_indices[int(fb.kv_indptr[i]) :], n, fb.page_size)
             for i, n in enumerate(lens)]
    indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return replace(fb, kv_indices=torch.cat(slots).long(), kv_indptr=indptr, page_size=1)


def run(runner: ModelRunner, seqs: list[list[int]], page_size: int, per_slot: bool,
        schedule: list[list[int]] = SCHEDULE):
    """Feed `seqs` in the chunks of `schedule` (tokens per step of each sequence); logits
    of every position per sequence."""
    lens, out = [0] * len(seqs), [[] for _ in seqs]
    runner.model.bind_rows(list(range(len(seqs))))  # new requests on the rows
    for step in range(len(schedule[0])):
        chunks = [Chunk(s, seqs[s][lens[s] : lens[s] + schedule[s][step]]) for s in range(2)]
        fb = make_batch(chunks, list(lens), len(seqs), sample_all=True, page_size=page_size)
        logits = runner.forward(slot_table(fb) if per_slot else fb)  # [T, V]
        for c, part in zip(chunks, logits.split([len(c.ids) for c in chunks])):
            out[c.seq].append(part)
            lens[c.seq] += len(c.ids)
    return [torch.cat(parts) for parts in out]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_matches_transformers(family, tmp_path):
    hf = tiny_deepseek(family, tmp_path)
    runner = ModelRunner(resolve_model(str(tmp_path)), "cpu", torch.float32, kv_slots=512,
                         max_rows=4)
    a = runner.model.arch
    assert runner.kv_bytes_per_token == a.num_layers * (a.kv_lora_rank + a.qk_rope_head_dim) * 4
    assert runner.kv_pool.k[0].shape == (513, 1, 40) and runner.kv_pool.v == []
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 256, (sum(s),), generator=gen).tolist() for s in SCHEDULE]
    with torch.no_grad():
        want = [hf(torch.tensor([s])).logits[0] for s in seqs]  # [n, V] each
    for name, page_size, per_slot in LAYOUTS:
        got = run(runner, seqs, page_size, per_slot)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4, msg=name)
            assert g.argmax(-1).tolist() == w.argmax(-1).tolist(), name


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter test")
def test_triton_mla_backend_matches_transformers(tmp_path):
    """The Triton MLA kernels (interpreted) wired as the model runs them, paged layout."""
    hf = tiny_deepseek("v3", tmp_path)
    runner = ModelRunner(resolve_model(str(tmp_path)), "cpu", torch.float32, kv_slots=512,
                         max_rows=4, attention_backend="triton")
    gen = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, 256, (sum(s),), generator=gen).tolist() for s in SCHEDULE]
    for got, seq in zip(run(runner, seqs, 4, False), seqs):
        with torch.no_grad():
            want = hf(torch.tensor([seq])).logits[0]  # [n, V]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_greedy_generation_matches_transformers(tmp_path):
    hf = tiny_deepseek("v3", tmp_path)
    runner = ModelRunner(resolve_model(str(tmp_path)), "cpu", torch.float32, kv_slots=256,
                         max_rows=2)
    prompt = torch.randint(0, 256, (11,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0, 11:]
    ids, n = list(prompt), 0
    for _ in range(6):
        fb = make_batch([Chunk(0, ids[n:])], [n], 1)
        n = len(ids)
        ids.append(int(runner.forward(fb)[0].argmax()))
    assert ids[11:] == want.tolist()


def test_yarn_table_matches_transformers():
    config = DeepseekV3Config(**BASE, q_lora_rank=24, rope_parameters=YARN)
    rope = AutoModelForCausalLM.from_config(config).model.rotary_emb
    pos = torch.arange(100)[None]
    cos, sin = rope(torch.zeros(1, dtype=torch.float32), pos)  # [1, 100, 8] each
    table = deepseek_cos_sin_cache(8, 100, DeepseekArch.from_hf(config).rope, "cpu")
    torch.testing.assert_close(table, torch.cat([cos[0, :, :4], sin[0, :, :4]], -1))


def test_dummy_presets():
    tiny = ModelRunner(resolve_model("dummy:deepseek-tiny"), "cpu", torch.float32, kv_slots=64,
                       max_rows=2)
    fb = make_batch([Chunk(0, [5, 6, 7])], [0], 1)
    assert torch.isfinite(tiny.forward(fb)).all()
    lite = DeepseekArch.from_hf(resolve_model("dummy:deepseek-v2-lite").hf_config())
    assert (lite.num_layers, lite.latent_dim, lite.n_routed_experts, lite.kind) == (
        27, 576, 64, "deepseek_v2")
    # 27 layers x 576 latent values x 2 bytes in bf16: 1,152 bytes a token and layer
    assert 27 * lite.latent_dim * 2 == 27 * 1152


def test_tp_shards_are_slices_of_the_whole_model():
    """At TP 2 each rank holds half the heads and half of every FFN's width (each expert's
    gate, up and down included); latent projections and the router are replicated."""
    from runtime.worker.loader import load_model
    from runtime.worker.tp import TPGroup

    spec = resolve_model("dummy:deepseek-tiny")  # 4 heads (32 + 32 qk, 32 v), experts 128 wide
    whole = dict(load_model(spec, "cpu", torch.float32, seed=1).named_parameters())
    ranks = [dict(load_model(spec, "cpu", torch.float32, seed=1, tp=TPGroup(r, 2))
                  .named_parameters()) for r in range(2)]
    attn, moe = "model.layers.1.self_attn.", "model.layers.1.mlp."
    w13 = whole[moe + "experts.w13"].view(8, 2, 2, 64, 256)  # [E, gate|up, rank, I/2, H]
    w2 = whole[moe + "experts.w2"].view(8, 256, 2, 64)  # [E, H, rank, I/2]
    for r, shard in enumerate(ranks):
        assert torch.equal(shard[attn + "q_proj.weight"], whole[attn + "q_proj.weight"].chunk(2)[r])
        assert torch.equal(shard[attn + "kv_b_proj.weight"],
                           whole[attn + "kv_b_proj.weight"].chunk(2)[r])
        assert torch.equal(shard[attn + "o_proj.weight"],
                           whole[attn + "o_proj.weight"].chunk(2, dim=1)[r])
        for name in (attn + "kv_a_proj_with_mqa.weight", moe + "gate.weight"):
            assert torch.equal(shard[name], whole[name])
        assert torch.equal(shard[moe + "experts.w13"], w13[:, :, r].reshape(-1, 256))
        assert torch.equal(shard[moe + "experts.w2"], w2[:, :, r].reshape(-1, 64))


@pytest.mark.parametrize("kv_dtype", ["fp8", "int8"])
def test_quantized_latent_pool_tracks_transformers(kv_dtype, tmp_path):
    """One float32 scale a latent row: 576 + 4 bytes a token and layer at DeepSeek's shape;
    here the logits stay within 10% of their range of the unquantized model's (e4m3 keeps 3
    mantissa bits), and the greedy picks agree wherever the top two are further apart."""
    hf = tiny_deepseek("v2", tmp_path)
    runner = ModelRunner(resolve_model(str(tmp_path)), "cpu", torch.float32, kv_slots=512,
                         max_rows=4, kv_dtype=kv_dtype)
    assert runner.kv_bytes_per_token == 3 * (40 + 4) and runner.kv_pool.k_scale[0].shape == (
        513, 1)
    gen = torch.Generator().manual_seed(6)
    seqs = [torch.randint(0, 256, (sum(s),), generator=gen).tolist() for s in SCHEDULE]
    for got, seq in zip(run(runner, seqs, 4, False), seqs):
        with torch.no_grad():
            want = hf(torch.tensor([seq])).logits[0]  # [n, V]
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, atol=0.1 * scale, rtol=0)
        top2 = want.topk(2, dim=-1).values  # [n, 2]
        clear = (top2[:, 0] - top2[:, 1]) > 0.2 * scale
        assert (got.argmax(-1) == want.argmax(-1))[clear].all()


def test_a_latent_pool_refuses_unscaled_fp8_at_start_up(tmp_path):
    """`--kv-dtype fp8_e4m3` (one scale for a whole K/V tensor) has no latent form: refused
    by `prepare_model`, before any process loads the weights, one line naming the field."""
    tiny_deepseek("v3", tmp_path)
    cfg = ServerConfig(model=str(tmp_path), device="cpu", kv_dtype="fp8_e4m3")
    with pytest.raises(UnsupportedModel, match="config.json: kv_dtype 'fp8_e4m3' is for K/V "
                                               "pools; a latent pool takes 'fp8' or 'int8'"):
        prepare_model(cfg)
    for kv_dtype in ("fp8", "int8"):
        prepare_model(ServerConfig(model=str(tmp_path), device="cpu", kv_dtype=kv_dtype))
