"""Tensor-parallel scaling: the same model and workloads at `--tp 1, 2, 4, ...` on one host.

For each TP size that fits the visible GPUs:
- `offline`: `Engine.generate` of `--batch` prompts of `--input-len` random ids, `--output-len`
  tokens each (greedy, ignore_eos), after a warm-up; output tok/s = tokens / wall (median of
  `--repeats`), the workload of `bench.offline`.
- `serving`: `sluice serve --tp N`, then `bench.serving`'s streaming client sends `--requests`
  requests (input and output lengths drawn from the given ranges) at `--concurrency` at once;
  output tok/s, TTFT and TPOT as `vllm bench serve` defines them.
Scaling = tok/s at TP N / tok/s at TP 1. Writes `<out>.json` and `<out>.md`.

    python -m bench.serving.tp_scaling [--tp 1,2] [--model dummy:llama-7b] [--out PREFIX]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import random
import tempfile
import time
from pathlib import Path

import torch

from bench.outputs import write_outputs
from bench.serving.data import random_requests
from bench.serving.driver import run_load


def offline(args, tp: int) -> dict:
    from runtime import Engine, SamplingParams

    rng = random.Random(0)
    vocab = 32000 if args.model.startswith("dummy:llama") else 1024

    def batch():
        return [[rng.randrange(3, vocab) for _ in range(args.input_len)]
                for _ in range(args.batch)]

    t0 = time.perf_counter()
    with Engine(model=args.model, dtype=args.dtype, tp=tp, max_running=args.batch,
                log_level="warning") as eng:
        start_s = time.perf_counter() - t0
        eng.generate(batch()[:8], SamplingParams(max_tokens=16, ignore_eos=True))
        params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
        walls = []
        for _ in range(args.repeats):
            prompts = batch()  # fresh ids: no prefix-cache hits
            t0 = time.perf_counter()
            outs = eng.generate(prompts, params)
            walls.append(time.perf_counter() - t0)
            assert sum(len(o.token_ids) for o in outs) == args.batch * args.output_len
    wall = sorted(walls)[len(walls) // 2]
    return {"start_s": start_s, "wall_s": wall, "tok_s": args.batch * args.output_len / wall}


def serving(args, tp: int, work: Path) -> dict:
    from bench.serving.server_proc import SluiceServer

    server = SluiceServer(["--model", args.model, "--dtype", args.dtype, "--tp", str(tp),
                           "--max-running", str(args.concurrency), "--log-level", "warning"],
                          work / f"server-tp{tp}.log")
    server.start(timeout=600)
    try:
        vocab = 32000 if args.model.startswith("dummy:llama") else 1024
        warm = random_requests(8, (16, 32), (8, 8), vocab, seed=1)
        asyncio.run(run_load(server.url, args.model, warm, concurrency=8, progress=False))
        specs = random_requests(args.requests, (args.input_len // 2, args.input_len),
                                (args.output_len // 2, args.output_len), vocab, seed=0)
        run = asyncio.run(run_load(server.url, args.model, specs, concurrency=args.concurrency,
                                   label=f"tp{tp}"))
        c = run.report()["client"]
    finally:
        server.stop()
    return {k: c[k] for k in ("completed", "failed", "duration_s", "output_throughput",
                              "request_throughput", "ttft_ms", "tpot_ms", "itl_ms")}


def markdown(res: dict) -> str:
    a = res["args"]
    lines = [f"# Tensor-parallel scaling, {a['model']} {a['dtype']}", "",
             f"Command: `{res['command']}`  ", f"Device: {res['device']}; {res['date']}", "",
             f"Offline: {a['batch']} prompts x {a['input_len']} tokens -> {a['output_len']} "
             f"tokens. Serving: {a['requests']} requests, input {a['input_len'] // 2}-"
             f"{a['input_len']}, output {a['output_len'] // 2}-{a['output_len']}, "
             f"{a['concurrency']} at once.", "",
             "| TP | offline tok/s | scaling | serving out tok/s | scaling | TTFT p50/p99 ms "
             "| TPOT p50/p99 ms |", "|---|---|---|---|---|---|---|"]
    base = res["rows"][0]
    for r in res["rows"]:
        off = r.get("offline", {}).get("tok_s", 0)
        srv = r.get("serving", {})
        out = srv.get("output_throughput", 0)
        ttft, tpot = srv.get("ttft_ms", {}), srv.get("tpot_ms", {})
        off_x = off / base.get("offline", {}).get("tok_s", 1)
        srv_x = out / base.get("serving", {}).get("output_throughput", 1)
        lines.append(f"| {r['tp']} | {off:.0f} | {off_x:.2f}x | {out:.0f} | {srv_x:.2f}x | "
                     f"{ttft.get('p50', 0):.0f} / {ttft.get('p99', 0):.0f} | "
                     f"{tpot.get('p50', 0):.1f} / {tpot.get('p99', 0):.1f} |")
    errors = [f"- TP {r['tp']} {k}: {v}" for r in res["rows"] for k, v in r.items()
              if k.endswith("error")]
    return "\n".join(lines + ([""] + errors if errors else [])) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", default="1,2,4")
    ap.add_argument("--model", default="dummy:llama-7b")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--only", default="offline,serving")
    ap.add_argument("--out", default=f"bench/results/{datetime.date.today()}-tp-h200")
    args = ap.parse_args()
    gpus = torch.cuda.device_count()
    sizes = [t for t in (int(x) for x in args.tp.split(",")) if t <= max(gpus, 1)]
    work = Path(tempfile.mkdtemp(prefix="sluice-tp-"))
    res = {"args": vars(args), "device": f"{gpus} x {torch.cuda.get_device_name()}" if gpus
           else "cpu", "date": str(datetime.date.today()), "rows": [],
           "command": "python -m bench.serving.tp_scaling --tp " + ",".join(map(str, sizes))
           + f" --model {args.model} --dtype {args.dtype}"}
    for tp in sizes:
        row = {"tp": tp}
        for part, fn in (("offline", lambda tp=tp: offline(args, tp)),
                         ("serving", lambda tp=tp: serving(args, tp, work))):
            if part in args.only:
                try:
                    row[part] = fn()
                except Exception as exc:  # record it, go on with the next size
                    row[f"{part}_error"] = f"{type(exc).__name__}: {exc}"[:500]
                print(f"tp {tp} {part}: {row.get(part) or row.get(part + '_error')}", flush=True)
        res["rows"].append(row)
        write_outputs(args.out, res, markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
