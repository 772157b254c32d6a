"""`python -m bench.loadtest`: requests cut into time windows by outcome (pure), and the
whole command on the CPU against a server it starts (dummy:tiny, a few seconds a phase)."""

from __future__ import annotations

import json

import pytest

from bench.loadtest.driver import main
from bench.loadtest.windows import counts, outcome, stability, windows
from bench.serving.metrics import CANCELLED, RequestResult


def result(start: float, ttft: float | None = None, end: float | None = None,
           tokens: int = 0, error: str = "") -> RequestResult:
    r = RequestResult(prompt_len=8, start=start, ttft=ttft, latency=end, output_len=tokens,
                      error=error)
    r.ok = not error
    return r


def test_each_request_ends_one_of_four_ways_and_ooms_are_failures():
    rs = [result(1.0, 0.1, 0.5, 5),
          result(1.0, error='HTTP 429: {"error": "the queue is full"}'),
          result(1.0, error="HTTP 500: CUDA out of memory. Tried to allocate 2.00 GiB"),
          result(1.0, error="ServerDisconnectedError: Server disconnected"),
          result(0.0, error=CANCELLED)]
    assert [outcome(r) for r in rs] == ["completed", "shed", "failed", "failed", "unfinished"]
    assert counts(rs) == {"completed": 1, "shed": 1, "failed": 2, "unfinished": 1, "ooms": 1,
                          "sent": 5}


def test_windows_take_requests_by_send_time_and_samples_by_scrape_time():
    t0 = 100.0
    rs = [result(t0 + 0.5, 0.2, 1.2, 8), result(t0 + 9.9, 0.4, 2.2, 10),
          result(t0 + 10.0, 1.0, 1.0, 1), result(t0 + 15.0, error="HTTP 429: full"),
          result(t0 + 21.0, 0.3, 0.3, 1)]  # sent after the span: counted in the last window
    samples = [(t0 + 1, {"sluice_num_requests_running": 2.0, "sluice_kv_usage_ratio": 0.5,
                         'sluice_gpu_utilization_ratio{gpu="0"}': 0.6,
                         'sluice_gpu_utilization_ratio{gpu="1"}': 0.8}),
               (t0 + 5, {"sluice_num_requests_running": 4.0, "sluice_kv_usage_ratio": 0.7,
                         'sluice_gpu_utilization_ratio{gpu="0"}': 0.2,
                         'sluice_gpu_utilization_ratio{gpu="1"}': 0.4}),
               (t0 + 12, {"sluice_num_requests_waiting": 3.0})]
    first, second = windows(rs, samples, t0, 10.0, 20.0)
    assert (first["from_s"], first["to_s"], first["sent"], first["completed"]) == (0, 10, 2, 2)
    assert first["ttft_p50_ms"] == pytest.approx(300.0)  # 0.2 and 0.4 s
    assert first["ttft_p99_ms"] == pytest.approx(398.0)
    # TPOT: (1.2 - 0.2) / 7 and (2.2 - 0.4) / 9; one-token requests have none
    assert first["tpot_p99_ms"] == pytest.approx((1 / 7 + 0.99 * (0.2 - 1 / 7)) * 1e3)
    assert first["running_mean"] == 3.0 and first["kv_usage_max"] == 0.7
    assert first["gpu_util_mean"] == pytest.approx(0.5)  # per sample over both GPUs: .7, .3
    assert (first["gpu_util_min"], first["gpu_util_max"]) == pytest.approx((0.3, 0.7))
    assert (second["sent"], second["completed"], second["shed"]) == (3, 2, 1)
    assert second["tpot_p99_ms"] is None and second["waiting_max"] == 3.0
    assert second["gpu_util_mean"] is None and second["running_mean"] is None


def test_windows_count_the_replicas_ray_serve_ran():
    t0 = 100.0
    replicas = [(t0 + 1, 2, 0), (t0 + 5, 2, 1), (t0 + 12, 3, 0),
                (t0 + 25, 4, 0)]  # after the span: counted in the last window
    first, second = windows([], [], t0, 10.0, 20.0, replicas)
    assert (first["replicas_min"], first["replicas_max"], first["replicas_starting_max"]) == (
        2, 2, 1)
    assert (second["replicas_min"], second["replicas_max"],
            second["replicas_starting_max"]) == (3, 4, 0)
    assert "replicas_max" not in windows([], [], t0, 10.0, 20.0)[0]  # one server: no column


def test_stability_is_the_spread_of_a_per_window_figure():
    rows = [{"x": 100.0}, {"x": None}, {"x": 120.0}, {"x": 300.0}]
    assert stability(rows, "x") == {"min": 100.0, "max": 300.0, "max_over_median": 2.5}
    assert stability([{"x": None}], "x") == {"min": None, "max": None, "max_over_median": None}


def test_bad_options_are_one_line_errors(capsys):
    for argv, message in ((["--phases", "soak,warmup"], "unknown ['warmup']"),
                          (["--phases", "soak"], "needs --capacity-rps"),
                          (["--soak-s", "0"], "--soak-s must be > 0"),
                          (["--ray", "--url", "http://127.0.0.1:1"], "--ray starts a deployment"),
                          (["--ray-address", "auto"], "--ray-address needs --url")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2 and message in capsys.readouterr().err


def test_the_command_runs_every_phase_on_a_server_it_starts(tmp_path):
    out = tmp_path / "lt"
    res = main(["--server-args", "--device cpu --kv-slots 4096 --torch-threads 1",
                "--max-running", "4", "--max-queue", "4", "--max-len", "256",
                "--output-len", "8", "--capacity-requests", "8", "--soak-s", "3",
                "--window-s", "1", "--burst-before-s", "1", "--burst-s", "1",
                "--burst-after-s", "1", "--device-label", "CPU, loaded", "--out", str(out)])
    assert json.loads(out.with_suffix(".json").read_text()) == res
    r = res["result"]
    for phase in ("capacity", "soak", "burst"):
        p = r[phase]
        assert p["sent"] == p["completed"] + p["shed"] + p["failed"] + p["unfinished"] > 0
        assert p["failed"] == p["ooms"] == 0, p["errors"]
    assert r["capacity"]["shed"] == 0  # at most max_running in flight: never refused
    assert r["rate_rps"] == pytest.approx(0.8 * r["capacity"]["capacity_rps"])
    assert len(r["soak"]["windows"]) == 3 and len(r["burst"]["windows"]) == 3
    assert r["burst"]["burst_window"] == 1 and r["burst"]["healthy_after"] == 200
    assert r["server_alive_after"] is True and r["server_log_ooms"] == 0
    assert res["meta"]["device"] == "CPU, loaded"
    assert res["meta"]["command"].startswith("python -m bench.loadtest --server-args")
    md = out.with_suffix(".md").read_text().splitlines()
    assert md[2].startswith("Question: Does one server take the mixed-length load")
    assert md[3].startswith("Answer: 0 errors and 0 OOMs in ")
