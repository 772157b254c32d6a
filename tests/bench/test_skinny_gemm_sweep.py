"""The skinny-GEMM sweep's pieces that run without a GPU: which configs a row count may use,
and the table it writes keeping the rows it did not measure."""

import json

from bench.kernels.skinny_gemm import fits, grid, merged_table
from kernels.gemm.skinny_configs import SkinnyConfig


def row(kind, m, n, k, best_us, cublas_us, block_n):
    return {"kind": kind, "m": m, "m_bucket": m, "n": n, "k": k, "best_us": best_us,
            "cublas_us": cublas_us, "best": {"block_n": block_n}}


def test_restricted_run_replaces_its_keys_and_keeps_the_rest(tmp_path):
    old = [{"fp8": False, "m_bucket": 1, "n": 64, "k": 32, "config": {"block_n": 8},
            "beats_cublas": True},
           {"fp8": True, "m_bucket": 2, "n": 64, "k": 32, "config": {"block_n": 8},
            "beats_cublas": True}]
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"device": "old", "entries": old}))
    res = {"device": "new", "date": "now",
           "rows": [row("fp8", 2, 64, 32, 10.0, 9.0, 16), row("fp8", 4, 64, 32, 5.0, 9.0, 32)]}
    table = merged_table(res, str(path))
    got = {(e["fp8"], e["m_bucket"]): e for e in table["entries"]}
    assert got[(False, 1)] == old[0]  # the 16-bit row survives
    assert got[(True, 2)]["config"] == {"block_n": 16} and not got[(True, 2)]["beats_cublas"]
    assert got[(True, 4)]["beats_cublas"]
    assert len(merged_table(res, "")["entries"]) == 2
    old[1]["source"] = "the step's A/B"  # set by timing the step: a sweep leaves it
    path.write_text(json.dumps({"device": "old", "entries": old}))
    got = {(e["fp8"], e["m_bucket"]): e for e in merged_table(res, str(path))["entries"]}
    assert got[(True, 2)] == old[1] and got[(True, 4)]["beats_cublas"]


def test_row_sum_configs_only_for_few_rows_and_registers():
    small = SkinnyConfig(block_n=16, block_k=512, num_warps=8, dot=False, fold=16)
    unfolded = SkinnyConfig(block_n=16, block_k=512, num_warps=8, dot=False, fold=1)
    assert fits(small, 4, fp8=True) and not fits(small, 5, fp8=True)
    assert fits(unfolded, 1, fp8=True) and not fits(unfolded, 4, fp8=True)  # 4 x 32 sums
    assert fits(SkinnyConfig(dot=True), 16, fp8=True)
    fast = grid(True, quick=False, fp8_decode=True)
    assert any(c.dot for c in fast) and any(not c.dot for c in fast)
