"""`python -m bench.offline.kv_dtype` at a CPU scale: two engines (16-bit and fp8 KV pools of
the same bytes) generate the same prompts; checks the report's structure and the pools'
capacities, no timings."""

from __future__ import annotations

import json

import pytest

from bench.offline import kv_dtype as kv_dtype_offline


@pytest.mark.timeout(180)
def test_fp8_pool_holds_more_tokens_in_the_same_bytes(tmp_path):
    out = tmp_path / "kvd"
    kv_dtype_offline.main(["--model", "dummy:tiny", "--dtype", "float32", "--batch", "4",
                           "--input-len", "64", "--output-len", "8", "--kv-gib", "0.00025",
                           "--out", str(out)])
    res = json.loads(out.with_suffix(".json").read_text())
    runs, kvb = res["runs"], res["kv_bytes_per_token"]
    assert kvb == {"auto": 2 * 2 * 2 * 32 * 4, "fp8": 2 * 2 * 2 * (32 + 4)}  # dummy:tiny
    for kd, r in runs.items():
        assert "error" not in r, r["error"]
        assert r["kv_slots"] == int(0.00025 * (1 << 30)) // kvb[kd]
        ph = r["phases"]  # every step of the run is a prefill step or a decode step
        assert ph["prefill_steps"] >= 1 and ph["decode_steps"] >= 7
        assert ph["prefill_steps"] + ph["decode_steps"] == r["steps_per_run"][0]
        for kind in ("prefill", "decode"):
            assert 0 < ph[f"{kind}_median_ms"] <= ph[f"{kind}_max_ms"] <= 1e3 * ph[f"{kind}_s"]
    assert runs["auto"]["kv_slots"] < 4 * 72 < runs["fp8"]["kv_slots"]  # fp8 holds the batch
    assert res["ratio"] == pytest.approx(runs["fp8"]["tok_s"] / runs["auto"]["tok_s"])
    assert "| fp8 / auto | 0.281 |" in out.with_suffix(".md").read_text()
    assert all(r["clocks"] is None for r in runs.values())  # no nvidia-smi on the CPU
    for r in runs.values():  # the longest step is one of the run's, with what it carried
        longest = r["phases"]["prefill_longest"]
        assert 0 <= longest["step"] < r["steps_per_run"][0] and longest["tokens"] >= 1
        assert isinstance(r["compiled_in_runs"], dict)
    assert "Triton kernels compiled during the timed run" in out.with_suffix(".md").read_text()
