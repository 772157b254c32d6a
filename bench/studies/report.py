"""The Markdown report of `bench.studies.compare`: the seeds' tables with our numbers beside theirs,
each claim with its measured number and verdict, then every cell.

Reads only the results dict (`<stem>.json`), so it can be re-rendered from a saved file:

    python -m bench.studies.report bench/results/<stem>.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.studies.claims import claims, fmt, get, seeds_rows, star_rows, sweep_cells


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]


def _header(res: dict) -> list[str]:
    m = res["meta"]
    kv = m["kv_budget"]
    lines = [f"# Serving matrix: KV modes x workloads ({m['device']}, {m['date']})", "",
             f"`{m['command']}` (profile `{m['profile']}`, git {m['git']}), model `{m['model']}` "
             f"{m['dtype']}, {fmt(m.get('elapsed_s'), '.0f')} s of a {m['time_budget_s']:.0f} s "
             f"budget. Goodput SLO (ms): {m['slo_ms']}.", ""]
    if kv["used"] == "--gpu-memory-budget":
        lines.append(f"KV pool from `--gpu-memory-budget`: {kv['explain']}; passed to each "
                     f"server as `--kv-slots {m['kv_slots']}`.")
        for kd, b in m.get("kv_budgets", {}).items():  # the modes of another KV dtype
            if kd != kv.get("kv_dtype", "auto"):
                lines.append(f"The `--kv-dtype {kd}` modes' pool: {b['explain']}.")
    else:
        lines.append(f"KV pool: `--kv-slots {m['kv_slots']}` (the memory budget is not applied "
                     f"in this profile).")
    lines += ["", "Modes (each a fresh server; common flags `--model --dtype --kv-slots "
              "--max-running`):", ""]
    for mode, e in res["modes"].items():
        extra = f", error: {e['error'].splitlines()[0]}" if e.get("error") else ""
        if e.get("kv_slots", m["kv_slots"]) != m["kv_slots"]:
            extra += f", `--kv-slots {e['kv_slots']}`"
        lines.append(f"- `{mode}`: `{' '.join(e['args'])}`, start {fmt(e.get('start_s'), '.1f')}"
                     f" s, warm-up {fmt(e.get('warmup_s'), '.1f')} s{extra}")
    return lines + [""]


def _seeds_table(res: dict) -> list[str]:
    lines = ["## The seeds' results table (A100 80GB) with ours beside it", "",
             "Ours: memory = weights + peak KV reserved by live requests (what a pool sized "
             "on demand would need; the device held the whole capped pool, `NVML`); "
             "throughput = output tokens/s (total incl. prompt in brackets); P99 = inter-token "
             "latency (TPOT, TTFT beside it); efficiency = live tokens / reserved slots at the "
             "peak (and averaged over the run); `done` = completed / sent.", ""]
    header = ["conc.", "scheme", "seeds GB", "seeds tok/s", "seeds P99 ms", "seeds eff.",
              "our mode", "ours GiB", "NVML GiB", "ours tok/s", "P99 ITL / TPOT / TTFT ms",
              "eff. peak (avg)", "peak running", "retract.", "done"]
    return lines + _table(header, seeds_rows(res)) + [""]


def _claims(res: dict) -> list[str]:
    lines = ["## Claims", "", "Each claim of the seeds with our measured number; verdicts "
             "follow the numbers (n/m: not measured in this run).", ""]
    return lines + _table(["claim (seeds)", "ours", "verdict"], claims(res)) + [""]


def _stars(res: dict) -> list[str]:
    lines = ["## The star table: PagedAttention vs SGLang-style", "",
             "Stars are the seeds'; our columns are `paged` and `sglang` on the workload that "
             "stands for the row.", ""]
    header = ["scenario", "seeds paged", "seeds SGLang", "measure", "ours paged",
              "ours sglang", "better here"]
    return lines + _table(header, star_rows(res)) + [""]


def _fragmentation(res: dict) -> list[str]:
    frag = res.get("fragmentation") or {}
    lines = ["## Fragmentation by block size", ""]
    if "results" not in frag:
        error = frag.get("error", "skipped")
        return lines + [f"bench.studies.fragmentation did not run: {error}", ""]
    m = frag["meta"]
    lines += [f"`bench.studies.fragmentation` (bookkeeping replay of the real schedulers, "
              f"no model): "
              f"{m['requests']} requests, {m['mix']}, {m['slots']} slots. Seeds: fixed block "
              f"32 -> 12.3%, dynamic -> 7.8%.", ""]
    rows = [[r["mode"], f"{r['frag_at_peak']:.2%}", f"{r['frag_avg']:.2%}", r["peak_running"],
             r["retractions"]] for r in frag["results"]]
    lines += _table(["manager", "frag at peak", "frag avg", "peak running", "retractions"], rows)
    live = []
    for mode in res["modes"]:
        for name in ("mixed", *(c for c, _ in sweep_cells(res, mode))):
            s = get(res, mode, name, "server") or {}
            if s.get("fragmentation_at_peak") is not None:
                live.append([mode, name, fmt(s["fragmentation_at_peak"], ".2%"),
                             fmt(1 - s["memory_efficiency_avg"], ".2%")
                             if s.get("memory_efficiency_avg") is not None else "n/m"])
    if live:
        lines += ["", "Live servers (from `/metrics`: 1 - held / reserved KV slots):", ""]
        lines += _table(["mode", "workload", "frag at peak", "frag avg"], live)
    return lines + [""]


def _all_cells(res: dict) -> list[str]:
    header = ["mode", "workload", "done / sent", "s", "req/s", "out tok/s", "TTFT p50/p99",
              "TPOT p50/p99", "ITL p99", "E2E p99", "goodput", "peak run.", "eff. peak",
              "retract.", "prefix hit", "GPU idle (gap p50 ms)"]
    rows = []
    for mode, e in res["modes"].items():
        for name, rep in e["cells"].items():
            if "client" not in rep:
                why = rep.get("skipped", "error").strip().splitlines()[-1][:100]
                rows.append([mode, name, why.replace("|", "/")] + [""] * 13)
                continue
            c, s, g = rep["client"], rep.get("server", {}), rep.get("gpu_steps", {})
            flag = " (cut)" if rep.get("truncated") else ""
            flag += f" ({c['failed']} failed)" if c["failed"] else ""
            flag += " (server died)" if rep.get("error") else ""
            rows.append([
                mode, name, f"{c['completed']} / {c['requests']}{flag}",
                fmt(c["duration_s"], ".1f"), fmt(c["request_throughput"], ".2f"),
                fmt(c["output_throughput"] if not rep.get("truncated")
                    else c["received_output_throughput"], ".0f"),
                f"{fmt(c['ttft_ms']['p50'], '.0f')} / {fmt(c['ttft_ms']['p99'], '.0f')}",
                f"{fmt(c['tpot_ms']['p50'], '.1f')} / {fmt(c['tpot_ms']['p99'], '.1f')}",
                fmt(c["itl_ms"]["p99"], ".1f"), fmt(c["e2e_ms"]["p99"], ".0f"),
                fmt(c.get("goodput"), ".2f"), fmt(s.get("peak_running"), ".0f"),
                fmt(s.get("memory_efficiency_at_peak"), ".1%"), fmt(s.get("retractions"), ".0f"),
                fmt(s.get("prefix_hit_rate"), ".1%"),
                f"{fmt(g.get('idle_fraction'), '.1%')} ({fmt(g.get('gap_ms_p50'), '.3f')})"])
    lines = ["## Every workload", "", "Times in ms unless marked; `(cut)`: the deadline "
             "ended it, throughput then counts every token received in the window.", ""]
    return lines + _table(header, rows) + [""]


def _failures(res: dict) -> list[str]:
    lines = []
    for mode, e in res["modes"].items():
        texts = [("server", e["error"])] if e.get("error") else []
        texts += [(name, rep.get("error") or rep["skipped"]) for name, rep in e["cells"].items()
                  if rep.get("error") or rep.get("skipped", "").startswith("error")]
        for name, text in texts:
            tail = [ln[:300] for ln in text.strip().splitlines()[-25:]]
            lines += [f"`{mode}` / {name}:", "", "```", *tail, "```", ""]
    return ["## Failures", ""] + lines if lines else []


def _notes(res: dict) -> list[str]:
    return ["## Method and caveats", "",
            "- Client metrics as `vllm bench serve` defines them (`bench/serving/metrics.py`); "
            "one ITL per SSE chunk; token counts per chunk from chosen-token logprobs.",
            "- Random-weight `dummy:` model, `ignore_eos`: every mode does the same work; the "
            "tokens themselves mean nothing.",
            "- Sluice never OOMs by design: contiguous waits for a free region, token and "
            "paged modes retract (recompute) under pressure. The seeds' 'OOM' is read as the "
            "concurrency a mode cannot hold at once (peak running < clients).",
            "- Sluice has no CPU offload; the seeds' 150-concurrency 'paged + CPU offload' row "
            "is compared with plain paged.",
            "- `contiguous` reserves prompt + max_tokens per request (`--reserve request`), the "
            "generous form of the original approach; `--reserve max` (whole context) is worse.",
            "- GPU idle = gaps between consecutive steps on the device (CUDA events, "
            "`SLUICE_STEP_TIMING`) / wall time of the steps; it includes waiting for requests.",
            ""]


def write_markdown(path: Path, res: dict) -> None:
    lines = (_header(res) + _seeds_table(res) + _claims(res) + _stars(res)
             + _fragmentation(res) + _all_cells(res) + _failures(res) + _notes(res))
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    src = Path(sys.argv[1])
    write_markdown(src.with_suffix(".md"), json.loads(src.read_text()))
    print(src.with_suffix(".md").read_text())
