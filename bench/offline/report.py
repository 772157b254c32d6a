"""Tables of `bench.offline`: printed, and written as `<prefix>.json` and `<prefix>.md`."""

from __future__ import annotations

import json
from pathlib import Path

THROUGHPUT_TARGET = 0.80  # of the bandwidth roofline
STEP_TARGET = 1.25  # x the bandwidth floor
IDLE_TARGET_PCT = 5.0  # of the step time, with overlap

SYSTEMS = [("sluice_overlap", "Sluice (overlap)"), ("sluice_no_overlap", "Sluice (no overlap)"),
           ("hf_static", "HF static `generate`"),
           ("hf_batch", "HF `generate_batch` (incl. its warm-up)")]


def _f(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(r) + " |" for r in rows)]


def throughput(meta: dict, results: dict) -> list[str]:
    c, roof, roof2 = meta["config"], meta["roofline_tok_s"], meta["roofline_with_prefill_tok_s"]
    weights = " fp8 weights" if c.get("quantization") == "fp8" else ""
    lines = [f"## Offline throughput: {c['model']} {c['dtype']}{weights}, batch {c['batch']}, "
             f"{c['input_len']} in / {c['output_len']} out (ignore EOS)", ""]
    hf = results.get("hf_static", {}).get("tok_s")
    rows = []
    for key, label in SYSTEMS:
        r = results.get(key)
        if r is None:
            continue
        if "error" in r:
            rows.append([label, "-", "-", "-", "-", "-", r["error"]])
            continue
        note = ""
        if key.startswith("sluice"):
            note = (f"median of {len(r['all_tok_s'])} runs "
                    f"({', '.join(_f(t, 0) for t in r['all_tok_s'])}); engine start "
                    f"{r['engine_start_s']:.0f} s; {r['steps_per_run'][0]} steps per run")
        elif key == "hf_static" and r.get("peak_gib"):
            note = f"peak {r['peak_gib']:.1f} GiB"
        elif key == "hf_batch":
            note = f"block size {r['block_size']}, {r['tokens']} tokens"
        rows.append([label, _f(r["wall_s"]), _f(r["tok_s"], 0), _f(100 * r["tok_s"] / roof, 1),
                     _f(100 * r["tok_s"] / roof2, 1), _f(r["tok_s"] / hf, 2) + "x" if hf else "-",
                     note])
    lines += _table(["system", "wall s", "output tok/s", "% of roofline",
                     "% of roofline w/ prefill", "vs HF static", "notes"], rows)
    lines += ["", f"Roofline: {roof:,.0f} output tok/s: every decode step at its bandwidth "
                  f"floor (weights + KV of {c['input_len'] + 1}..{c['input_len'] + c['output_len']}"
                  f" positions per sequence, / {meta['bandwidth_tb_s']} TB/s), prefill free. "
                  f"Counting the prefill at its compute floor ({meta['compute_tflop_s']:.0f} "
                  f"TFLOP/s) too: {meta['roofline_with_prefill_tok_s']:,.0f} tok/s, which "
                  "bounds any engine on this workload."]
    r = results.get("sluice_overlap", {})
    if "tok_s" in r:
        ok = r["tok_s"] >= THROUGHPUT_TARGET * roof
        lines.append(f"Target: Sluice (overlap) >= {THROUGHPUT_TARGET:.0%} of the roofline "
                     f"({THROUGHPUT_TARGET * roof:,.0f} tok/s): **{_verdict(ok)}** "
                     f"({100 * r['tok_s'] / roof:.1f}%).")
    return lines


