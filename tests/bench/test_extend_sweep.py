"""`python -m bench.kernels.extend_sweep --smoke` on the CPU interpreter: every pool is timed
under each config, the picked default is marked, and quantized rows compare with the 16-bit
default."""

import json
import math
import sys

from bench.kernels import extend_sweep


def test_smoke_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["extend_sweep", "--smoke", "--out", str(tmp_path)])
    extend_sweep.main()
    rows = json.loads((tmp_path / "extend_sweep.json").read_text())
    pools = ("float32", "fp8", "int8", "fp8_e4m3", "fp8_e4m3 f16-scores")
    assert [r["pool"] for r in rows] == [p for p in pools for _ in range(2)]
    assert [r["default"] for r in rows] == [False, True] * 5  # 64 x 64 in 2 stages on the CPU
    assert all(math.isfinite(r["vs16"]) and r["vs16best"] > 0 for r in rows[2:])
    # the same attention, whatever the pool (the unscaled pool's codes are stored by the
    # interpreter, whose fp32 -> e4m3 cast sends a few values a binade down)
    assert all(r["diff"] < (0.4 if r["pool"].startswith("fp8_e4m3") else 0.2) for r in rows)
