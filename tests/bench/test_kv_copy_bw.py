"""`python -m bench.kernels.kv_copy_bw --smoke`: the copy bench runs through `KVTransfer` on the CPU
and reports every size it was asked for; no timings."""

from __future__ import annotations

import json

from bench.kernels import kv_copy_bw


def test_smoke_run_reports_each_size(tmp_path):
    kv_copy_bw.main(["--smoke", "--out-dir", str(tmp_path)])
    (path,) = tmp_path.glob("*-kv-copy-bw-smoke.json")
    res = json.loads(path.read_text())
    assert [r["tokens"] for r in res["rows"]] == [16, 64]
    assert all(r["bytes"] == r["tokens"] * res["bytes_per_token"] > 0 for r in res["rows"])
    assert "| 64 |" in path.with_suffix(".md").read_text()
