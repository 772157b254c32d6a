"""DeepSeek-V4 against transformers' DeepseekV4ForCausalLM on tiny random checkpoints, fp32
on the CPU: logits of every position with prompts longer than the sliding window and than
several compression blocks of each rate, fed in chunks (each later chunk reads the earlier
ones' window rows, entries and partial blocks back from the pool, as a prefix-cache hit or
chunked prefill does), in the token, paged and contiguous layouts, with entry ids that
follow the pages and (token layout) from the entry tables, through the torch references
of the ops and (interpreted) through the Triton kernels a GPU runs; and the config fields
it does not implement, refused by name."""

from __future__ import annotations

import json

import pytest
import torch

from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.model_errors import UnsupportedArchitecture
from runtime.worker.model_check import UnsupportedModel, check_model, prepare_model
from runtime.worker.model_runner import ModelRunner
from runtime.worker.models.deepseek_v4 import DeepseekV4ForCausalLM
from runtime.worker.models.deepseek_v4_arch import DeepseekV4Arch
from runtime.worker.models.deepseek_v4_entries import entry_bytes_per_token, entry_count
from runtime.worker.models.deepseek_v4_partial import prefix_rule, ring_values
from runtime.worker.ops import TritonOps
from tests.worker.batching import Chunk, make_batch
from tests.worker.dsv4_checkpoints import (
    CSA,
    HCA,
    SWA,
    interleave_entries,
    tiny_v4,
    tiny_v4_config,
)
from tests.worker.test_deepseek import LAYOUTS, run

# tokens per step of each sequence: window 8, entries every 4 (CSA) and 8 (HCA) tokens;
# chunks start and end inside windows and blocks
SCHEDULE = [[13, 7, 1, 1, 1, 3], [6, 11, 4, 1, 1, 1]]


@pytest.mark.parametrize("variant", [
    {},
    # Pro's order (HCA first), a top-k wider than a short prompt's entries, sigmoid scores,
    # YaRN on the compressed layers' RoPE (as the released configs have it), and a SwiGLU
    # limit within the activations' range (the experts' clamp at work)
    dict(layer_types=[HCA, HCA, CSA, HCA], index_topk=5, scoring_func="sigmoid",
         swiglu_limit=0.3,
         rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16,
                              beta_fast=32, beta_slow=1)),
])  # fmt: skip
def test_matches_transformers(variant, tmp_path):
    hf = tiny_v4(tmp_path, **variant)
    spec = resolve_model(str(tmp_path))
    runner = ModelRunner(spec, "cpu", torch.float32, kv_slots=512, max_rows=4)
    arch = runner.model.arch
    assert [k.shape for k in runner.kv_pool.k] == [(513, 1, 32)] * 4  # the K=V rows alone
    entries = entry_bytes_per_token(arch, torch.float32, 1, table=False)  # one id a slot
    assert runner.kv_pool.v == [] and runner.kv_bytes_per_token == 4 * 32 * 4 + entries
    check_layouts(runner, hf, LAYOUTS)
    # ids from the entry tables, as the scheduler hands them out in the token layout
    table = ModelRunner(spec, "cpu", torch.float32, kv_slots=512, max_rows=4, entry_table=True)
    interleave_entries(table.model, len(SCHEDULE))
    assert table.entry_ids == {m: entry_count(513, m, 1, True, 4) - 1 for m in (4, 8)}
    check_layouts(table, hf, LAYOUTS[:1])


@pytest.mark.skipif(torch.cuda.is_available(), reason="test_deepseek_v4_gpu runs them on CUDA")
def test_triton_kernels_match_transformers(tmp_path):
    """The ops a GPU runs (the sparse attention, the indexer's scores and the experts as
    Triton kernels, here interpreted) in place of their torch references."""
    hf = tiny_v4(tmp_path)
    runner = ModelRunner(resolve_model(str(tmp_path)), "cpu", torch.float32, kv_slots=512,
                         max_rows=4)
    runner.model.model.ops = TritonOps(None)
    check_layouts(runner, hf, LAYOUTS[1:2])


def check_layouts(runner: ModelRunner, hf, layouts) -> None:
    """`runner`'s logits of SCHEDULE's prompts, in each of `layouts`, are transformers'."""
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 256, (sum(s),), generator=gen).tolist() for s in SCHEDULE]
    with torch.no_grad():
        want = [hf(torch.tensor([s])).logits[0] for s in seqs]  # [n, V] each
    for name, page_size, per_slot in layouts:
        got = run(runner, seqs, page_size, per_slot, SCHEDULE)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4, msg=name)
            assert g.argmax(-1).tolist() == w.argmax(-1).tolist(), name


