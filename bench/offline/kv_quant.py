"""Quantized KV cache (`--kv-dtype fp8|fp8_e4m3|int8`): bytes per token and accuracy against
`auto`.

One model, the same prompts, one `ModelRunner` per kv dtype that differ in nothing else
(same weights, same compute dtype); each prompt is prefilled in two chunks, then decoded
greedily for `--tokens` tokens (`tests.worker.batching.greedy`). Reported per kv dtype:

- bytes per token of the pool: K and V over all layers, plus one float32 scale per
  (token, kv head) for each when quantized (fp8_e4m3: none, one scale of 1 for the whole
  tensor); and the ratio to a 16-bit pool.
- logit error: the quantized runner is teacher-forced on the reference's greedy tokens, so
  every position (the prefill's last token and each decode step) sees the same input; the
  max |logit - reference| over all of them, also relative to the reference's max |logit|.
- top-1 agreement: share of those teacher-forced positions whose argmax is the reference's.
- greedy agreement: free-running greedy decoding; per prompt, the tokens before the first
  divergence from the reference, over `--tokens` (1.0: identical outputs).

Defaults: on the CPU, SmolLM2 in float32 (torch attention); on a GPU, `dummy:tiny` in
float16 (Triton kernels, CUDA-graph decode). Random weights give flat logits (top-2 margins
of a few hundredths, fp16 ties), where any error flips argmaxes: a dummy's greedy agreement
says little, its logit error and top-1 agreement are the signal.

    python -m bench.offline.kv_quant [--model M] [--device cpu|cuda] [--dtype float16]
                             [--tokens 256] [--out bench/results/<date>-kv-quant-<device>]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from bench.offline.driver import git_commit
from bench.offline.parts import device_info
from runtime.model_config import ModelSpec, resolve_model
from runtime.worker.kv_pool import KV_STORAGE, kv_bytes_per_token, kv_dtype_scaled
from runtime.worker.model_runner import ModelRunner
from tests.worker.batching import greedy

TEXT_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "clockmaker who had never once left the valley. One morning",
]
RANDOM_PROMPT_LENS = (7, 33, 100)  # models without a tokenizer get random ids
QUANT_KV = ("fp8", "fp8_e4m3", "int8")
ROWS = 8  # >= 2 x prompts, and a CUDA graph size: GPU decode steps replay graphs
# name -> element dtype: two unquantized pools, then the quantized kv dtypes
STORAGE = {"float32": torch.float32, "16-bit": torch.float16, **KV_STORAGE}


def make_prompts(spec: ModelSpec, vocab: int, seed: int = 0) -> list[list[int]]:
    """The text prompts through the model's tokenizer, or seeded random ids for a dummy."""
    if spec.tokenizer_path is not None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(spec.tokenizer_path)
        return [tok(p)["input_ids"] for p in TEXT_PROMPTS]
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in RANDOM_PROMPT_LENS]


def bytes_per_token(spec: ModelSpec) -> dict[str, int]:
    """Pool bytes per token of each storage dtype (scales included for fp8/int8)."""
    cfg = spec.hf_config()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return {name: kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, head_dim,
                                     dtype, scaled=kv_dtype_scaled(name))
            for name, dtype in STORAGE.items()}


def first_divergence(got: list[int], want: list[int]) -> int:
    """Index of the first differing token; len(want) when none differs."""
    return next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))


def compare(runner: ModelRunner, prompts: list[list[int]], ref_tokens: list[list[int]],
            ref_logits: torch.Tensor, tokens: int) -> dict:
    """Free-running and teacher-forced sequences of `runner` in one batch, against the
    reference run's tokens `[P][N]` and logits `[P, N, V]`."""
    n = len(prompts)
    out_tokens, logits = greedy(runner, prompts + prompts, tokens, [None] * n + ref_tokens)
    err = (logits[n:] - ref_logits).abs()  # [P, N, V], teacher-forced
    top1 = (logits[n:].argmax(-1) == ref_logits.argmax(-1)).float().mean().item()
    firsts = [first_divergence(got, want) for got, want in zip(out_tokens[:n], ref_tokens)]
    return {
        "max_abs_logit_err": err.max().item(),
        "mean_abs_logit_err": err.mean().item(),
        "rel_logit_err": err.max().item() / ref_logits.abs().max().item(),
        "top1_agreement": top1,
        "first_divergence": firsts,
        "greedy_agreement": sum(firsts) / (tokens * n),
    }


