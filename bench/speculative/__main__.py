"""Speculative decoding: acceptance length and output tokens/s, with and without it.

    python -m bench.speculative [--algorithm ngram|draft|eagle|mtp] [--model smollm2]
                                [--draft-model M] [--device cpu|cuda]
                                [--batches 1,4,16,64] [--max-tokens 96]
                                [--draft-tokens 4] [--out PREFIX]

The edit workload (`workload.py`) on real SmolLM2-135M weights, greedy, in one process
(scheduler and worker stepped as the server steps them). Per batch size it runs the
requests plainly, then with the n-gram drafter (`--speculative-algorithm ngram`: on the
device with overlap, its verify steps chained, and on the host without, `ngram_host`), then
with the oracle drafter, which replays the plain run's outputs (every draft accepted,
nothing spent proposing: the verify step's own efficiency), on the host and on the device
(`oracle_dev`, whose verify steps chain behind the step in flight). Each speculative run is
checked to give the plain run's tokens. A `dummy:` model (random weights, no tokenizer)
gets prompts of random ids and only the plain and oracle rows: the verify step's cost at
that shape. Results go to PREFIX.json / PREFIX.md.
`--algorithm draft` runs the draft-model rows instead (`draft_rows.py`), `--algorithm
eagle|mtp` the rows of a head over the target's hidden states (`head_rows.py`).
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import torch
from transformers import AutoTokenizer

from bench.outputs import write_outputs
from bench.serving.server_proc import device_name
from bench.speculative import draft_rows, head_rows
from bench.speculative.draft_rows import MEM_FRACTION, random_prompts
from bench.speculative.generate import generate, time_steps
from bench.speculative.workload import edit_prompts
from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.worker.worker import Worker

OUT = "bench/results/speculative/{date}-{algorithm}-{model}-{device}"
ROWS = {"draft": draft_rows, "eagle": head_rows, "mtp": head_rows}  # rows of their own


def run(args) -> dict:
    cfg = ServerConfig(model=args.model, device=args.device, max_running=max(args.batches),
                       mem_fraction=MEM_FRACTION,
                       speculative_num_draft_tokens=args.draft_tokens, log_level="warning")
    spec = resolve_model(cfg.model)
    time_steps()
    # the worker of a speculating server (its decode graphs hold verify steps; with
    # overlap n-gram lookup drafts in it, `NgramOnDevice`), serving the plain runs too
    worker = Worker(cfg.replace(speculative_algorithm="ngram"), spec)
    if spec.tokenizer_path is None:  # random weights: the verify step's cost only
        def make_prompts(n):
            return random_prompts(n, worker.runner.vocab_size)
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(spec.tokenizer_path))

        def make_prompts(n):
            return edit_prompts(tokenizer, n)
    warm = make_prompts(2)  # warm-up: plain and verify steps (their kernels compile here)
    generate(worker, cfg, warm, 8, generate(worker, cfg, warm, 8)["outputs"])
    rows = []
    for batch in args.batches:
        prompts = make_prompts(batch)
        runs = {"plain": generate(worker, cfg, prompts, args.max_tokens)}
        plain = runs["plain"]
        if spec.tokenizer_path is not None:
            ngram = cfg.replace(speculative_algorithm="ngram")
            runs["ngram"] = generate(worker, ngram, prompts, args.max_tokens)
            runs["ngram_host"] = generate(worker, ngram.replace(overlap=False), prompts,
                                          args.max_tokens)
        runs["oracle"] = generate(worker, cfg, prompts, args.max_tokens, plain["outputs"])
        runs["oracle_dev"] = generate(worker, cfg, prompts, args.max_tokens, plain["outputs"],
                                      on_device=True)
        tokens = sum(map(len, plain["outputs"]))
        row = {"batch": batch, "output_tokens": tokens,
               "prompt_tokens": sum(map(len, prompts))}
        for name, r in runs.items():
            # on a GPU a verify step's numerics differ from a decode step's (other kernels,
            # other batch shapes), so 16-bit near-ties may part: counted, not asserted
            row[f"{name}_identical"] = r["outputs"] == plain["outputs"]
            row[name] = {"wall_s": round(r["wall_s"], 3), "steps": r["steps"],
                         "out_tok_per_s": round(tokens / r["wall_s"], 1),
                         "speedup": round(plain["wall_s"] / r["wall_s"], 3),
                         "accept_length": r["accept_length"] and round(r["accept_length"], 3),
                         "drafted": r["drafted"], "accepted": r["accepted"],
                         "idle_pct": r["idle"] and round(100 * r["idle"], 1)}
        rows.append(row)
        print(row, flush=True)
    return {"model": args.model, "draft_tokens": args.draft_tokens,
            "max_tokens": args.max_tokens, "ngram": [cfg.speculative_ngram_min,
                                                     cfg.speculative_ngram_max],
            "torch_threads": torch.get_num_threads(), "rows": rows}


def report(res: dict, command: str, date: str) -> str:
    b1 = next((r for r in res["rows"] if r["batch"] == 1), res["rows"][0])
    names = [n for n in ("ngram", "ngram_host", "oracle", "oracle_dev") if n in b1]
    said = [f"{n} {b1[n]['accept_length']} tokens per verify step, {b1[n]['speedup']}x the "
            "plain tokens/s" for n in names]
    where = ("CPU, loaded (2 cores shared with other jobs): ratios, not absolute speeds."
             if res["device"] == "cpu" else f"On {res['device']}.")
    lines = [
        f"# Speculative decoding: {' and '.join(names)} drafters, {res['model']} on "
        f"{res['device']}",
        "",
        "Question: How many tokens does a verify step yield, and how much faster is decoding "
        "with speculation (n-gram prompt lookup on an edit workload that repeats its input, "
        "on the device with overlap (chained) and on the host without (`ngram_host`); "
        "an oracle drafter that is always right, on the host (each verify step waits for "
        "the previous result) and on the device (`oracle_dev`: chained behind the step in "
        "flight, as a draft model or EAGLE head is)), by batch size?",
        f"Answer: at batch {b1['batch']}: " + "; ".join(said) + ". Outputs "
        + ("token-identical" if all(r.get(f"{n}_identical", True) for r in res["rows"]
                                    for n in names) else "NOT all token-identical (below)")
        + f". {where}",
        "",
        f"`{command}`, {date}; {res['device']}, torch {torch.__version__}, "
        f"{res['torch_threads']} threads.",
        "",
        f"Greedy, up to {res['max_tokens']} output tokens, {res['draft_tokens']} draft tokens "
        f"per verify step, n-gram lengths {res['ngram'][0]}..{res['ngram'][1]}. Wall time "
        "covers prefill and decode; steps: scheduler steps (prefill chunks included). Accept "
        "length: tokens per verify step (accepted drafts + 1). Idle: the device's idle share "
        "between steps (step timing events; host clock on the CPU). A `dummy:` model has "
        "random "
        "weights and prompts of random ids: only the oracle row means anything there.",
        "",
        "| batch | out tokens | plain tok/s | steps | idle % | "
        + " | ".join(f"{n} tok/s | speedup | steps | accept len | idle % | same tokens"
                     for n in names) + " |",
        "|---:|---:|---:|---:|---:|" + "---:|---:|---:|---:|---:|---|" * len(names),
    ]
    for r in res["rows"]:
        p = r["plain"]
        cells = [f"{r[n]['out_tok_per_s']} | {r[n]['speedup']}x | {r[n]['steps']} | "
                 f"{r[n]['accept_length']} | {r[n]['idle_pct']} | "
                 f"{'yes' if r.get(f'{n}_identical', True) else 'no'}" for n in names]
        lines.append(f"| {r['batch']} | {r['output_tokens']} | {p['out_tok_per_s']} | "
                     f"{p['steps']} | {p['idle_pct']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="",
                    help="target (default: smollm2; with --algorithm draft or eagle "
                         "dummy:spec-target; --algorithm mtp needs a checkpoint with an MTP "
                         "layer)")
    ap.add_argument("--draft-model", default="",
                    help="the small draft of --algorithm draft (default dummy:spec-draft); "
                         "the EAGLE head folder of --algorithm eagle (default: a random head "
                         "of the target's shape)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--algorithm", choices=("ngram", *ROWS), default="ngram")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    rows = ROWS.get(args.algorithm)
    if args.algorithm == "mtp" and not args.model:
        ap.error("--algorithm mtp needs --model: a checkpoint with an MTP layer")
    args.model = args.model or (draft_rows.TARGET if rows else "smollm2")
    if args.algorithm == "draft":
        args.draft_model = args.draft_model or draft_rows.SMALL_DRAFT
    now = datetime.datetime.now(datetime.timezone.utc)
    device = "cpu" if args.device == "cpu" else device_name()
    res = rows.run(args) if rows else run(args)
    command = (f"python -m bench.speculative --algorithm {args.algorithm} --model {args.model}"
               + (f" --draft-model {args.draft_model}" if args.draft_model else "")
               + f" --device {args.device} --batches " + ",".join(map(str, args.batches))
               + f" --max-tokens {args.max_tokens} --draft-tokens {args.draft_tokens}")
    res.update(command=command, date=now.isoformat(timespec="seconds"), device=device)
    when = now.strftime("%Y-%m-%d %H:%M:%S +0000")
    text = rows.report(res, command, when) if rows else report(res, command, when)
    slug = Path(args.model.removeprefix("dummy:")).name
    out = OUT.format(date=now.strftime("%Y-%m-%d"), algorithm=args.algorithm, model=slug,
                     device=device.split(",")[0].split()[-1].lower())
    write_outputs(args.out or out, res, text)
    print(text)


if __name__ == "__main__":
    main()
