"""The CPU engine on a busy machine: Sluice against HF transformers, with and without
busy-looping processes beside both.

    python -m bench.host.cpu_busy [--busy 0,2] [--batches 1,16] [--new-tokens 64]
                             [--torch-threads 0] [--sluice-threads 0] [--cpus 0,1]
                             [--model smollm2] [--repeats 3] [--out PREFIX]

SmolLM2 (the embedded model; `--model` takes any HF folder both can read), fp32 on the
CPU, greedy, `--new-tokens` per request with EOS ignored. `--cpus` pins the whole
experiment (both engines, all of Sluice's processes, the busy loops) to those CPUs, so a
large machine can stand in for a small one. `--sluice-threads 0,1` runs Sluice once per
`torch_threads` value (0: the engine's default). Each system runs in a fresh process of
its own (HF `generate` with a static batch; Sluice's in-process `Engine`, which starts its
scheduler and worker processes), one after the other, while `--busy` processes spin
(`while True: pass`) for the whole measurement. The table gives output tok/s (median of
`--repeats`) and Sluice/HF in the same condition: the ratio is what to read, since
absolute numbers drift.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "Write a long story about a lighthouse keeper and the sea, with many details."


def _spin() -> None:
    while True:
        pass


def _hf(model: str, batches: list[int], new_tokens: int, repeats: int, threads: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from runtime.model_config import resolve_model

    if threads:
        torch.set_num_threads(threads)
    path = resolve_model(model).path
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = tok(PROMPT, return_tensors="pt").input_ids
    out = {}
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=2)  # warm-up
        for b in batches:
            batch = ids.repeat(b, 1)
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                model.generate(batch, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                               do_sample=False, pad_token_id=2)
                times.append(time.perf_counter() - t)
            out[str(b)] = b * new_tokens / statistics.median(times)
    return out


def _sluice(model: str, batches: list[int], new_tokens: int, repeats: int,
            threads: int) -> dict:
    from runtime.engine import Engine
    from runtime.wire.sampling import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    out = {}
    with Engine(model, device="cpu", dtype="float32", torch_threads=threads) as engine:
        engine.generate([PROMPT], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
        for b in batches:
            times = []
            for r in range(repeats):
                # a distinct first word per run: no run reuses another's prefill
                prompts = [f"{r}.{i} {PROMPT}" for i in range(b)]
                t = time.perf_counter()
                res = engine.generate(prompts, params)
                times.append(time.perf_counter() - t)
                assert all(len(x.token_ids) == new_tokens for x in res)
            out[str(b)] = b * new_tokens / statistics.median(times)
    return out


def _run_part(system: str, threads: int, args: argparse.Namespace) -> dict:
    """Run one system in a fresh interpreter; returns {batch: tok/s}."""
    code = (f"import json, sys; from bench.host.cpu_busy import _{system}; "
            f"print('RESULT', json.dumps(_{system}({args.model!r}, {args.batches!r}, "
            f"{args.new_tokens}, {args.repeats}, {threads})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{system} failed:\n{proc.stderr[-3000:]}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--busy", default="0,2", help="busy-looping processes, per condition")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--torch-threads", type=int, default=0, help="HF's torch threads; 0: default")
    ap.add_argument("--sluice-threads", default="0",
                    help="Sluice's torch_threads, one run per value; 0: the engine's default")
    ap.add_argument("--cpus", default="", help="pin everything to these CPUs, e.g. 0,1")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per part")
    ap.add_argument("--out", default="", help="write PREFIX.json and PREFIX.md")
    args = ap.parse_args(argv)
    args.batches = [int(x) for x in args.batches.split(",")]
    variants = [int(x) for x in args.sluice_threads.split(",")]
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    rows = []
    for busy in [int(x) for x in args.busy.split(",")]:
        spinners = [mp.Process(target=_spin, daemon=True) for _ in range(busy)]
        for p in spinners:
            p.start()
        try:
            hf_res = _run_part("hf", args.torch_threads, args)
            sl_res = {t: _run_part("sluice", t, args) for t in variants}
        finally:
            for p in spinners:
                p.kill()
        for t, res in sl_res.items():
            for b in args.batches:
                hf, sl = hf_res[str(b)], res[str(b)]
                rows.append({"busy": busy, "batch": b, "sluice_threads": t, "hf_tok_s": hf,
                             "sluice_tok_s": sl, "ratio": sl / hf})
                print(f"busy={busy} batch={b} sluice_threads={t}: HF {hf:.1f} tok/s, "
                      f"Sluice {sl:.1f} tok/s, ratio {sl / hf:.2f}", flush=True)
    meta = {"command": "python -m bench.host.cpu_busy " + " ".join(sys.argv[1:]),
            "date": datetime.date.today().isoformat(), "cpus": len(os.sched_getaffinity(0)),
            "model": args.model, "machine": platform.processor() or platform.machine(),
            "new_tokens": args.new_tokens, "repeats": args.repeats,
            "torch_threads": args.torch_threads}
    if args.out:
        Path(args.out + ".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        lines = [f"# CPU engine on a busy machine ({meta['date']}, {meta['cpus']} CPUs)", "",
                 f"`{meta['command']}`", "",
                 "| busy processes | batch | Sluice torch_threads | HF tok/s | Sluice tok/s "
                 "| Sluice / HF |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['busy']} | {r['batch']} | {r['sluice_threads'] or 'default'} | "
                  f"{r['hf_tok_s']:.1f} | {r['sluice_tok_s']:.1f} | {r['ratio']:.2f} |"
                  for r in rows]
        Path(args.out + ".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
