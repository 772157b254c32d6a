"""`python -m bench.speculative --algorithm draft`: the cost of drafting with a model.

Two rows on a random-weight target (`--model`, a `dummy:` preset, default
`dummy:spec-target`; prompts of random token ids), each run plainly and with
`--speculative-algorithm draft`, greedy, outputs checked identical:

(iii) the target drafting for itself: every draft is accepted, so a verify step yields
      k + 1 tokens and the ratio to plain decoding is the mechanism's overhead (ideal
      1.0x: k draft steps cost nothing and the verify step costs one decode step).
(iv)  a small draft (`--draft-model`, default `dummy:spec-draft`, ~8% of `dummy:spec-target`):
      what a real draft's forwards cost per verify step. Random weights cannot show an
      acceptance rate (two unrelated random models agree on almost no token), only the
      cost; the break-even column is the tokens a verify step must yield to match plain
      decoding at that cost (its time over a plain step's).

The rule that turns a failing request's speculation off is disabled here.
"""

from __future__ import annotations

import platform

import torch

from bench.speculative.generate import generate, time_steps
from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.worker.worker import Worker

TARGET, SMALL_DRAFT = "dummy:spec-target", "dummy:spec-draft"
PROMPT_LEN = 32
MEM_FRACTION = 0.2  # of free GPU memory for each worker's KV: three workers share one GPU


def random_prompts(n: int, vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (PROMPT_LEN,), generator=gen).tolist() for _ in range(n)]


