"""`python -m bench.kernels.moe --tiny`: the MoE bench runs on the CPU through the Triton
interpreter, checks the kernel against the reference and reports every token count."""

import json

from bench.kernels import moe as kernels_moe


def test_tiny_run_reports_each_token_count(tmp_path):
    kernels_moe.main(["--tiny", "--out", str(tmp_path / "moe")])
    res = json.loads((tmp_path / "moe.json").read_text())
    rows = res["rows"]
    assert [r["tokens"] for r in rows] == list(kernels_moe.SHAPES["tiny"].tokens)
    assert all(r["max_abs_err"] < 1e-4 and r["bound_us"] > 0 for r in rows)
    assert all(r["flops"] == 2 * r["tokens"] * 2 * 3 * 64 * 48 for r in rows)
    assert "| 7 |" in (tmp_path / "moe.md").read_text()
