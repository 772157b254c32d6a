"""Speculative decoding: acceptance length and output tokens/s, with and without it.

    python -m bench.speculative [--algorithm ngram|draft] [--model smollm2]
                                [--batches 1,4,16,64] [--max-tokens 96]
                                [--draft-tokens 4] [--out PREFIX]

The edit workload (`workload.py`) on real SmolLM2-135M weights, greedy, in one process
(scheduler and worker stepped as the server steps them). Per batch size it runs the
requests plainly, then with the n-gram drafter (`--speculative-algorithm ngram`), then
with the oracle drafter, which replays the plain run's outputs (every draft accepted,
nothing spent proposing: the verify step's own efficiency). Each speculative run is
checked to give the plain run's tokens. Results go to PREFIX.json / PREFIX.md.
`--algorithm draft` runs the draft-model rows instead (`draft_rows.py`).
"""

from __future__ import annotations

import argparse
import datetime
import platform

import torch
from transformers import AutoTokenizer

from bench.outputs import write_outputs
from bench.speculative import draft_rows
from bench.speculative.generate import generate
from bench.speculative.workload import edit_prompts
from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.worker.worker import Worker

OUT = "bench/results/speculative/{date}-ngram-smollm2-cpu"


def run(args) -> dict:
    cfg = ServerConfig(model=args.model, device="cpu", max_running=max(args.batches),
                       speculative_num_draft_tokens=args.draft_tokens, log_level="warning")
    spec = resolve_model(cfg.model)
    tokenizer = AutoTokenizer.from_pretrained(str(spec.tokenizer_path))
    worker = Worker(cfg, spec)
    generate(worker, cfg, edit_prompts(tokenizer, 2), 8)  # warm-up
    rows = []
    for batch in args.batches:
        prompts = edit_prompts(tokenizer, batch)
        plain = generate(worker, cfg, prompts, args.max_tokens)
        ngram = generate(worker, cfg.replace(speculative_algorithm="ngram"), prompts,
                         args.max_tokens)
        oracle = generate(worker, cfg, prompts, args.max_tokens, plain["outputs"])
        tokens = sum(map(len, plain["outputs"]))
        row = {"batch": batch, "output_tokens": tokens,
               "prompt_tokens": sum(map(len, prompts))}
        for name, r in (("plain", plain), ("ngram", ngram), ("oracle", oracle)):
            assert r["outputs"] == plain["outputs"], f"{name} changed the greedy output"
            row[name] = {"wall_s": round(r["wall_s"], 3), "steps": r["steps"],
                         "out_tok_per_s": round(tokens / r["wall_s"], 1),
                         "speedup": round(plain["wall_s"] / r["wall_s"], 3),
                         "accept_length": r["accept_length"] and round(r["accept_length"], 3),
                         "drafted": r["drafted"], "accepted": r["accepted"]}
        rows.append(row)
        print(row, flush=True)
    return {"model": args.model, "draft_tokens": args.draft_tokens,
            "max_tokens": args.max_tokens, "ngram": [cfg.speculative_ngram_min,
                                                     cfg.speculative_ngram_max],
            "torch_threads": torch.get_num_threads(), "rows": rows}


def report(res: dict, command: str, date: str) -> str:
    b1 = next((r for r in res["rows"] if r["batch"] == 1), res["rows"][0])
    lines = [
        f"# Speculative decoding: n-gram and oracle drafters, {res['model']} on the CPU",
        "",
        "Question: How many tokens does a verify step yield, and how much faster is decoding "
        "with n-gram (prompt lookup) speculation on an edit workload that repeats its input, "
        "by batch size?",
        f"Answer: at batch {b1['batch']}, n-gram speculation yields "
        f"{b1['ngram']['accept_length']} tokens per verify step and runs "
        f"{b1['ngram']['speedup']}x the plain tokens/s; the oracle drafter (every draft "
        f"accepted) {b1['oracle']['speedup']}x; outputs are token-identical. "
        "CPU, loaded (2 cores shared with other jobs): ratios, not absolute speeds.",
        "",
        f"`{command}`, {date}; CPU ({platform.machine()}), torch {torch.__version__}, "
        f"{res['torch_threads']} threads.",
        "",
        f"Greedy, up to {res['max_tokens']} output tokens, {res['draft_tokens']} draft tokens "
        f"per verify step, n-gram lengths {res['ngram'][0]}..{res['ngram'][1]}. Wall time "
        "covers prefill and decode; steps: scheduler steps (prefill chunks included). Accept "
        "length: tokens per verify step (accepted drafts + 1).",
        "",
        "| batch | out tokens | plain tok/s | steps | ngram tok/s | speedup | steps "
        "| accept len | oracle tok/s | speedup | steps | accept len |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
        p, n, o = r["plain"], r["ngram"], r["oracle"]
        lines.append(f"| {r['batch']} | {r['output_tokens']} | {p['out_tok_per_s']} | "
                     f"{p['steps']} | {n['out_tok_per_s']} | {n['speedup']}x | {n['steps']} | "
                     f"{n['accept_length']} | {o['out_tok_per_s']} | {o['speedup']}x | "
                     f"{o['steps']} | {o['accept_length']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--algorithm", choices=("ngram", "draft"), default="ngram")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    now = datetime.datetime.now(datetime.timezone.utc)
    rows = draft_rows if args.algorithm == "draft" else None
    res = rows.run(args) if rows else run(args)
    command = (f"python -m bench.speculative --algorithm {args.algorithm} --batches "
               + ",".join(map(str, args.batches))
               + f" --max-tokens {args.max_tokens} --draft-tokens {args.draft_tokens}")
    res.update(command=command, date=now.isoformat(timespec="seconds"), device="cpu")
    when = now.strftime("%Y-%m-%d %H:%M:%S +0000")
    text = rows.report(res, command, when) if rows else report(res, command, when)
    out = (rows.OUT if rows else OUT).format(date=now.strftime("%Y-%m-%d"))
    write_outputs(args.out or out, res, text)
    print(text)


if __name__ == "__main__":
    main()
