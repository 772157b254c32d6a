"""The extend-step bench: its batches must be the steps the engine runs (a cached prefix
then new tokens give the logits of one prefill of the whole sequence), and its per-head
variant must unpack what the launcher reads, and only while inside."""

import sys

import torch

from bench.offline import extend_step
from bench.offline.parts import decode_batch, step_batch
from runtime.model_config import resolve_model
from runtime.worker.model_runner import ModelRunner


def test_prefix_then_extend_matches_one_prefill():
    runner = ModelRunner(resolve_model("dummy:tiny"), "cpu", torch.float32, kv_slots=6 * 40,
                         max_rows=3, seed=0, cuda_graph=False)  # fmt: skip
    ids = torch.randint(3, runner.vocab_size, (3, 23), generator=torch.Generator().manual_seed(1))
    extend_step.fill_prefixes(runner, ids[:, :16], 40, chunk=2)  # sequences 0-1, then 2
    got = runner.forward(step_batch(ids[:, 16:], 16, 40))  # [3, V]
    # the whole sequences in one prefill, as sequences 3-5 (slots of their own)
    whole = runner.forward(step_batch(ids, 0, 40, seq0=3))  # [3, V]
    torch.testing.assert_close(got, whole, atol=2e-4, rtol=2e-4)


def test_decode_batch_is_a_one_token_step():
    fb = decode_batch(3, 5, 100, torch.device("cpu"))
    assert fb.is_decode and fb.positions.tolist() == [4, 4, 4]
    assert fb.out_slots.tolist() == [5, 10, 15] and fb.kv_indices.tolist() == list(range(1, 16))
    assert fb.kv_indptr.tolist() == [0, 5, 10, 15] and fb.sample_idx.tolist() == [0, 1, 2]


def test_per_head_unpacks_only_inside():
    launcher = sys.modules["kernels.attention.extend"].extend_attention
    rows = launcher.__globals__["rows_per_token"]  # what the launcher calls
    assert rows(32, 8) == 4
    with extend_step.per_head():
        rows = launcher.__globals__["rows_per_token"]
        assert rows(32, 8) == 1
        assert rows(32, 8, True) == 1
    assert launcher.__globals__["rows_per_token"](32, 8) == 4


def test_report_pairs_the_variants():
    rows = [{"pool": "fp8", "new": 4, "variant": "packed", "wall_ms": 15.0, "busy_ms": 10.0,
             "attn_ms": 2.0},
            {"pool": "fp8", "new": 4, "variant": "per-head", "wall_ms": 15.0, "busy_ms": 12.5,
             "attn_ms": 4.5}]  # fmt: skip
    res = {"model": "m", "batch": 32, "prefix": 2048, "command": "c", "device": "d",
           "date": "t", "tree": "abc", "rows": rows}
    md = extend_step.markdown(res)
    assert "| fp8 | 4 | 15.00 / 10.00 / 2.00 | 15.00 / 12.50 / 4.50 | 1.25x | 2.25x |" in md
