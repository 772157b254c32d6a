"""Real weights: Sluice against HF transformers on SmolLM2-135M-Instruct, greedy and perplexity.

- `greedy`: 50 prompts (`bench.offline.real_text`), `--max-tokens` new tokens each, in
  float32 and bfloat16. Sluice's greedy tokens against HF's on the same weights and dtype:
  how many prompts match token for token, and for the others the first position where they
  part and HF's gap between its top two logits there (a near-tie explains a parting; a
  wide gap is a bug).
- `ppl`: the perplexity of a fixed text (at least `--ppl-tokens` tokens) in windows of
  `--window` tokens, for bf16 and every reduced-precision option (`--kv-dtype fp8`,
  `fp8_e4m3`, `int8`, `--quantization fp8`), beside HF bf16. Windows prefill in chunks of
  `--chunk` tokens, so every chunk after the first reads the earlier ones back through the
  (quantized) KV pool, as decoding does.

    python -m bench.offline.real_weights [--part greedy,ppl] [--device auto] [--tiny]
                                         [--out bench/results/real-weights/DATE-smollm2-DEV]

`--tiny` shrinks everything to a CPU smoke run (a few prompts, a short text).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch

from bench.offline.real_text import fixed_text, prompts
from bench.outputs import write_outputs
from bench.serving.server_proc import device_name, git_rev
from runtime import Engine, SamplingParams
from runtime.model_config import resolve_model

MODEL = "smollm2"
PPL_VARIANTS = {  # name -> Engine options beside dtype bfloat16
    "bf16": {}, "kv-fp8": {"kv_dtype": "fp8"}, "kv-fp8_e4m3": {"kv_dtype": "fp8_e4m3"},
    "kv-int8": {"kv_dtype": "int8"}, "weights-fp8": {"quantization": "fp8"},
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def hf_model(device: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    path = resolve_model(MODEL).path
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()


@torch.inference_mode()
def hf_greedy(model, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """HF's greedy continuation (`n` tokens, the end-of-sequence token taken like any other,
    as Sluice's `ignore_eos` does) and its top-2 logit gap at each step: a plain forward
    loop over HF's KV cache, no logits processors (`generate(min_new_tokens=n)` would mask
    the end-of-sequence token and pick the runner-up instead)."""
    out = model(torch.tensor([ids], device=model.device), use_cache=True)
    tokens, gaps = [], []
    for _ in range(n):
        top = out.logits[0, -1].float().topk(2)  # values [2], indices [2]
        tokens.append(int(top.indices[0]))
        gaps.append(float(top.values[0] - top.values[1]))
        out = model(torch.tensor([tokens[-1:]], device=model.device),
                    past_key_values=out.past_key_values, use_cache=True)
    return tokens, gaps


def run_greedy(args, tok, device: str) -> list[dict]:
    chat = lambda q: tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                             add_generation_prompt=True)  # noqa: E731
    ids = [tok.encode(p) for p in prompts(chat)][: args.prompts]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    rows = []
    for dtype in args.dtypes.split(","):
        with Engine(model=MODEL, device=device, dtype=dtype) as eng:
            ours = [o.token_ids for o in eng.generate(ids, params)]
        model = hf_model(device, DTYPES[dtype])
        parted = []
        for i, (p, got) in enumerate(zip(ids, ours)):
            want, gaps = hf_greedy(model, p, args.max_tokens)
            at = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
            if at is not None:
                parted.append({"prompt": i, "position": at, "hf_top2_gap": gaps[at]})
        del model
        rows.append({"dtype": dtype, "prompts": len(ids), "tokens": args.max_tokens,
                     "equal": len(ids) - len(parted), "parted": parted})
    return rows


def windows(tok, args) -> list[list[int]]:
    ids = tok.encode(fixed_text(args.ppl_tokens * 6))[: args.ppl_tokens]
    if len(ids) < args.ppl_tokens:
        raise SystemExit(f"the fixed text has {len(ids)} tokens, fewer than {args.ppl_tokens}")
    return [ids[i : i + args.window] for i in range(0, len(ids) - 1, args.window)
            if len(ids[i : i + args.window]) > 1]


def ppl_of(nll: float, count: int) -> float:
    return math.exp(nll / count)


@torch.inference_mode()
def hf_nll(model, wins: list[list[int]]) -> tuple[float, int]:
    nll, count = 0.0, 0
    for w in wins:
        logits = model(torch.tensor([w], device=model.device)).logits[0, :-1].float()
        lp = torch.log_softmax(logits, -1)  # [n - 1, V]
        target = torch.tensor(w[1:], device=lp.device)
        nll -= float(lp.gather(1, target[:, None]).sum())
        count += len(w) - 1
    return nll, count


def run_ppl(args, tok, device: str) -> list[dict]:
    wins = windows(tok, args)
    rows = []
    params = SamplingParams(max_tokens=1, temperature=0.0, logprob_start_len=0)
    for name in args.variants.split(","):
        options = PPL_VARIANTS[name]
        t0 = time.perf_counter()
        with Engine(model=MODEL, device=device, dtype="bfloat16", chunk_size=args.chunk,
                    **options) as eng:
            outs = eng.generate(wins, params)
        lps = [lp for o in outs for lp in o.input_logprobs if lp is not None]
        rows.append({"variant": f"Sluice {name}", "tokens": len(lps),
                     "ppl": ppl_of(-sum(lps), len(lps)), "seconds": time.perf_counter() - t0})
    nll, count = hf_nll(hf_model(device, torch.bfloat16), wins)
    rows.append({"variant": "HF bf16", "tokens": count, "ppl": ppl_of(nll, count)})
    return rows


def markdown(res: dict) -> str:
    m = res["meta"]
    said = [f"{r['dtype']}: {r['equal']} of {r['prompts']} prompts equal HF's greedy tokens "
            f"for {r['tokens']} tokens" for r in res.get("greedy") or []]
    said += [f"{r['variant']} perplexity {r['ppl']:.4f}" for r in res.get("ppl") or []]
    lines = [f"# Real weights: {MODEL} against HF transformers ({m['device']}, {m['date']})", "",
             "Question: Do real weights give HF transformers' greedy tokens, and what do the "
             "reduced-precision options cost in perplexity?",
             f"Answer: {'; '.join(said)}.", "",
             f"Command: `{m['command']}` at {m['tree']}", ""]
    if res.get("greedy"):
        lines += ["## Greedy, token for token", "", "| dtype | prompts x tokens | equal | "
                  "first partings (prompt: position, HF top-2 gap) |", "|---|---|---|---|"]
        for r in res["greedy"]:
            parts = ", ".join(f"{p['prompt']}: {p['position']}, {p['hf_top2_gap']:.3g}"
                              for p in r["parted"]) or "-"
            lines.append(f"| {r['dtype']} | {r['prompts']} x {r['tokens']} | {r['equal']} | "
                         f"{parts} |")
        lines.append("")
    if res.get("ppl"):
        lines += ["## Perplexity of the fixed text", "", "| variant | tokens | perplexity |",
                  "|---|---:|---:|"]
        lines += [f"| {r['variant']} | {r['tokens']} | {r['ppl']:.4f} |" for r in res["ppl"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = {"part": "greedy,ppl", "device": "auto", "dtypes": "float32,bfloat16",
                "prompts": 50, "max-tokens": 64, "ppl-tokens": 20480, "window": 2048,
                "chunk": 256, "variants": ",".join(PPL_VARIANTS)}  # --variants: of PPL_VARIANTS
    for name, value in defaults.items():
        ap.add_argument(f"--{name}", type=type(value), default=value)
    ap.add_argument("--tiny", action="store_true", help="a CPU smoke run")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if args.tiny:
        args.prompts, args.max_tokens, args.ppl_tokens, args.window, args.chunk = 3, 8, 96, 48, 16
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" \
        else args.device
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model(MODEL).path)
    parts = args.part.split(",")
    res = {"meta": {"command": " ".join(["python -m bench.offline.real_weights", *sys.argv[1:]]
                                        if argv is None else ["python -m bench.offline."
                                                              "real_weights", *argv]),
                    "device": device_name() if device == "cuda" else "cpu",
                    "date": time.strftime("%Y-%m-%d"), "tree": git_rev(),
                    "python": sys.version.split()[0], "torch": torch.__version__},
           "greedy": run_greedy(args, tok, device) if "greedy" in parts else [],
           "ppl": run_ppl(args, tok, device) if "ppl" in parts else []}
    text = markdown(res)
    print(text)
    if args.out:
        write_outputs(args.out, res, text)
    return res


if __name__ == "__main__":
    main()
