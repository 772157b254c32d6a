"""The Markdown report of `python -m bench.loadtest` (its `Question:` and `Answer:` lines
first, then a table per phase and per window)."""

from __future__ import annotations

PHASES = ("capacity", "soak", "burst")


def _num(x: float | None, fmt: str = ".0f") -> str:
    return "-" if x is None else format(x, fmt)


def _problems(res: dict) -> tuple[int, int]:
    """Errors (not 429s) and OOMs over every phase, the server's log and its survival."""
    errors = sum(res[p]["failed"] for p in PHASES if p in res)
    ooms = sum(res[p]["ooms"] for p in PHASES if p in res) + res.get("server_log_ooms", 0)
    if res.get("server_alive_after") is False:
        errors += 1
    return errors, ooms


def _scale_out(b: dict) -> str:
    """The burst's replica counts: before it, at most (first when), starting, at the end."""
    rows = b["windows"]
    before = rows[max(0, b["burst_window"] - 1)]["replicas_max"]
    seen = [r for r in rows if r["replicas_max"] is not None]
    peak = max((r["replicas_max"] for r in seen), default=None)
    at = next((r["from_s"] for r in seen if r["replicas_max"] == peak), None)
    starting = max((r["replicas_starting_max"] or 0 for r in seen), default=0)
    return (f"replicas running {_num(before)} before the burst, at most {_num(peak)} (first "
            f"in the window from {_num(at, 'g')} s), up to {starting} starting, "
            f"{b['replicas_after']} at the end")


def _question(meta: dict) -> str:
    cfg = meta["config"]
    if cfg.get("ray") or cfg.get("ray_address"):
        return (f"Question: Does Sluice on Ray Serve take the mixed-length load (30% short, "
                f"60% medium, 10% long) with no error or OOM and answer a "
                f"{cfg['burst_factor']:g}x burst by adding replicas (scale-out), refusing "
                f"what the replicas cannot hold with 429s meanwhile ({meta['device']})?")
    return (f"Question: Does one server take the mixed-length load (30% short, 60% medium, "
            f"10% long) at {cfg['soak_fraction']:.0%} of its measured capacity with no error "
            f"or OOM and a steady P99 TTFT/TPOT, and answer a {cfg['burst_factor']:g}x burst "
            f"with 429s instead of collapsing ({meta['device']})?")


def question_answer(meta: dict, res: dict) -> list[str]:
    cfg = meta["config"]
    errors, ooms = _problems(res)
    sent = sum(res[p]["sent"] for p in PHASES if p in res)
    parts = [f"{errors} errors and {ooms} OOMs in {sent} requests"]
    if "capacity" in res:
        parts.append(f"capacity {res['capacity']['capacity_rps']:.2f} req/s")
    if "soak" in res:
        s = res["soak"]
        t, p = s["ttft_p99_stability"], s["tpot_p99_stability"]
        parts.append(f"soak at {res['rate_rps']:.2f} req/s for {cfg['soak_s']:g} s: P99 TTFT "
                     f"per {cfg['window_s']:g} s window {_num(t['min'])}-{_num(t['max'])} ms, "
                     f"P99 TPOT {_num(p['min'], '.1f')}-{_num(p['max'], '.1f')} ms, "
                     f"{s['shed']} of {s['sent']} refused with 429, {s['unfinished']} "
                     "unfinished")
    if "burst" in res:
        b = res["burst"]
        rows = b["windows"]
        before = rows[max(0, b["burst_window"] - 1)]["ttft_p99_ms"]
        parts.append(f"{cfg['burst_factor']:g}x burst for {cfg['burst_s']:g} s: {b['shed']} of "
                     f"{b['sent']} refused with 429, {b['failed']} failed, {b['unfinished']} "
                     "unfinished, P99 TTFT "
                     f"{_num(before)} ms before, {_num(rows[-1]['ttft_p99_ms'])} ms in the last "
                     f"window, /health {b['healthy_after']} after")
        if "replicas_max" in rows[0]:
            parts.append(_scale_out({**b, "replicas_after": res.get("replicas_after", "-")}))
    return [_question(meta), "Answer: " + "; ".join(parts) + "."]


