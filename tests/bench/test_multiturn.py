"""`python -m bench.serving.multiturn --smoke`: two CPU servers (host tier off and on) serving the
same multi-turn chats. Checks the report's structure and that only the tier's server
serves prefixes from the host; no timings."""

from __future__ import annotations

import json

from bench.serving import multiturn


def test_smoke_run_reports_host_hits_only_with_the_tier(tmp_path):
    multiturn.main(["--smoke", "--out-dir", str(tmp_path)])
    (path,) = tmp_path.glob("*-multiturn-smoke.json")
    res = json.loads(path.read_text())
    off, on = res["configs"]["off"], res["configs"]["0.05 GiB"]
    for r in (off, on):
        assert r["failed"] == 0 and r["completed"] == 6 * 3
    assert off["host_hit_rate"] == 0 and "host_kv_slots" not in off
    assert on["host_hit_rate"] > 0 and on["kv_load_bytes"] > 0 and on["kv_writeback_bytes"] > 0
    assert on["prefix_hit_rate"] > off["prefix_hit_rate"]
    assert "| off |" in path.with_suffix(".md").read_text()
