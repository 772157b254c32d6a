"""An fp8 KV pool against the 16-bit one, offline, in one command: output tok/s and how many
tokens each pool holds.

Each KV dtype runs `bench.offline`'s engine part (`bench.offline.parts.part_engine`: a warm-up
generate, then timed generates, overlap on) in a fresh process, on the same random prompts
(greedy, ignore_eos, fixed lengths: every run does the same work). Defaults: 128 prompts of
2,048 tokens, 256 output tokens each, `dummy:llama-7b-32k` fp16, `--kv-dtype auto` (fp16) vs
`fp8`. Both pools are sized by the worker from the free GPU memory (`mem_fraction` 0.85), so
the fp8 pool (1 byte a value plus a float32 scale per token and KV head: 264 KiB a token
against 512) holds ~1.9x the tokens: all 128 sequences of 2,304 tokens at once, where the
16-bit pool queues or retracts some. `--kv-gib G` sizes both pools to G GiB instead (the CPU
smoke run uses it, where the worker's default would give both the same slot count).

Reported per KV dtype: output tok/s (median of `--repeats` generates), the pool's slots (its
token capacity, from the scheduler), how many full sequences that is, retractions; and the
ratio fp8 / 16-bit. One table, `<out>.json` and `<out>.md`. A KV dtype written `KV:fp8` runs
with fp8 weights too (`--quantization fp8`), e.g. `--kv-dtypes auto,fp8_e4m3,fp8_e4m3:fp8`.

    python -m bench.offline.kv_dtype [--model dummy:llama-7b-32k] [--dtype float16]
        [--batch 128] [--input-len 2048] [--output-len 256] [--kv-dtypes auto,fp8]
        [--kv-gib G] [--repeats 1] [--budget-s 300] [--out bench/results/kv-dtype-offline]
    python -m bench.offline.kv_dtype --model dummy:tiny --dtype float32 --batch 4 \\
        --input-len 64 --output-len 8 --kv-gib 0.004 --out /tmp/kvd   # CPU smoke
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict, replace

from bench.offline.driver import git_commit, run_part
from bench.offline.parts import Preset
from bench.outputs import write_outputs
from bench.probes.gpu_clocks import ClockSampler
from bench.studies.matrix import preset_bytes

GiB = 1 << 30


def phases(log: list[dict]) -> dict:
    """Where a run's device time went, from the worker's per-step log: steps with prefill
    (chunks, maybe with decodes riding along) against pure decode steps, and idle gaps; each
    kind's median and longest step (one long step is a one-off such as a kernel compile, all
    of them long a slower device)."""
    out = {}
    for name, steps in (("prefill", [s for s in log if not s["decode"]]),
                        ("decode", [s for s in log if s["decode"]])):  # fmt: skip
        ms = [s["step_ms"] for s in steps]
        out[f"{name}_steps"] = len(steps)
        out[f"{name}_s"] = sum(ms) / 1e3
        out[f"{name}_mean_batch"] = sum(s["batch_size"] for s in steps) / max(len(steps), 1)
        out[f"{name}_median_ms"] = statistics.median(ms) if ms else 0.0
        out[f"{name}_max_ms"] = max(ms, default=0.0)
        if steps:  # where in the run the longest step fell, and what it carried
            i = ms.index(out[f"{name}_max_ms"])
            out[f"{name}_longest"] = {"step": log.index(steps[i]), "tokens": steps[i]["tokens"],
                                      "batch_size": steps[i]["batch_size"]}
    out["idle_s"] = sum(s["gap_ms"] or 0.0 for s in log) / 1e3
    return out


def summary(res: dict) -> list[list[str]]:
    """The table's rows: one per KV dtype, then the ratio of the last to the first."""
    rows, runs = [], res["runs"]
    seq = res["config"]["input_len"] + res["config"]["output_len"]
    for kd, r in runs.items():
        kvb = res["kv_bytes_per_token"][kd]
        if "error" in r:
            rows.append([kd, f"{kvb:,}", "", "", "", "", r["error"], "", "", "", ""])
            continue
        ph = r["phases"]
        rows.append([kd, f"{kvb:,}", f"{r['kv_slots']:,}", f"{r['kv_slots'] // seq:,}",
                     f"{r['tok_s']:,.0f}", f"{r['retractions']}",
                     ", ".join(f"{t:,.0f}" for t in r["all_tok_s"]),
                     f"{ph['prefill_steps']}: {ph['prefill_s']:.2f} (median "
                     f"{ph['prefill_median_ms']:.0f}, longest {ph['prefill_max_ms']:.0f} ms)",
                     f"{ph['decode_steps']} x {ph['decode_mean_batch']:.0f}: "
                     f"{ph['decode_s']:.2f}", f"{ph['idle_s']:.2f}", clock_cell(r.get("clocks"))])
    if res.get("ratio") is not None:
        (a, ra), (b, rb) = list(runs.items())[0], list(runs.items())[-1]
        kv = res["kv_bytes_per_token"]
        capacity = rb["kv_slots"] / ra["kv_slots"]
        rows.append([f"{b} / {a}", f"{kv[b] / kv[a]:.3f}", f"{capacity:.2f}x", "",
                     f"{res['ratio']:.2f}x", "", "", "", "", "", ""])
    return rows