def run(model: str, device: str, dtype: torch.dtype, tokens: int) -> dict:
    spec = resolve_model(model)
    prompts = make_prompts(spec, spec.hf_config().vocab_size)
    n = len(prompts)
    slots = 2 * n * (max(map(len, prompts)) + tokens) + 1  # greedy's slot layout
    ref_runner = ModelRunner(spec, device, dtype, kv_slots=slots, max_rows=ROWS)
    t0 = time.monotonic()
    # every prompt twice, so the reference batches have the shapes of `compare`'s
    ref_tokens, ref_logits = greedy(ref_runner, prompts + prompts, tokens)
    ref_tokens, ref_logits = ref_tokens[:n], ref_logits[:n].clone()  # [P][N], [P, N, V]
    seconds = {"auto": time.monotonic() - t0}
    del ref_runner
    sizes = bytes_per_token(spec)
    results = []
    for kv_dtype in QUANT_KV:
        runner = ModelRunner(spec, device, dtype, kv_slots=slots, max_rows=ROWS,
                             kv_dtype=kv_dtype)
        t0 = time.monotonic()
        row = compare(runner, prompts, ref_tokens, ref_logits, tokens)
        seconds[kv_dtype] = time.monotonic() - t0
        results.append({"kv_dtype": kv_dtype, "bytes_per_token": runner.kv_bytes_per_token,
                        "vs_16bit": runner.kv_bytes_per_token / sizes["16-bit"], **row})
        del runner
    return {"model": model, "dtype": str(dtype).removeprefix("torch."), "tokens": tokens,
            "prompt_lens": [len(p) for p in prompts], "bytes_per_token": sizes,
            "seconds": seconds, "results": results}


def markdown(meta: dict, report: dict) -> str:
    sizes = report["bytes_per_token"]
    lines = [
        f"# KV cache quantization: {report['model']} ({report['dtype']} compute)", "",
        f"`{meta['command']}`, {meta['date']}, commit {meta['commit']}; {meta['device']}; "
        f"torch {meta['torch']}, triton {meta['triton']}.", "",
        f"Prompts of {report['prompt_lens']} tokens, each prefilled in two chunks, then "
        f"{report['tokens']} greedy tokens. Reference: the same runner with `--kv-dtype auto` "
        f"({report['dtype']} KV). Logit error and top-1 agreement are teacher-forced on the "
        "reference tokens; greedy agreement is tokens before the first divergence / tokens.",
        "", "| KV storage | bytes/token | vs 16-bit |", "|---|---:|---:|",
    ]
    lines += [f"| {name} | {b} | {b / sizes['16-bit']:.3f} |" for name, b in sizes.items()]
    lines += ["", "| kv dtype | max abs logit err | / max abs logit | mean abs err | top-1 agree "
              "| first divergence | greedy agreement |", "|---|---:|---:|---:|---:|---|---:|"]
    for r in report["results"]:
        lines.append(
            f"| {r['kv_dtype']} | {r['max_abs_logit_err']:.4f} | {r['rel_logit_err']:.4f} | "
            f"{r['mean_abs_logit_err']:.5f} | {r['top1_agreement']:.4f} | "
            f"{r['first_divergence']} | {r['greedy_agreement']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", help="default: smollm2 on the CPU, dummy:tiny on a GPU")
    parser.add_argument("--dtype", help="compute dtype; default float32 (CPU), float16 (GPU)")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--out", help="output prefix (default bench/results/<date>-kv-quant-"
                                      "<device>)")
    args = parser.parse_args()
    on_gpu = args.device == "cuda"
    model = args.model or ("dummy:tiny" if on_gpu else "smollm2")
    dtype = getattr(torch, args.dtype or ("float16" if on_gpu else "float32"))
    report = run(model, args.device, dtype, args.tokens)
    info = device_info()
    meta = {"command": " ".join(["python -m bench.offline.kv_quant", *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "commit": git_commit(),
            "device": info["device"] if on_gpu else "cpu", "torch": info["torch"],
            "triton": info["triton"], "torch_threads": torch.get_num_threads()}
    prefix = Path(args.out or f"bench/results/{time.strftime('%Y-%m-%d')}-kv-quant-"
                              f"{'gpu' if on_gpu else 'cpu'}")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    md = markdown(meta, report)
    Path(f"{prefix}.md").write_text(md)
    Path(f"{prefix}.json").write_text(json.dumps({"meta": meta, **report}, indent=2) + "\n")
    print(md)


if __name__ == "__main__":
    main()
