"""`python -m bench.host` on the CPU: the worker and e2e parts at their smallest sizes.

Checks the report's structure and that its counts agree with the workload; no timings.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from bench.host import driver as host
from bench.host.output import ROOT, baseline_dir
from bench.host.worker import SyntheticLoad, make_plan

REQUESTS, CONCURRENCY, INPUT_LEN, OUTPUT_LEN, STEPS = 4, 2, 8, 4, 3


def test_synthetic_plans_cover_every_token():
    load = SyntheticLoad(n=3, input_len=5, decode_steps=4, vocab=1024)
    plans = load.prefill_plans(chunk_tokens=10)  # two requests per plan
    assert [p.rows for p in plans] == [[0, 1], [2]]
    assert sum(len(p.input_ids) for p in plans) == 3 * 5
    step = load.decode_plan(batch_id=9, step=2)
    assert step.prefix_lens == [7, 7, 7] and step.input_ids == [-1, -2, -3]
    assert step.new_pages == [1 + r * load.stride + 7 for r in range(3)]
    assert max(step.new_pages) <= load.kv_slots


def test_make_plan_drops_fields_the_plan_lacks():
    plan = make_plan(batch_id=1, rows=[0], prefix_lens=[0], extend_lens=[1], input_ids=[5],
                     new_pages=[1], sample=[True], no_such_field=3)
    assert plan.batch_id == 1 and not hasattr(plan, "no_such_field")


def run_host(tmp_path, part: str) -> tuple[dict, str]:
    """`python -m bench.host --part <part>` at the smallest sizes: its JSON and Markdown."""
    out = tmp_path / "host"
    host.main(["--part", part, "--device", "cpu", "--out", str(out),
               "--e2e-models", "dummy:tiny", "--e2e-requests", str(REQUESTS),
               "--e2e-concurrency", str(CONCURRENCY), "--e2e-input-len", str(INPUT_LEN),
               "--e2e-output-len", str(OUTPUT_LEN), "--worker-steps", str(STEPS),
               "--kv-model", ""])
    data = json.loads(out.with_suffix(".json").read_text())
    meta = data["meta"]
    assert meta["command"].startswith("python -m bench.host") and meta["device"] and meta["date"]
    md = out.with_suffix(".md").read_text()
    assert f"## {part}" in md and "| dummy:tiny |" in md and meta["command"] in md
    return data, md


def test_worker_part_on_cpu(tmp_path):
    data, _ = run_host(tmp_path, "worker")
    (w,) = data["parts"]["worker"]["rows"]
    assert "error" not in w, w.get("error")
    assert w["model"] == "dummy:tiny" and w["batch"] == CONCURRENCY and w["steps"] == STEPS
    assert w["phases_missing"] == [] and {"build", "forward", "sample", "other"} <= set(
        w["phases_ms"])
    assert w["launch_ms"]["p50"] > 0 and w["device_step_ms_p50"] > 0 and w["profile"]


@pytest.mark.timeout(120)
def test_e2e_part_on_cpu(tmp_path):
    data, _ = run_host(tmp_path, "e2e")
    e2e = data["parts"]["e2e"]
    assert e2e["kv"] is None
    (row,) = e2e["rows"]
    for mode in ("offline", "served"):
        run = row[mode]
        assert "error" not in run, run.get("error")
        assert run["requests"] == run["completed"] == REQUESTS
        assert run["output_tokens"] == REQUESTS * OUTPUT_LEN
        assert run["tok_s"] == pytest.approx(run["output_tokens"] / run["wall_s"], rel=1e-6)
        steps = run["steps"]
        # every output token but each request's first (sampled at its prefill) is a decode
        assert steps["steps"] >= OUTPUT_LEN - 1
        assert 0.0 <= steps["busy"] <= 1.0 and "host_ms_p50" in steps
    assert row["served"]["failed"] == 0
    assert row["served_over_offline"] == pytest.approx(
        row["served"]["tok_s"] / row["offline"]["tok_s"])
    assert (tmp_path / "host.png").exists()


@pytest.mark.timeout(300)
def test_output_part_against_a_baseline(tmp_path):
    """The offline output part, this tree against a baseline folder (here: a link to this
    tree's runtime), ids only: every output arrives whole, the baseline's runs are kept
    apart, no timings checked."""
    out, base = tmp_path / "host", tmp_path / "base"
    base.mkdir()
    (base / "runtime").symlink_to(ROOT / "runtime")
    host.main(["--part", "output", "--out", str(out), "--output-cases", "smollm2+ids",
               "--output-requests", "3", "--output-tokens", "5", "--output-repeats", "1",
               "--output-baseline", str(base)])
    (row,) = json.loads(out.with_suffix(".json").read_text())["parts"]["output"]["rows"]
    assert row["case"] == "smollm2+ids" and row["speedup"] > 0
    for name in ("baseline", "current"):
        run = row[name]
        assert "error" not in run, run.get("error")
        assert run["tokens"] == 15 and run["ok_requests"] == run["requests"] == 3
        assert run["columns"] and run["text"] is False and len(run["runs"]) == 1
    assert row["profile"] and all(us >= 0 for _, us in row["profile"])
    md = out.with_suffix(".md").read_text()
    assert f"| smollm2+ids | baseline {base} | 3 x 5 | no |" in md


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")
def test_a_baseline_revision_is_exported_from_git(tmp_path):
    assert baseline_dir("HEAD~1", tmp_path) == tmp_path
    committed = subprocess.run(["git", "show", "HEAD~1:runtime/__init__.py"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout
    assert (tmp_path / "runtime" / "__init__.py").read_text() == committed
    assert not (tmp_path / "bench").exists()  # the bench code stays this tree's