def _params(model: str) -> int:
    """Parameters of a `dummy:` preset, counted from its config."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        cfg = resolve_model(model).hf_config()
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())


def _entry(r: dict, tokens: int, plain: dict | None) -> dict:
    entry = {"wall_s": round(r["wall_s"], 3), "steps": r["steps"],
             "out_tok_per_s": round(tokens / r["wall_s"], 2),
             "ms_per_step": round(1e3 * r["wall_s"] / r["steps"], 1),
             "accept_length": r["accept_length"] and round(r["accept_length"], 3),
             "drafted": r["drafted"], "accepted": r["accepted"],
             "idle_pct": r["idle"] and round(100 * r["idle"], 1)}
    if plain is not None:
        entry["speedup"] = round(plain["wall_s"] / r["wall_s"], 3)
        entry["break_even"] = round(entry["ms_per_step"] / plain["ms_per_step"], 2)
    return entry


def base_config(args) -> ServerConfig:
    """The plain run's config; a speculative row's replaces its algorithm fields."""
    return ServerConfig(model=args.model, device=args.device, max_running=max(args.batches),
                        mem_fraction=MEM_FRACTION,
                        speculative_num_draft_tokens=args.draft_tokens,
                        speculative_off_window=0, log_level="warning")


def measure(args, base: ServerConfig, variants: list[tuple[str, str, ServerConfig]],
            ) -> list[dict]:
    """Rows of each (row name, drafter label, config) of `variants` at every batch size:
    the plain run and the speculative one, greedy, on random prompts."""
    spec = resolve_model(args.model)
    time_steps()
    plain_worker = Worker(base, spec)
    vocab = plain_worker.runner.vocab_size
    rows = []
    for name, draft, cfg in variants:
        worker = Worker(cfg, spec)
        for w, c in ((plain_worker, base), (worker, cfg)):  # warm-up
            generate(w, c, random_prompts(2, vocab), 4)
        for batch in args.batches:
            prompts = random_prompts(batch, vocab)
            plain = generate(plain_worker, base, prompts, args.max_tokens)
            drafted = generate(worker, cfg, prompts, args.max_tokens)
            same = drafted["outputs"] == plain["outputs"]  # see __main__: 16-bit GPU near-ties
            tokens = sum(map(len, plain["outputs"]))
            p = _entry(plain, tokens, None)
            row = {"row": name, "draft": draft, "batch": batch, "output_tokens": tokens,
                   "plain": p, "draft_model": _entry(drafted, tokens, p),
                   "identical": same}
            rows.append(row)
            print(row, flush=True)
    return rows


def run(args) -> dict:
    base = base_config(args)
    target_params = _params(args.model)
    share = _params(args.draft_model) / target_params
    small = f"iv: {share:.0%} draft"
    rows = measure(args, base, [
        (name, draft, base.replace(speculative_algorithm="draft", speculative_draft_model=draft))
        for name, draft in (("iii: draft = target", args.model), (small, args.draft_model))])
    return {"model": args.model, "draft_model": args.draft_model,
            "draft_share": round(share, 3), "params_b": round(target_params / 1e9, 3),
            "draft_tokens": args.draft_tokens, "max_tokens": args.max_tokens,
            "prompt_len": PROMPT_LEN, "torch_threads": torch.get_num_threads(), "rows": rows}


def report(res: dict, command: str, date: str) -> str:
    by = {(r["row"][:3].rstrip(":"), r["batch"]): r["draft_model"] for r in res["rows"]}
    b = min(r["batch"] for r in res["rows"])
    self_row, small = by.get(("iii", b), {}), by.get(("iv", b), {})
    lines = [
        f"# Speculative decoding with a draft model: its cost on {res['device']}",
        "",
        "Question: What does drafting with a model cost per verify step, with the target "
        "drafting for itself (every draft accepted) and with a small draft model?",
        f"Answer: at batch {b}, the target drafting for itself yields "
        f"{self_row.get('accept_length')} tokens per verify step and runs "
        f"{self_row.get('speedup')}x plain decoding's tokens/s (ideal 1.0x); with the "
        f"{res['draft_share']:.0%} draft a verify step costs {small.get('break_even')} "
        "plain steps, the tokens it "
        "must yield to break even (random weights: no acceptance to measure). "
        + outputs_and_run(res, command, date),
        "",
        f"Target `{res['model']}` ({res['params_b']}B parameters, random weights), draft "
        f"`{res['draft_model']}` ({res['draft_share']:.0%} of it), prompts of "
        f"{res['prompt_len']} random ids, greedy, up to {res['max_tokens']} output tokens, "
        f"{res['draft_tokens']} draft tokens per verify step. Wall time covers prefill and "
        "decode; ms/step: wall time over scheduler steps. A verify step runs k draft decode "
        "steps (the first also writes the draft KV a fully accepted step left out) and the "
        "target's forward over k + 1 positions. "
        "Idle: the device's idle share between steps (step timing events; host clock on "
        "the CPU).",
        "",
    ]
    return "\n".join(lines + table(res["rows"]))


def outputs_and_run(res: dict, command: str, date: str) -> str:
    """The end of a report's answer (whether outputs are plain decoding's, what a CPU
    figure means), a blank line and the line saying how and where it ran."""
    identical = ("token-identical. " if all(r["identical"] for r in res["rows"]) else
                 "NOT all token-identical (16-bit near-ties part on a GPU). ")
    cpu = ("CPU, loaded (2 cores shared with other jobs): ratios, not absolute speeds."
           if res["device"] == "cpu" else "")
    return (f"Outputs are {identical}{cpu}\n\n`{command}`, {date}; {res['device']} "
            f"({platform.machine()}), torch {torch.__version__}, {res['torch_threads']} "
            "threads.")


def table(rows: list[dict]) -> list[str]:
    """The markdown table of `measure`'s rows."""
    lines = [
        "| row | batch | out tokens | plain tok/s | plain ms/step | plain idle % | draft tok/s "
        "| speedup | ms/step | idle % | accept len | break-even len |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        p, d = r["plain"], r["draft_model"]
        lines.append(f"| {r['row']} (`{r['draft']}`) | {r['batch']} | {r['output_tokens']} | "
                     f"{p['out_tok_per_s']} | {p['ms_per_step']} | {p['idle_pct']} | "
                     f"{d['out_tok_per_s']} | {d['speedup']}x | {d['ms_per_step']} | "
                     f"{d['idle_pct']} | {d['accept_length']} | "
                     f"{d['break_even']} |")
    return lines
