"""`bench.studies.compare`'s report on a synthetic results dict: the claims come out of the numbers,
missing and failed cells say so, and the plots are written."""

from __future__ import annotations

import json

import pytest

from bench.serving.driver import LoadRun
from bench.serving.metrics import RequestResult, finite
from bench.studies.claims import claims, derived, seeds_rows, star_rows
from bench.studies.matrix import (
    ACTIVATION_RESERVE,
    CONTEXT_RESERVE,
    FULL,
    ROW_SLACK,
    budget_kv_slots,
    customize,
    mode_kv_dtype,
    parse_bytes,
    row_state_bytes,
)
from bench.studies.plots import write_plots
from bench.studies.report import _header, write_markdown

GiB = 1 << 30
KVB = 512 * 1024  # the 7B shape's KV bytes per token


def _cell(name: str, kind: str, clients: int, seeds_c: int, tps: float, reserved: int,
          held: int) -> dict:
    results = []
    for _ in range(4):
        r = RequestResult(100, start=0.0, ok=True)
        r.on_chunk(0.5, 1)
        r.on_chunk(0.6, int(tps) - 1)  # 4 requests x tps tokens over 4 s: tps tok/s
        results.append(r)
    rep = LoadRun(results, 4.0, False, server={
        "peak_kv_reserved_slots": reserved, "kv_held_at_peak": held,
        "peak_kv_reserved_bytes": reserved * KVB, "kv_held_at_peak_bytes": held * KVB,
        "memory_efficiency_at_peak": held / reserved, "memory_efficiency_avg": held / reserved,
        "fragmentation_at_peak": 1 - held / reserved, "peak_running": min(clients, 65),
        "retractions": 3.0}, gpu_steps={"steps": 10, "idle_fraction": 0.05,
                                         "gap_ms_p50": 0.01}).report()
    rep["cell"] = {"name": name, "kind": kind, "concurrency": clients,
                   "seeds_concurrency": seeds_c}
    return rep


def _results() -> dict:
    modes = {}
    for mode, (tps, eff) in {"paged": (1000.0, 0.99), "sglang": (1200.0, 1.0),
                             "contiguous": (900.0, 0.8)}.items():
        cells = {f"c{c}": _cell(f"c{c}", "sweep", c, c, tps, 100_000, int(100_000 * eff))
                 for c in (50, 100)}
        cells["fixed"] = _cell("fixed", "fixed", 64, 0, tps, 40_000, int(40_000 * eff))
        cells["c150"] = {"cell": {"name": "c150", "kind": "sweep", "seeds_concurrency": 150},
                         "skipped": "time budget (2 s left)"}
        modes[mode] = {"args": ["--kv", mode], "cells": cells, "start_s": 20.0, "warmup_s": 3.0}
    modes["token-no-overlap"] = {"args": ["--kv", "token"], "cells": {},
                                 "error": "server exited with 1 during start-up:\nTraceback"}
    return {"meta": {"command": "python -m bench.studies.compare", "date": "2026-11-29",
                     "device": "H200",
                     "git": "abc", "profile": "full", "model": "dummy:llama-7b-32k",
                     "dtype": "float16", "kv_slots": 133507, "slo_ms": {"ttft": 5000.0},
                     "time_budget_s": 480.0, "elapsed_s": 470.0,
                     "kv_budget": {"budget_bytes": 80 * GiB, "weight_bytes": 13476831232,
                                   "kv_bytes_per_token": KVB, "used": "--gpu-memory-budget",
                                   "explain": "80 GiB - ..."}},
            "modes": modes,
            "fragmentation": {"meta": {"requests": 300, "mix": "30/60/10", "slots": 65536},
                              "results": [{"mode": "paged-32", "frag_at_peak": 0.0085,
                                           "frag_avg": 0.0084, "peak_running": 48,
                                           "retractions": 1},
                                          {"mode": "paged-dynamic", "frag_at_peak": 0.0108,
                                           "frag_avg": 0.0095, "peak_running": 48,
                                           "retractions": 1}]}}


def test_derived_numbers_and_claims():
    res = _results()
    d = derived(res, "paged", "c50")
    assert d["tps"] == pytest.approx(1000.0)
    assert d["mem_gib"] == pytest.approx((13476831232 + 100_000 * KVB) / GiB)
    assert d["eff"] == pytest.approx(0.99)
    assert derived(res, "paged", "c150") == {} and derived(res, "nope", "c50") == {}
    table = {row[0]: row for row in claims(res)}
    kv = table["KV cache 8 KB/token for a 7B fp16 model (d_model 4096, 32 layers); 100 x 2048 "
               "tokens = 53.7 GB"]
    assert "512 KiB/token" in kv[1] and "100.0 GiB" in kv[1] and kv[2].startswith("refuted")
    tput = table["... but costs 15-20% throughput (vs paged)"]
    assert "+20% c50" in tput[1] and tput[2] == "refuted: no loss"
    frag = table["fragmentation: fixed block 32 -> 12.3%, dynamic -> 7.8%"]
    assert frag[1].startswith("0.84% / 0.95%") and frag[2].startswith("refuted")
    assert table["max concurrency without OOM: 80 (original) -> 200 (paged), x2.5"][2] == "n/m"
    rows = seeds_rows(res)
    paged50 = next(r for r in rows if r[0] == 50 and r[1] == "PagedAttention")
    assert paged50[2:6] == ["18", "1350", "165", "82%"] and paged50[9].startswith("1000")
    assert next(r for r in rows if r[0] == 150 and "paged" in r[6])[9] == "n/m (n/m)"
    stars = {row[3]: row for row in star_rows(res)}
    assert stars["out tok/s, fixed n/m"][4:] == ["1000", "1200", "sglang"]
    assert stars["mean TTFT ms, long"][6] == "n/m"


