"""`python -m bench.peers`: Sluice and a peer engine one after the other on the same
workloads, one table of ratios. On the CPU the peer is `tests.bench.fake_peer`, which speaks
the same process protocol as the vLLM module; no timing is asserted, only that every
number reaches the table from the run that measured it."""

from __future__ import annotations

import json
import statistics
import time

import pytest

from bench.peers import clients, driver, groups, report
from bench.peers.protocol import Job, as_flags
from bench.peers.workloads import GROUPS, prompts
from bench.serving.metrics import RequestResult, summarize

FAKE = "tests.bench.fake_peer"


def medians(engine_out: dict, row: str, key: str) -> float:
    return statistics.median(r[key] for r in engine_out["rows"][row]["runs"])


def test_tiny_run_against_a_fake_peer_gives_both_columns_and_their_ratio(tmp_path):
    out = tmp_path / "peers"
    driver.main(["--tiny", "--only", "offline-tiny,served-tiny", "--peer", FAKE,
                 "--repeats", "2", "--work", str(tmp_path / "work"), "--out", str(out)])
    res = json.loads(out.with_suffix(".json").read_text())
    assert res["peer"] == {"name": "fake_peer", "status": "run", "version": "0.0-fake"}
    assert [(t["group"], t["row"]) for t in res["table"]] == [
        ("offline-tiny", "tiny batch 1, 16/4"), ("offline-tiny", "tiny batch 4, 16/4"),
        ("served-tiny", "served-tiny c2, 16/4")]
    md = out.with_suffix(".md").read_text()
    assert "| workload | metric | fake_peer | Sluice | Sluice/fake_peer |" in md
    for t in res["table"]:
        engines = res["groups"][t["group"]]["engines"]
        mine = medians(engines["sluice"], t["row"], "out_tok_s")
        theirs = medians(engines["fake_peer"], t["row"], "out_tok_s")
        assert t["ratio"]["out_tok_s"] == pytest.approx(mine / theirs, rel=1e-12)
        assert f"| {mine / theirs:.2f} |" in md.split(f"| {t['row']} |")[1].splitlines()[0]
        for engine in ("sluice", "fake_peer"):
            assert t["metrics"][engine]["out_tok_s"]["n"] == 2
            runs = engines[engine]["rows"][t["row"]]["runs"]
            if t["group"] == "offline-tiny":
                assert all(r["complete"] for r in runs)
            else:
                assert [r["completed"] for r in runs] == [6, 6]
                assert all(r["failed"] == 0 for r in runs)
    offline, served = (res["groups"][g]["engines"] for g in ("offline-tiny", "served-tiny"))
    assert offline["sluice"]["start_s"] > 0 and offline["sluice"]["import_s"] > 0
    assert served["sluice"]["start_s"] > 0 and served["fake_peer"]["start_s"] > 0
    assert offline["fake_peer"]["defaults"] == {"max_num_seqs": 7}
    assert offline["sluice"]["options"]["torch_threads"] == 1
    assert served["sluice"]["options"]["device"] == "cpu"
    assert served["sluice"]["defaults"]["max_running"] == 256
    assert "Question:" in md and "Answer: Sluice/fake_peer from" in md
    assert out.with_suffix(".png").stat().st_size > 0


def test_multiturn_rows_run_through_the_same_server_protocol(tmp_path):
    ref = groups.EngineRef("fake_peer", FAKE, {})
    job = Job(GROUPS["multiturn-tiny"], str(tmp_path), repeats=1)
    out = groups.served(ref, job, groups.multiturn_row, tmp_path, time.monotonic() + 120)
    (run,) = out["rows"]["multi-turn-tiny 4 chats x 2, c4"]["runs"]
    assert run["completed"] == 4 * 2 and run["failed"] == 0
    assert "prefix_hit_rate" not in run  # the fake server exports no prefix-cache counters
    assert out["model"] == "fake-model" and out["start_s"] > 0


def canned_sluice(ref, job, work, deadline):
    runs = [{"out_tok_s": 100.0 + i, "total_tok_s": 500.0, "wall_s": 0.1, "complete": True}
            for i in range(job.repeats)]
    return {"engine": ref.name, "start_s": 1.0, "import_s": 0.5, "version": "git x",
            "rows": {r.name: {"runs": runs} for r in job.group.rows}}


