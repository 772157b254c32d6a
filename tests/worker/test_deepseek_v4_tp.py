"""DeepSeek-V4 under tensor parallelism on the CPU (`deepseek_v4_tp`): two gloo ranks give
transformers' logits over prompts longer than the window and several compression blocks
(token and paged layouts), on an fp8 pool the fp8 pool's logits at `--tp 1`, and a
released fp8 checkpoint with fp4 experts the logits of its dequantized twin at `--tp 1`;
every checkpoint tensor (block scales included) lands on each rank as its slice; a `--tp`
that does not divide the heads, the output groups or the experts' width is refused naming
the field, as are fp8 shares of partial blocks and the MTP head."""

from __future__ import annotations

import re

import pytest
import torch

from runtime.config.server import ServerConfig
from runtime.launch.server import run_server
from runtime.model_config import resolve_model
from runtime.worker.loader import load_model
from runtime.worker.model_check import UnsupportedModel, check_model, prepare_model
from runtime.worker.model_runner import ModelRunner
from runtime.worker.quant.block_fp8_linear import BlockFp8Linear
from runtime.worker.quant.fp8_linear import QuantizationError
from runtime.worker.speculative.mtp_checks import MtpUnavailable
from runtime.worker.tp import TPGroup, init_tp
from tests.worker.dsv4_checkpoints import tiny_v4
from tests.worker.dsv4_released import write_released
from tests.worker.test_deepseek import LAYOUTS, run
from tests.worker.test_deepseek_v4 import SCHEDULE
from tests.worker.test_deepseek_v4_checkpoints import FP8_SHAPE, prompts
from tests.worker.test_deepseek_v4_checkpoints import SCHEDULE as FP8_SCHEDULE
from tests.worker.tp_ranks import assert_rank_slices, leave, spawn_ranks

# the fp8 shape with an expert width whose halves are whole 128-row blocks (shared expert)
FP8_TP_SHAPE = dict(FP8_SHAPE, moe_intermediate_size=256)


def runner(folder, tp: TPGroup | None = None, kv_dtype: str = "auto") -> ModelRunner:
    return ModelRunner(resolve_model(str(folder)), "cpu", torch.float32, kv_slots=512,
                       max_rows=4, tp=tp, kv_dtype=kv_dtype)


def _rank(rank: int, init: str, cases: list[tuple], out: str) -> None:
    """One rank: each case's (folder, prompts, schedule, layouts, kv_dtype) logits in every
    layout, and what rank 0's layers hold; rank 0 saves them."""
    torch.set_num_threads(1)
    tp = init_tp(rank, 2, torch.device("cpu"), init)
    results = []
    for folder, seqs, schedule, layouts, kv_dtype in cases:
        r = runner(folder, tp, kv_dtype)
        attn = r.model.model.layers[1].attn
        held = (attn.heads, attn.groups, tuple(r.kv_pool.k[1].shape),
                tuple(r.model.model.layers[1].ffn.experts.w2.shape))
        results.append((held, [run(r, seqs, page, per_slot, schedule)
                               for _, page, per_slot in layouts]))
    if rank == 0:
        torch.save(results, out)
    leave()