def test_report_and_plots_are_written(tmp_path):
    res = finite(json.loads(json.dumps(_results())))
    prefix = tmp_path / "2026-11-29-h200"
    write_markdown(prefix.with_suffix(".md"), res)
    md = prefix.with_suffix(".md").read_text()
    for text in ("## The seeds' results table", "## Claims", "## The star table",
                 "## Fragmentation by block size", "## Every workload", "## Failures",
                 "time budget (2 s left)", "server exited with 1 during start-up"):
        assert text in md
    paths = write_plots(prefix, res)
    assert [p.name for p in paths] == [f"2026-11-29-h200-{n}.png" for n in
                                       ("throughput", "p99-tpot", "memory", "fragmentation")]
    assert all(p.stat().st_size > 10_000 for p in paths)


def test_memory_budget_arithmetic():
    assert parse_bytes("80GiB") == 80 * GiB and parse_bytes("80GB") == 80 * 10**9
    assert parse_bytes("512MiB") == 512 << 20 and parse_bytes("1234") == 1234
    b = budget_kv_slots(FULL, 80 * GiB)
    assert b["weight_bytes"] == 6_738_415_616 * 2 and b["kv_bytes_per_token"] == KVB
    assert b["kv_slots"] == (80 * GiB - b["weight_bytes"] - b["reserve_bytes"]) // KVB
    assert 125_000 < b["kv_slots"] < 140_000  # ~65 sequences of 2048 tokens


def test_pool_bytes_follow_the_kv_dtype_and_the_model():
    fp8 = budget_kv_slots(FULL, 80 * GiB, "fp8")
    assert fp8["kv_bytes_per_token"] == 2 * 32 * 32 * (128 + 4)  # a float32 scale a (token, head)
    assert 1.9 < fp8["kv_slots"] / budget_kv_slots(FULL, 80 * GiB)["kv_slots"] < 1.95
    assert budget_kv_slots(FULL, 80 * GiB, "fp8_e4m3")["kv_bytes_per_token"] == KVB // 2
    ds = customize(FULL, "dummy:deepseek-v2-lite", "bfloat16", 800, "50,800")
    assert (ds.vocab, ds.max_context, ds.max_running) == (102400, 8192, 800)
    assert [(c.name, c.n, c.input_len, c.output_len, c.seeds_concurrency)
            for c in ds.cells if c.kind == "sweep"] == [("c50", 50, 1792, 256, 50),
                                                        ("c800", 800, 1792, 256, 0)]
    bf16, latent_fp8 = budget_kv_slots(ds, 80 * GiB), budget_kv_slots(ds, 80 * GiB, "fp8")
    assert bf16["kv_bytes_per_token"] == 27 * (512 + 64) * 2  # one latent row a layer
    assert latent_fp8["kv_bytes_per_token"] == 27 * (512 + 64 + 4)
    assert 750 < bf16["kv_slots"] // 2048 < 850  # ~800 sequences of 2048 tokens under 80 GiB
    assert mode_kv_dtype("sglang-fp8") == "fp8" and mode_kv_dtype("paged") == "auto"
    assert mode_kv_dtype("sglang-fp8-e4m3") == "fp8_e4m3"


def test_deepseek_v4_budget_counts_its_rows_and_its_rings():
    """The cut Flash preset (6 layers: 2 sliding-window, 2 CSA, 2 HCA at head_dim 512): a
    token's K=V rows (512 values a layer) and its share of the entry pools, the larger of
    the token layout's and pages of 16's (CSA: 512 + 128 values a 4 tokens either way;
    HCA: 512 a 128 tokens, or a 16 under pages of 16), and every request row's
    partial-block rings, out of the budget before the pool."""
    v4 = customize(FULL, "dummy:deepseek-v4-flash", "bfloat16", 64, "50")
    b = budget_kv_slots(v4, 130 * GiB)
    per_token = 2 * (6 * 512 + 2 * (512 + 128) // 4 + 2 * 512 // 16)
    assert b["kv_bytes_per_token"] == per_token == 6_912
    rings = row_state_bytes("dummy:deepseek-v4-flash", "bfloat16", 64 + ROW_SLACK)
    assert rings == (64 + ROW_SLACK) * 606_208
    assert b["kv_slots"] == (130 * GiB - b["weight_bytes"] - b["reserve_bytes"]) // per_token
    logits = 8 * (64 + ROW_SLACK) * v4.vocab * 4
    assert b["reserve_bytes"] == ACTIVATION_RESERVE + CONTEXT_RESERVE + logits + rings


def test_report_names_each_pool():
    res = _results()
    res["meta"]["kv_budgets"] = {"auto": res["meta"]["kv_budget"],
                                 "fp8": {"explain": "80 GiB - ... / 264.0 KiB"}}
    res["modes"]["sglang-fp8"] = {"args": ["--kv-dtype", "fp8"], "cells": {}, "kv_slots": 258924}
    md = "\n".join(_header(res))
    assert "The `--kv-dtype fp8` modes' pool: 80 GiB - ... / 264.0 KiB." in md
    assert "`--kv-dtype fp8`, start n/m s, warm-up n/m s, `--kv-slots 258924`" in md