def test_each_layer_row_holds_its_own_state():
    """At the tiny shape (head_dim 32, index_head_dim 16, fp32): every layer's row is its
    kv (32); an entry takes its bytes once a window: a CSA layer's entry and indexer key
    (32 + 16) a 4 tokens, an HCA layer's entry (32) a 8 tokens, from entry tables or with
    pages a multiple of the rate; pages of 4 give HCA one id a page (twice its windows).
    The partial blocks are in rings per request row instead: a CSA layer's of 2 * 4 tokens
    (kv and gate of two series, compressor and indexer), an HCA layer's of 8 tokens (kv
    and gate)."""
    arch = DeepseekV4Arch.from_hf(tiny_v4_config(layer_types=[SWA, CSA, HCA, CSA]))
    assert DeepseekV4ForCausalLM(arch).kv_layout() == (1, 1, (32, 32, 32, 32))
    csa, hca, f32 = 2 * (32 + 16) * 4 / 4, 32 * 4 / 8, torch.float32
    assert entry_bytes_per_token(arch, f32) == csa + hca == 112
    assert entry_bytes_per_token(arch, f32, 16, table=False) == csa + hca
    assert entry_bytes_per_token(arch, f32, 4, table=False) == csa + 2 * hca
    assert entry_bytes_per_token(arch, f32, 1, table=False) == 2 * (32 + 16) * 4 + 32 * 4
    assert prefix_rule(arch) == (8, 4)  # hits at multiples of 8, the last CSA window again
    model = DeepseekV4ForCausalLM(arch)
    rows, fp32 = 3, 4
    csa = 2 * 4 * (2 * 2 * 32 + 2 * 2 * 16)
    hca = 8 * 2 * 32
    # the rows' rings and one sink row beside them
    rings = (rows + 1) * fp32 * (2 * csa + hca)
    assert model.allocate_rows(rows, torch.float32) == rings
    assert ring_values(arch) == 2 * csa + hca  # what bench.studies.dsv4_memory counts
    # with ids handed out, each row's entry tables too: windows of 4 and 8 over 64 positions
    tables = (rows + 1) * 8 * ((64 // 4 + 1) + (64 // 8 + 1))
    assert model.allocate_rows(rows, torch.float32, 64, entry_table=True) == rings + tables
    no_csa = DeepseekV4Arch.from_hf(tiny_v4_config(layer_types=[SWA, HCA, HCA, SWA]))
    assert prefix_rule(no_csa) == (8, 0)


@pytest.mark.parametrize("change,field", [
    (dict(layer_types=[SWA, CSA, "linear_attention", CSA]), "layer_types"),
    (dict(compress_rates={CSA: 0, HCA: 8}), "compress_rates"),
    (dict(scoring_func="softmax"), "scoring_func"),
])  # fmt: skip
def test_unimplemented_config_is_refused_by_field(change, field, tmp_path):
    config = tiny_v4_config()
    config.__dict__.update(change)  # past transformers' own checks
    with pytest.raises(UnsupportedArchitecture, match=f"^{field}: ") as err:
        DeepseekV4Arch.from_hf(config)
    assert err.value.field == field
    # the same field in a checkpoint's config.json: one line at start-up naming it
    tiny_v4_config().save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, **change}))
    with pytest.raises(UnsupportedModel, match=f"config.json: `?{field}`?[: ]"):
        check_model(resolve_model(str(tmp_path)))


def test_int8_pool_is_refused(tmp_path):
    """By the runner, and at start-up (`prepare_model`, before any process loads the
    weights), one line naming the config and kv_dtype."""
    tiny_v4(tmp_path)
    for kv_dtype in ("int8", "fp8_e4m3"):
        with pytest.raises(ValueError, match=f"kv_dtype '{kv_dtype}': deepseek_v4 stores"):
            ModelRunner(resolve_model(str(tmp_path)), "cpu", torch.float32, kv_slots=64,
                        max_rows=1, kv_dtype=kv_dtype)
        cfg = ServerConfig(model=str(tmp_path), device="cpu", kv_dtype=kv_dtype)
        with pytest.raises(UnsupportedModel, match=f"config.json: kv_dtype '{kv_dtype}': "
                                                   "deepseek_v4 stores"):
            prepare_model(cfg)


def test_dummy_presets():
    tiny = ModelRunner(resolve_model("dummy:deepseek-v4-tiny"), "cpu", torch.float32,
                       kv_slots=64, max_rows=2)
    logits = tiny.forward(make_batch([Chunk(0, list(range(3, 40)))], [0], 1))
    assert torch.isfinite(logits).all()
    flash = DeepseekV4Arch.from_hf(resolve_model("dummy:deepseek-v4-flash").hf_config())
    assert (flash.hidden_size, flash.num_heads, flash.head_dim, flash.n_routed_experts,
            flash.moe_intermediate_size, flash.num_layers) == (4096, 64, 512, 256, 2048, 6)
    assert flash.rope_compress["rope_type"] == "yarn" and flash.rope_dim == 64
    assert flash.layer_types[:4] == (SWA, SWA, CSA, HCA)
