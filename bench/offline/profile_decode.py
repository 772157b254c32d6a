"""Where a decode step's time goes: per-kernel device time against the bandwidth floor.

Builds a `ModelRunner` (as `bench.offline`'s `steps` part does), then for each batch size
profiles the decode forward with the torch profiler (CUDA activity), replaying the CUDA graph
and running eagerly, and groups the kernels: matmuls, attention, the small fused ops, and
torch's glue. For the matmuls it reports the bandwidth they reach on the weights they read,
so a step's excess over the floor splits into "GEMMs below copy bandwidth" and "time in
kernels that move almost nothing" (latency: one launch each, dozens per layer).

With programmatic dependent launch on (sm_90, `kernels.pdl`; `SLUICE_PDL=0` turns it off) a
kernel starts before its predecessor ends and waits inside, so its profiled time includes
that wait and the kernel times add up to more than the step: read them with PDL off
(`bench.offline.step_ablation` measures what each group costs the step with PDL on).

    python -m bench.offline.profile_decode [--model dummy:llama-7b] [--batches 1,64]
                                   [--context 576] [--dtype float16] [--quantization fp8]
                                   [--out bench/results/<date>-decode-profile-h200]
"""

from __future__ import annotations

import argparse
import datetime
import re

import torch
from torch.profiler import ProfilerActivity, profile

from bench.offline.parts import decode_batch, time_ms
from bench.outputs import write_outputs
from bench.roofline import BANDWIDTH, ModelBytes
from kernels.pdl import pdl_args
from runtime.model_config import resolve_model
from runtime.worker.model_runner import ModelRunner

# first match wins: kernel name pattern -> group
GROUPS = (
    ("attention", re.compile(r"decode_attention|extend_attention")),
    ("rope+store_kv", re.compile(r"rope_store_kv")),
    ("store_kv", re.compile(r"store_kv")),
    ("rmsnorm", re.compile(r"rmsnorm")),
    ("rope", re.compile(r"rope")),
    ("silu_mul", re.compile(r"silu")),
    ("fp8_quant", re.compile(r"per_token_fp8")),
    ("matmul", re.compile(r"skinny|gemm|gemv|cutlass|xmma|nvjet|sm90|sm80|cublas", re.I)),
)
STEPS = 20  # profiled steps per mode


def group_of(name: str) -> str:
    return next((g for g, pat in GROUPS if pat.search(name)), "torch glue")


def profile_steps(fn) -> list[dict]:
    """Per-kernel device microseconds per step, over STEPS calls of `fn`."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            fn()
        torch.cuda.synchronize()
    rows = []
    for evt in prof.key_averages():
        us = evt.device_time_total / STEPS
        if us > 0:
            rows.append({"kernel": evt.key[:90], "group": group_of(evt.key),
                         "us_per_step": us, "calls_per_step": evt.count / STEPS})
    return sorted(rows, key=lambda r: -r["us_per_step"])


def summarize(rows: list[dict], weights: int) -> dict:
    groups: dict[str, dict] = {}
    for r in rows:
        g = groups.setdefault(r["group"], {"us": 0.0, "calls": 0.0})
        g["us"] += r["us_per_step"]
        g["calls"] += r["calls_per_step"]
    busy = sum(g["us"] for g in groups.values())
    mm = groups.get("matmul", {"us": 0.0})["us"]
    return {"groups": groups, "busy_us": busy, "kernels_per_step": sum(
        g["calls"] for g in groups.values()),
        "matmul_tb_s": weights / (mm * 1e-6) / 1e12 if mm else None}


def run(model: str, batches: list[int], ctx: int, dtype: str = "float16",
        quantization: str = "none") -> dict:
    device = torch.device("cuda")
    runner = ModelRunner(resolve_model(model), device, getattr(torch, dtype),
                         kv_slots=max(batches) * ctx, max_rows=max(batches), seed=0,
                         cuda_graph=True, quantization=quantization)
    for cache in runner.kv_pool.k + runner.kv_pool.v:
        cache.normal_()
    sizes = ModelBytes.of(model, getattr(torch, dtype), quantization)
    out = []
    for b in batches:
        fb = decode_batch(b, ctx, runner.vocab_size, device)
        weights, kv = sizes.step(b, ctx)
        entry = {"batch": b, "context": ctx, "floor_us": (weights + kv) / BANDWIDTH * 1e6,
                 "weights_gb": weights / 1e9, "kv_gb": kv / 1e9}
        graphs = runner.graphs
        for mode in ("graph", "eager"):
            runner.graphs = graphs if mode == "graph" else None
            step_us = time_ms(lambda fb=fb: runner.forward(fb), 50) * 1e3
            rows = profile_steps(lambda fb=fb: runner.forward(fb))
            entry[mode] = {"step_us": step_us, **summarize(rows, weights), "top": rows[:12]}
        runner.graphs = graphs
        out.append(entry)
    return {"model": model, "dtype": dtype, "quantization": quantization, "rows": out,
            "device": torch.cuda.get_device_name(), "torch": torch.__version__}


def markdown(res: dict, command: str) -> str:
    weights = " fp8 weights" if res["quantization"] == "fp8" else ""
    pdl = "on" if torch.cuda.is_available() and pdl_args(torch.device("cuda"))["PDL"] else "off"
    lines = [f"# Decode step profile, {res['model']} {res['dtype']}{weights}", "",
             f"Command: `{command}`  ", f"Device: {res['device']}, torch {res['torch']}, "
             f"{datetime.date.today()}; programmatic dependent launch {pdl} (kernel times "
             "include PDL waits when on)", ""]
    for e in res["rows"]:
        lines += [f"## Batch {e['batch']}, context {e['context']}: floor {e['floor_us']:.0f} us "
                  f"({e['weights_gb']:.2f} GB weights + {e['kv_gb']:.3f} GB KV at 4.26 TB/s)", "",
                  "| mode | step us | x floor | kernel busy us | kernels/step | matmul TB/s |",
                  "|---|---|---|---|---|---|"]
        for mode in ("graph", "eager"):
            m = e[mode]
            lines.append(f"| {mode} | {m['step_us']:.0f} | {m['step_us'] / e['floor_us']:.2f} | "
                         f"{m['busy_us']:.0f} | {m['kernels_per_step']:.0f} | "
                         f"{m['matmul_tb_s'] or 0:.2f} |")
        lines += ["", "| group (graph replay) | us/step | calls/step | share of step |",
                  "|---|---|---|---|"]
        g = e["graph"]
        for name, v in sorted(g["groups"].items(), key=lambda kv: -kv[1]["us"]):
            lines.append(f"| {name} | {v['us']:.0f} | {v['calls']:.0f} | "
                         f"{100 * v['us'] / g['step_us']:.1f}% |")
        lines += ["", "| top kernels (graph replay) | group | us/step | calls/step |",
                  "|---|---|---|---|"]
        lines += [f"| `{r['kernel']}` | {r['group']} | {r['us_per_step']:.1f} | "
                  f"{r['calls_per_step']:.0f} |" for r in g["top"]]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="dummy:llama-7b")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--context", type=int, default=576, help="positions per sequence")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--quantization", default="none", choices=("none", "fp8"))
    ap.add_argument("--out", default=f"bench/results/{datetime.date.today()}-decode-profile-h200")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench.offline.profile_decode needs a CUDA device")
    res = run(args.model, [int(b) for b in args.batches.split(",")], args.context, args.dtype,
              args.quantization)
    command = "python -m bench.offline.profile_decode " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items() if k != "out")
    text = markdown(res, command)
    write_outputs(args.out, res, text)
    print(text)


if __name__ == "__main__":
    main()