def test_tp2_logits_match_transformers_and_the_fp8_twin(tmp_path):
    """Rank 0 holds 2 of the 4 heads, 1 of the 2 output groups, the whole K=V row a token
    and layer, each expert at half its width (8 experts x hidden 64 rows of 16 columns);
    the gathered logits are transformers' in the token and paged layouts. On an fp8 pool
    (`--kv-dtype fp8`: every rank quantizes the same whole rows and entries) they are the
    fp8 pool's at `--tp 1`, in both layouts. The released fp8 checkpoint (fp4 experts) at
    `--tp 2` gives the logits its dequantized twin gives at `--tp 1`."""
    hf = tiny_v4(tmp_path / "tiny")
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 256, (sum(s),), generator=gen).tolist() for s in SCHEDULE]
    released, reference = write_released(tiny_v4(**FP8_TP_SHAPE), tmp_path / "fp8", "fp4")
    fp8_seqs = prompts(*map(sum, FP8_SCHEDULE))
    cases = [(str(tmp_path / "tiny"), seqs, SCHEDULE, LAYOUTS[:2], "auto"),
             (str(tmp_path / "tiny"), seqs, SCHEDULE, LAYOUTS[:2], "fp8"),
             (str(released), fp8_seqs, FP8_SCHEDULE, LAYOUTS[:1], "auto")]
    spawn_ranks(tmp_path, _rank, cases, str(tmp_path / "out.pt"))
    (held, tiny), (fp8_pool_held, fp8_pool), (fp8_held, (fp8,)) = torch.load(
        tmp_path / "out.pt")
    assert held == fp8_pool_held == (2, 1, (513, 1, 32), (8 * 64, 16))
    assert fp8_held == (4, 1, (513, 1, 32), (8 * 256, 128))
    with torch.no_grad():
        want = [hf(torch.tensor([s])).logits[0] for s in seqs]  # [n, V] each
    for (name, _, _), got in zip(LAYOUTS, tiny):
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4, msg=name)
            assert g.argmax(-1).tolist() == w.argmax(-1).tolist(), name
    whole = runner(tmp_path / "tiny", kv_dtype="fp8")
    for (name, page, per_slot), got in zip(LAYOUTS, fp8_pool):
        for g, w in zip(got, run(whole, seqs, page, per_slot, SCHEDULE)):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4, msg=name)
            assert g.argmax(-1).tolist() == w.argmax(-1).tolist(), name
    twin = run(runner(reference), fp8_seqs, 1, False, FP8_SCHEDULE)
    for g, w in zip(fp8, twin):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_tp_shards_are_slices_of_the_whole_model(tmp_path):
    """At `--tp 2` each rank holds its half of the query heads (`wq_b` rows, sinks), of the
    output groups (`wo_a` rows, `wo_b` columns), of every expert's width (`w1`, `w3` rows,
    `w2` columns, the shared expert's too) and of the vocabulary; the rest whole. A released
    fp8 checkpoint's block scales are cut with their blocks."""
    spec = resolve_model("dummy:deepseek-v4-tiny")
    whole = load_model(spec, "cpu", torch.float32, seed=1)
    ranks = [load_model(spec, "cpu", torch.float32, seed=1, tp=TPGroup(r, 2)) for r in range(2)]
    layer = "model.layers.1."
    dims = {"attn.wq_a": None, "attn.wq_b": 0, "attn.wkv": None, "attn.wo_a": 0,
            "attn.wo_b": 1, "attn.indexer.wq_b": None, "attn.compressor.wkv": None,
            "ffn.experts.3.w1": 0, "ffn.experts.3.w3": 0, "ffn.experts.3.w2": 1,
            "ffn.shared_experts.w1": 0, "ffn.shared_experts.w2": 1, "ffn.gate": None}
    for module, dim in dims.items():
        assert whole.tp_split_dim(f"{layer}{module}.weight") == dim, module
    assert whole.tp_split_dim(layer + "attn.attn_sink") == 0
    assert whole.tp_split_dim(layer + "hc_attn_fn") is None
    assert whole.tp_split_dim("model.layers.0.ffn.gate.tid2eid") is None
    assert whole.tp_split_dim("head.weight") == 0
    assert_rank_slices(whole, ranks)

    released, _ = write_released(tiny_v4(**FP8_TP_SHAPE), tmp_path, "fp8")
    spec = resolve_model(str(released))
    whole = load_model(spec, "cpu", torch.float32)
    ranks = [load_model(spec, "cpu", torch.float32, tp=TPGroup(r, 2)) for r in range(2)]
    assert_rank_slices(whole, ranks)
    cut = {}  # the fp8 projections of layer 1 (a CSA layer): how their scales are cut
    for name, module in whole.named_modules():
        if isinstance(module, BlockFp8Linear):
            dim = cut[name.removeprefix(layer)] = whole.tp_split_dim(f"{name}.weight")
            for r, rank in enumerate(ranks):
                want = module.weight_scale_inv
                want = want if dim is None else want.chunk(2, dim)[r]
                assert torch.equal(rank.get_submodule(name).weight_scale_inv, want), name
    assert {m: cut[m] for m in ("attn.wq_b", "attn.wo_a", "attn.wo_b", "attn.indexer.wq_b",
                                "ffn.shared_experts.w1", "ffn.shared_experts.w2")} == {
        "attn.wq_b": 0, "attn.wo_a": 0, "attn.wo_b": 1, "attn.indexer.wq_b": None,
        "ffn.shared_experts.w1": 0, "ffn.shared_experts.w2": 1}


@pytest.mark.parametrize("tp,change,field", [
    (3, {}, "num_attention_heads (4)"),
    (4, {}, "o_groups (2)"),
    (2, dict(moe_intermediate_size=33), "moe_intermediate_size (33)"),
])  # fmt: skip
def test_tp_that_does_not_divide_is_refused_by_field(tp, change, field, tmp_path):
    """One line at start-up naming the field `--tp` does not divide."""
    tiny_v4(tmp_path, **change)
    message = f"config.json: --tp {tp} does not divide {field}"
    with pytest.raises(UnsupportedModel, match=re.escape(message)):
        check_model(resolve_model(str(tmp_path)), tp=tp)


def test_fp8_shares_of_partial_blocks_and_the_mtp_head_are_refused(tmp_path):
    """An fp8 projection whose rank share is not whole 128-row blocks (the shared expert's
    32 / 2 rows) is refused at start-up (`prepare_model`, before any process loads the
    weights) and at load, naming the tensor; so is the MTP draft head under `--tp 2`, at
    start-up."""
    released, _ = write_released(tiny_v4(**FP8_SHAPE), tmp_path / "fp8", "fp8")
    share = r"shared_experts\.w1\.weight: this rank's 16 rows \(of 32, TP 2\)"
    with pytest.raises(UnsupportedModel, match=r"config\.json: model\.layers\.0\.ffn\." + share):
        prepare_model(ServerConfig(model=str(released), device="cpu", tp=2))
    with pytest.raises(QuantizationError, match=share):
        load_model(resolve_model(str(released)), "cpu", torch.float32, tp=TPGroup(0, 2))
    tiny_v4(tmp_path / "mtp", num_nextn_predict_layers=1)
    cfg = ServerConfig(model=str(tmp_path / "mtp"), device="cpu", tp=2,
                       speculative_algorithm="mtp")
    with pytest.raises(MtpUnavailable, match="mtp runs deepseek_v4's MTP layer at --tp 1 only"):
        prepare_model(cfg)
    assert run_server(cfg) == 2  # the server: that one line, and no process started
