"""Multi-LoRA against the base model, in one command: offline throughput with N adapters
mixed in every batch, and the decode step time.

- `offline` (each row in a fresh process): `Engine.generate` of `bench.offline`'s workload
  (64 prompts x 512 random ids, 128 output tokens, greedy, ignore_eos); rows: `base` (no
  `--lora-paths`), `lora-none` (the N adapters loaded, every request on the base model),
  `lora-mixed` (request i on adapter i % N, all N resident: `--max-loras N`).
- `steps` (one process): decode step time through `ModelRunner.forward` (CUDA graph replay)
  at each batch size with every row on an adapter (round robin) against no row on one.

The adapters are random rank-R PEFT folders targeting every projection (q/k/v/o, gate/up/
down), written for the model's shapes under a temporary folder.

    python -m bench.offline.lora [--model dummy:llama3-8b] [--dtype bfloat16] [--adapters 8]
                                 [--rank 16] [--batches 1,64] [--tiny] [--out bench/results/lora]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from bench.outputs import write_outputs

ROOT = Path(__file__).resolve().parents[2]
ROWS = ("base", "lora-none", "lora-mixed")


def write_adapters(model: str, folder: Path, count: int, rank: int) -> list[str]:
    """`count` random rank-`rank` adapters of every projection of `model`: "name=path"s."""
    from runtime.model_config import resolve_model
    from runtime.worker.lora.adapter import LORA_MODULES

    c = resolve_model(model).hf_config()
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    q, kv = c.num_attention_heads * head_dim, c.num_key_value_heads * head_dim
    shapes = {"q_proj": (q, c.hidden_size), "k_proj": (kv, c.hidden_size),
              "v_proj": (kv, c.hidden_size), "o_proj": (c.hidden_size, q),
              "gate_proj": (c.intermediate_size, c.hidden_size),
              "up_proj": (c.intermediate_size, c.hidden_size),
              "down_proj": (c.hidden_size, c.intermediate_size)}  # (out, in)
    paths = []
    for i in range(count):
        gen = torch.Generator().manual_seed(i)
        tensors = {}
        for layer in range(c.num_hidden_layers):
            for module in LORA_MODULES:
                out, inp = shapes[module]
                part = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
                name = f"base_model.model.model.layers.{layer}.{part}.{module}"
                tensors[f"{name}.lora_A.weight"] = 0.02 * torch.randn(rank, inp, generator=gen)
                tensors[f"{name}.lora_B.weight"] = 0.02 * torch.randn(out, rank, generator=gen)
        path = folder / f"adapter{i}"
        path.mkdir(parents=True)
        save_file({k: v.to(torch.bfloat16) for k, v in tensors.items()},
                  str(path / "adapter_model.safetensors"))
        (path / "adapter_config.json").write_text(json.dumps(
            {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
             "target_modules": list(LORA_MODULES)}))
        paths.append(f"adapter{i}={path}")
    return paths


def part_offline(preset_json: str, row: str, lora_paths: list[str]) -> dict:
    """Offline throughput of one row (see the module docstring), the median of the runs."""
    from bench.offline.parts import Preset, device_info, prompts
    from runtime import Engine, SamplingParams

    p = Preset(**{**json.loads(preset_json), "step_batches": ()})
    n = len(lora_paths)
    lora = {} if row == "base" else dict(lora_paths=tuple(lora_paths), max_loras=n)
    with Engine(model=p.model, dtype=p.dtype, chunk_size=p.chunk_size, kv_slots=p.kv_slots,
                max_running=max(p.batch, 64), torch_threads=p.torch_threads, seed=p.seed,
                log_level="warning", **lora) as eng:
        walls = []
        for run in range(-1, p.repeats):  # run -1: the warm-up
            batch = prompts(p, run + 1)
            names = [f"adapter{i % n}" if row == "lora-mixed" else None
                     for i in range(len(batch))]
            params = [SamplingParams(max_tokens=p.output_len, temperature=0.0, ignore_eos=True,
                                     lora=a) for a in names]
            t0 = time.perf_counter()
            outs = eng.generate(batch, params)
            if run >= 0:
                walls.append(time.perf_counter() - t0)
            assert sum(len(o.token_ids) for o in outs) == len(batch) * p.output_len
    wall = sorted(walls)[len(walls) // 2]
    tokens = p.batch * p.output_len
    return {"row": row, "wall_s": wall, "tok_s": tokens / wall,
            "all_tok_s": [tokens / w for w in walls], **device_info()}


def part_steps(model: str, dtype: str, lora_paths: list[str], batches: list[int], ctx: int,
               iters: int) -> dict:
    """Decode step time with every row on an adapter against none (CUDA graphs on a GPU)."""
    import numpy as np

    from bench.offline.parts import decode_batch, time_ms
    from runtime.model_config import resolve_model
    from runtime.worker.lora.batch import LoraBatch, lora_segments
    from runtime.worker.lora.manager import LoraOptions
    from runtime.worker.model_runner import ModelRunner

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    n, top = len(lora_paths), max(batches)
    options = LoraOptions(dict(e.split("=", 1) for e in lora_paths), n, 64)
    runner = ModelRunner(resolve_model(model), device, getattr(torch, dtype),
                         kv_slots=top * ctx, max_rows=top, lora=options)
    runner.lora.load_slots(list(enumerate(options.adapters)))
    rows = []
    for b in batches:
        plain = decode_batch(b, ctx, runner.vocab_size, device)
        mixed = decode_batch(b, ctx, runner.vocab_size, device)
        order, indptr, longest = lora_segments([i % n for i in range(b)], np.ones(b, int), n)
        mixed.lora = LoraBatch(torch.from_numpy(order).to(device),
                               torch.from_numpy(indptr).to(device), indptr.tolist(), longest)
        none_ms = time_ms(lambda fb=plain: runner.forward(fb), iters)
        mixed_ms = time_ms(lambda fb=mixed: runner.forward(fb), iters)
        rows.append({"batch": b, "context": ctx, "none_ms": none_ms, "mixed_ms": mixed_ms,
                     "ratio": mixed_ms / none_ms})
    return {"steps": rows, "graphs": runner.graphs is not None}


def run_child(args: list[str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "bench.offline.lora", *args, "--part-out", str(out)]
        try:
            rc = subprocess.run(cmd, cwd=ROOT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        return json.loads(out.read_text()) if rc == 0 and out.exists() else {
            "error": f"exit code {rc}"}


def markdown(res: dict) -> str:
    lines = [f"# Multi-LoRA: {res['adapters']} adapters of rank {res['rank']} on "
             f"{res['model']} {res['dtype']}", "", f"Command: `{res['command']}`  ",
             f"Device: {res['device']}, {res['date']}", "",
             "| row | offline output tok/s | / base | runs |", "|---|---|---|---|"]
    base = res["offline"]["base"].get("tok_s")
    for row in ROWS:
        r = res["offline"][row]
        if "error" in r:
            lines.append(f"| {row} | - | - | {r['error']} |")
            continue
        rel = f"{r['tok_s'] / base:.2f}" if base else "-"
        lines.append(f"| {row} | {r['tok_s']:,.0f} | {rel} | "
                     f"{', '.join(f'{t:,.0f}' for t in r['all_tok_s'])} |")
    steps = res.get("steps", {})
    if "error" in steps:
        lines += ["", f"steps: {steps['error']}"]
    elif steps:
        lines += ["", f"Decode step (CUDA graphs: {steps['graphs']}):", "",
                  "| batch | context | no adapter ms | mixed adapters ms | ratio |",
                  "|---|---|---|---|---|"]
        lines += [f"| {s['batch']} | {s['context']} | {s['none_ms']:.3f} | {s['mixed_ms']:.3f}"
                  f" | {s['ratio']:.2f} |" for s in steps["steps"]]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="dummy:llama3-8b")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--batches", default="1,64", help="decode batch sizes timed")
    ap.add_argument("--context", type=int, default=576, help="positions per decode sequence")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--tiny", action="store_true", help="dummy:tiny fp32 smoke run (CPU too)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "lora"))
    ap.add_argument("--part", help=argparse.SUPPRESS)  # internal: one part, in a child
    ap.add_argument("--part-out", help=argparse.SUPPRESS)
    ap.add_argument("--lora-paths", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--preset-json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tiny:
        args.model, args.dtype, args.batches, args.context, args.iters, args.rank = (
            "dummy:tiny", "float32", "1,4", 40, 3, 4)
    if args.part:
        res = (part_steps(args.model, args.dtype, args.lora_paths,
                          [int(b) for b in args.batches.split(",")], args.context, args.iters)
               if args.part == "steps" else
               part_offline(args.preset_json, args.part, args.lora_paths))
        Path(args.part_out).write_text(json.dumps(res))
        return
    from bench.offline.parts import PRESETS

    preset = replace(PRESETS["tiny" if args.tiny else "full"], model=args.model,
                     dtype=args.dtype)
    res = {"model": args.model, "dtype": args.dtype, "adapters": args.adapters,
           "rank": args.rank, "command": "python -m bench.offline.lora " + " ".join(sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "config": asdict(preset),
           "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_adapters(args.model, Path(tmp), args.adapters, args.rank)
        common = ["--model", args.model, "--dtype", args.dtype, "--lora-paths", *paths]
        res["offline"] = {row: run_child(["--part", row, "--preset-json",
                                          json.dumps(asdict(preset)), *common],
                                         preset.timeout_s) for row in ROWS}
        res["steps"] = run_child(["--part", "steps", "--batches", args.batches, "--context",
                                  str(args.context), "--iters", str(args.iters), *common], 600)
    text = markdown(res)
    write_outputs(args.out, res, text)
    print(text)


if __name__ == "__main__":
    main()