def clock_cell(clocks: dict | None) -> str:
    """The clock column: busy median MHz (lowest, share at the power cap), or blank."""
    if not clocks or not clocks["busy_samples"]:
        return ""
    return (f"{clocks['busy_sm_mhz_median']:,.0f} ({clocks['busy_sm_mhz_min']:,.0f}, "
            f"{clocks['busy_power_capped']:.0%})")


def markdown(res: dict) -> str:
    c = res["config"]
    header = ["KV dtype", "bytes / token", "pool slots",
              f"sequences of {c['input_len'] + c['output_len']}", "output tok/s", "retractions",
              "runs tok/s", "prefill steps: s (step ms)", "decode steps x batch: s", "idle s",
              "busy SM MHz (min, at power cap)"]
    lines = [f"# KV pool dtype, offline: {c['model']} {c['dtype']}", "",
             f"Command: `{res['command']}` (git {res['commit']})  ",
             f"Device: {res['device']}, {res['date']}", "",
             f"{c['batch']} prompts x {c['input_len']} in / {c['output_len']} out, greedy, "
             f"ignore_eos, overlap on; pool: "
             + (f"{res['kv_gib']} GiB each." if res["kv_gib"] else "the worker's (free GPU "
                "memory x 0.85 less its reserve)."), "",
             "Three columns split the last run's device time (the worker's step log): "
             "steps that carry prefill chunks, pure decode steps (with their mean batch), and "
             "the gaps between steps. The last: the SM clock while the GPU drew 300 W or more "
             "(`bench.probes.gpu_clocks`), its lowest, and the share of those samples held at the "
             "power cap; a compute-bound prefill runs slower at a lower clock.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in summary(res)]
    lines += ["", "Triton kernels compiled during the timed run (a new specialization met "
              "mid-run; each compile stalls a step): " + "; ".join(
                  f"{kd}: " + (", ".join(f"{n} x{c}" for n, c in r["compiled_in_runs"].items())
                               or "none")
                  for kd, r in res["runs"].items() if "compiled_in_runs" in r) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="dummy:llama-7b-32k")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=2048)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--kv-dtypes", default="auto,fp8",
                    help="pools compared, the first the base; KV:fp8 adds fp8 weights")
    ap.add_argument("--kv-gib", type=float, default=0.0,
                    help="size every pool to this many GiB (default 0: the worker's sizing)")
    ap.add_argument("--repeats", type=int, default=1, help="timed generates per KV dtype")
    ap.add_argument("--chunk-size", type=int, default=8192)
    ap.add_argument("--budget-s", type=float, default=300,
                    help="start no KV dtype's run after this many seconds")
    ap.add_argument("--part-timeout", type=int, default=200, help="seconds per KV dtype")
    ap.add_argument("--out", default="bench/results/kv-dtype-offline")
    args = ap.parse_args(argv)
    import torch

    kv_dtypes = args.kv_dtypes.split(",")  # each "KV" or "KV:WEIGHTS"
    kvb = {kd: preset_bytes(args.model, args.dtype, kd.split(":")[0])[1] for kd in kv_dtypes}
    base = Preset(model=args.model, dtype=args.dtype, batch=args.batch, input_len=args.input_len,
                  output_len=args.output_len, chunk_size=args.chunk_size, repeats=args.repeats,
                  warmup_reqs=min(8, args.batch), timeout_s=args.part_timeout,
                  torch_threads=0 if torch.cuda.is_available() else 2)
    deadline = time.monotonic() + args.budget_s
    runs = {}
    for kd in kv_dtypes:
        slots = int(args.kv_gib * GiB) // kvb[kd] if args.kv_gib else 0
        kv, _, weights = kd.partition(":")
        with ClockSampler() as clocks:
            runs[kd] = run_part("sluice_overlap", replace(base, kv_dtype=kv, kv_slots=slots,
                                                          quantization=weights or "none"),
                                deadline)  # fmt: skip
        runs[kd]["clocks"] = clocks.summary
        if "step_log_last_run" in runs[kd]:
            runs[kd]["phases"] = phases(runs[kd].pop("step_log_last_run"))
        runs[kd].pop("idle", None)
    ok = [r for r in runs.values() if "tok_s" in r]
    res = {"command": " ".join(["python -m bench.offline.kv_dtype", *sys.argv[1:]]),
           "commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
           "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
           "config": asdict(base), "kv_gib": args.kv_gib, "kv_bytes_per_token": kvb,
           "runs": runs,
           "ratio": ok[-1]["tok_s"] / ok[0]["tok_s"] if len(ok) == len(runs) > 1 else None}
    text = markdown(res)
    write_outputs(args.out, res, text)
    print(text)


if __name__ == "__main__":
    main()
