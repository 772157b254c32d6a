"""Steps per second with and without the overlap scheduler, whole engine, one workload.

    python -m bench.offline.overlap [--model smollm2] [--requests 32] [--max-tokens 64]
                                    [--out PREFIX]

Decode-heavy: `requests` short prompts, `max_tokens` outputs each (ignore EOS), greedy.
Runs the same workload with `overlap=True` and `overlap=False` and reports scheduler steps
per second and output tokens per second. Results go to PREFIX.json / PREFIX.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import torch

from runtime import Engine, SamplingParams


def run(model: str, overlap: bool, requests: int, max_tokens: int, extra: dict) -> dict:
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 1000, (16,), generator=g).tolist() for _ in range(requests)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    with Engine(model=model, overlap=overlap, **extra) as eng:
        eng.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
        steps0 = eng.stats().num_steps
        t0 = time.perf_counter()
        outs = eng.generate(prompts, params)
        wall = time.perf_counter() - t0
        steps = eng.stats().num_steps - steps0
    tokens = sum(len(o.token_ids) for o in outs)
    return dict(overlap=overlap, steps=steps, wall_s=round(wall, 3),
                steps_per_s=round(steps / wall, 2), out_tok_per_s=round(tokens / wall, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--torch-threads", type=int, default=0)
    ap.add_argument("--out", default=None, help="write PREFIX.json and PREFIX.md")
    args = ap.parse_args()
    extra = {"torch_threads": args.torch_threads} if args.torch_threads else {}
    rows = [run(args.model, ov, args.requests, args.max_tokens, extra) for ov in (True, False)]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor()
    meta = dict(command=" ".join(["python -m bench.offline.overlap", *sys.argv[1:]]),
                model=args.model,
                device=device or "cpu", date=datetime.date.today().isoformat(),
                requests=args.requests, max_tokens=args.max_tokens)
    gain = rows[0]["steps_per_s"] / rows[1]["steps_per_s"] - 1
    lines = [f"# Overlap on vs off ({meta['device']}, {meta['date']})", "",
             f"`{meta['command']}`: {args.requests} requests x {args.max_tokens} tokens, "
             f"model {args.model}", "", "| overlap | steps | wall s | steps/s | out tok/s |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['overlap']} | {r['steps']} | {r['wall_s']} | {r['steps_per_s']} | "
              f"{r['out_tok_per_s']} |" for r in rows]
    lines += ["", f"overlap changes steps/s by {gain:+.1%}"]
    print("\n".join(lines))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out + ".json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=2))
        Path(args.out + ".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