def steps(meta: dict, result: dict) -> list[str]:
    lines = ["## Decode step vs the bandwidth floor (in-process ModelRunner)", ""]
    if "error" in result:
        return lines + [f"error: {result['error']}"]
    rows = [[str(r["batch"]), str(r["context"]), _f(r["graph_ms"], 3), _f(r["eager_ms"], 3),
             _f(r["floor_ms"], 3), _f(r["weights_gb"]), _f(r["kv_gb"]), _f(r["x_floor"]),
             _f(r["tb_s"]), _verdict(r["x_floor"] <= STEP_TARGET)] for r in result["rows"]]
    lines += _table(["batch", "context", "graph ms", "eager ms", "floor ms", "weights GB",
                     "KV GB", "x floor", "TB/s", f"<= {STEP_TARGET}x"], rows)
    return lines + ["", "Timed: `ModelRunner.forward` of one decode step (inputs copied into "
                        "the CUDA graph's buffers, replay, fp32 logits), median over "
                        f"{meta['config']['step_iters']} CUDA-event-timed runs; x floor uses the "
                        "graph time (eager when no graph). The engine adds sampling and the "
                        "token table per step."]


def idle(results: dict, batch: int) -> list[str]:
    lines = ["## Device idle between consecutive decode steps (engine, SLUICE_STEP_TIMING)", ""]
    rows = []
    for key, label in SYSTEMS[:2]:
        r = results.get(key)
        if r is None:
            continue
        s = r.get("idle", {})
        if "error" in r or not s.get("pairs"):
            rows.append([label] + ["-"] * 8 + [r.get("error", "no decode->decode pairs")])
            continue
        ok = s["idle_pct"] < IDLE_TARGET_PCT
        rows.append([label, str(s["pairs"]), _f(s["median_step_ms"], 3),
                     _f(s["median_gap_ms"], 3), _f(s["mean_gap_ms"], 3), _f(s["p90_gap_ms"], 3),
                     _f(s["max_gap_ms"], 3), _f(s["idle_pct"]),
                     _verdict(ok) if key == "sluice_overlap" else "(reference)"])
    lines += _table(["mode", "pairs", "median step ms", "median gap ms", "mean gap ms",
                     "p90 gap ms", "max gap ms", "idle % (sum gap / sum step)",
                     f"< {IDLE_TARGET_PCT:g}%"], rows)
    lines += ["", "Gap = a decode step's first mark on the compute stream minus the previous "
                  "decode step's last (CUDA events the worker records as it starts and ends "
                  "enqueueing a step); step = last minus first mark, token table and sampling "
                  "included. Device idle *inside* a step (the host enqueueing slower than the "
                  "device runs) counts as step time, not gap: compare the step with the bare "
                  "forward below."]
    on = results.get("sluice_overlap", {}).get("idle", {})
    bare = {r["batch"]: r for r in results.get("steps", {}).get("rows", [])}.get(batch)
    if on.get("pairs") and bare and bare["graph_ms"]:
        lines.append(f"Engine decode step (overlap, median) {on['median_step_ms']:.3f} ms vs "
                     f"`ModelRunner.forward` alone at batch {batch}, context {bare['context']}: "
                     f"{bare['graph_ms']:.3f} ms.")
    return lines


def write_report(prefix: Path, meta: dict, results: dict, only: list[str]) -> None:
    lines = ["# Sluice offline benchmark", "",
             f"`{meta['command']}`, {meta['date']}, commit {meta['commit']}; {meta['device']}; "
             f"torch {meta['torch']}, "
             f"triton {meta['triton']}, transformers {meta['transformers']}.", "",
             f"Weights: {meta['weights_note']}", ""]
    if meta["device"] == "cpu":
        lines += ["CPU smoke run: the rooflines and targets below are the H200's, meaningless "
                  "here.", ""]
    if "sluice" in only or {"hf_static", "hf_batch"} & set(only):
        lines += throughput(meta, results) + [""]
    if "steps" in results:
        lines += steps(meta, results["steps"]) + [""]
    if "idle" in only or "sluice" in only:
        lines += idle(results, meta["config"]["batch"]) + [""]
    text = "\n".join(lines)
    print("\n" + text)
    md, js = Path(f"{prefix}.md"), Path(f"{prefix}.json")
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(text + "\n")
    js.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(f"wrote {js} and {md}")