def test_without_the_peer_sluice_runs_alone_and_the_column_says_not_run(tmp_path,
                                                                         monkeypatch, capsys):
    monkeypatch.setattr(groups, "offline", canned_sluice)
    out = tmp_path / "alone"
    driver.main(["--tiny", "--only", "offline-tiny", "--peer", "tests.bench.no_such_engine",
                 "--work", str(tmp_path / "work"), "--out", str(out)])
    assert "peer no_such_engine: not run: module tests.bench.no_such_engine cannot be " \
           "imported. Running Sluice alone." in capsys.readouterr().out
    res = json.loads(out.with_suffix(".json").read_text())
    assert res["peer"]["status"].startswith("not run")
    assert list(res["groups"]["offline-tiny"]["engines"]) == ["sluice"]
    md = out.with_suffix(".md").read_text()
    assert "| no_such_engine (not run) | Sluice |" in md
    assert "| tiny batch 1, 16/4 | output tok/s | - | 100.5 [100.0-101.0] | not run |" in md
    assert "Answer: no_such_engine not run: module" in md
    assert not out.with_suffix(".png").exists()  # no ratio, no plot


def test_vllm_missing_here_names_the_unpack_step():
    if driver.importable("vllm", {}):
        pytest.skip("vllm is installed here")
    ref = driver.resolve_peer("vllm")
    assert ref.module == "bench.peers.vllm_engine" and "docs/peers.md" in ref.missing


def test_every_generator_reads_into_the_same_metrics():
    vllm = {"duration": 10.0, "completed": 512, "failed": 0, "output_throughput": 5000.0,
            "total_token_throughput": 25000.0, **{f"{s}_{m}_ms": 1.0 for s in
            ("mean", "median", "p90", "p99") for m in ("ttft", "tpot", "itl", "e2el")}}
    sglang = {"duration": 10.0, "completed": 512, "output_throughput": 5000.0,
              "total_throughput": 25000.0, **{f"{s}_{m}_ms": 1.0 for s in
              ("mean", "median", "p90", "p99") for m in ("ttft", "tpot", "itl", "e2e_latency")}}
    results = [RequestResult(4, ok=True, output_len=3, ttft=0.001, latency=0.003,
                             itl=[0.001, 0.001], chunks=3)]
    ours = clients.flat_summary(summarize(results, 1.0))
    a, b = clients.flat_result(vllm), clients.flat_result(sglang)
    assert a == {**b, "failed": 0} and set(a) <= set(ours)
    assert a["ttft_p50"] == 1.0 and a["e2e_p99"] == 1.0 and ours["ttft_p50"] == pytest.approx(1.0)


def test_results_of_several_calls_merge_into_one_report(tmp_path):
    def result(groups_, cmd):
        return {"meta": {"command": cmd, "date": "d", "git": "g", "device": "x",
                         "dtype": "bfloat16", "repeats": 1, "client": "c"},
                "peer": {"name": "vllm", "status": "run"}, "groups": groups_}

    def group(value, row="r"):
        runs = [{"out_tok_s": value}]
        return {"kind": "offline", "headline": "out_tok_s", "rows": [row],
                "engines": {"sluice": {"rows": {row: {"runs": runs}}},
                            "vllm": {"rows": {row: {"runs": [{"out_tok_s": 2.0}]}}}}}

    paths = []
    for i, res in enumerate((result({"a": group(1.0), "b": group(1.0)}, "one"),
                             result({"b": group(3.0)}, "two"),
                             result({"b": group(4.0, row="s")}, "three"))):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(res))
    report.main([str(p) for p in paths] + ["--out", str(tmp_path / "m")])
    merged = json.loads((tmp_path / "m.json").read_text())
    assert [(t["group"], t["row"], t["ratio"]["out_tok_s"]) for t in merged["table"]] == [
        ("a", "r", 0.5), ("b", "r", 1.5), ("b", "s", 2.0)]
    assert merged["meta"]["command"] == "one; two; three"


def test_options_become_flags_and_prompts_are_the_same_for_every_engine():
    assert as_flags({"kv_slots": 4096, "enforce_eager": True, "overlap": False}) == [
        "--kv-slots", "4096", "--enforce-eager"]
    assert driver.parse_options(["max_running=512", "kv=paged", "cuda-graph=false"]) == {
        "max_running": 512, "kv": "paged", "cuda_graph": False}
    group = GROUPS["offline-8b"]
    row = group.rows[1]
    first = prompts(group, row, 0)
    assert first == prompts(group, row, 0) and first != prompts(group, row, 1)
    assert len(first) == 64 and {len(p) for p in first} == {512}
    assert min(min(p) for p in first) >= 3 and max(max(p) for p in first) < 128256