def _phase_table(res: dict) -> list[str]:
    out = ["| phase | sent | completed | shed (429) | failed | unfinished | OOMs | req/s | "
           "out tok/s | P50 / P99 TTFT ms | P50 / P99 TPOT ms |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in PHASES:
        if name not in res:
            continue
        p, c = res[name], res[name]["client"]
        out.append(f"| {name} | {p['sent']} | {p['completed']} | {p['shed']} | {p['failed']} | "
                   f"{p['unfinished']} | {p['ooms']} | {_num(c['request_throughput'], '.2f')} | "
                   f"{_num(c['output_throughput'], '.1f')} | {_num(c['ttft_ms']['p50'])} / "
                   f"{_num(c['ttft_ms']['p99'])} | {_num(c['tpot_ms']['p50'], '.1f')} / "
                   f"{_num(c['tpot_ms']['p99'], '.1f')} |")
    return out


def _window_table(rows: list[dict], mark: int | None = None) -> list[str]:
    ray = bool(rows) and "replicas_max" in rows[0]
    out = ["| window s | sent | completed | shed | failed | P50 / P99 TTFT ms | P99 TPOT ms | "
           "running (mean) | waiting (max) | KV use (max) | GPU util mean (min-max) |"
           + (" replicas running min-max (starting) |" if ray else ""),
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if ray else "")]
    for i, r in enumerate(rows):
        util = "-" if r["gpu_util_mean"] is None else (
            f"{r['gpu_util_mean']:.0%} ({r['gpu_util_min']:.0%}-{r['gpu_util_max']:.0%})")
        label = f"{r['from_s']:g}-{r['to_s']:g}" + (" (burst)" if i == mark else "")
        out.append(f"| {label} | {r['sent']} | {r['completed']} | {r['shed']} | {r['failed']} | "
                   f"{_num(r['ttft_p50_ms'])} / {_num(r['ttft_p99_ms'])} | "
                   f"{_num(r['tpot_p99_ms'], '.1f')} | {_num(r['running_mean'], '.1f')} | "
                   f"{_num(r['waiting_max'])} | {_num(r['kv_usage_max'], '.0%')} | {util} |"
                   + (f" {_num(r['replicas_min'])}-{_num(r['replicas_max'])} "
                      f"({_num(r['replicas_starting_max'])}) |" if ray else ""))
    return out


def _ray_note(cfg: dict) -> list[str]:
    if not (cfg.get("ray") or cfg.get("ray_address")):
        return []
    where = "a local Ray cluster" if cfg.get("ray") else f"the cluster at {cfg['ray_address']}"
    return [f"Ray Serve: {where}, policy flags `{cfg['ray_args'] or '(defaults)'}`. Replicas: "
            "Serve's count of server replicas running (fewest-most) and starting (most) over "
            "each window, sampled every second; the last window runs on to the phase's end. "
            "The running / waiting / KV columns are one replica's /metrics (the one that "
            "answered each scrape).", ""]


def markdown(meta: dict, res: dict) -> str:
    cfg = meta["config"]
    lines = [f"# Load test: {res.get('model', cfg['model'])}, {meta['device']}", "",
             *question_answer(meta, res), "",
             f"`{meta['command']}`, {meta['date']}, commit {meta['commit']}; {meta['device']}.",
             "", f"Requests: the mixed set up to {cfg['max_len']} tokens (max_tokens up to "
             f"{cfg['output_len']}; the client stops reading some early, as at an EOS), "
             "streamed, greedy. Shed: refused with HTTP 429 by the admission limit "
             f"(max running {cfg['max_running']}, max queue {cfg['max_queue']} when the load "
             "test started the server; per replica on Ray Serve). Failed: any other error; "
             "unfinished: cut off by the phase's deadline.", "", *_ray_note(cfg),
             *_phase_table(res), ""]
    if "soak" in res:
        lines += [f"## Soak: {res['rate_rps']:.2f} req/s ({cfg['soak_fraction']:.0%} of "
                  f"capacity) for {cfg['soak_s']:g} s", "", *_window_table(res["soak"]["windows"]),
                  ""]
    if "burst" in res:
        b = res["burst"]
        lines += [f"## Burst: {cfg['burst_factor']:g}x the rate for {cfg['burst_s']:g} s after "
                  f"{cfg['burst_before_s']:g} s", "",
                  *_window_table(b["windows"], b["burst_window"]), ""]
    if "server_alive_after" in res:
        lines.append(f"Server alive after the run: {res['server_alive_after']}; OOM lines in "
                     f"its log: {res['server_log_ooms']}.")
    errors = sorted({e for p in PHASES if p in res for e in res[p]["errors"]})
    if errors:
        lines += ["", "Errors seen (first of each):", "", *(f"- `{e}`" for e in errors[:10])]
    return "\n".join(lines) + "\n"
