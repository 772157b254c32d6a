"""FP8 weights against 16-bit ones on the same model, in one command: decode step time,
offline throughput, and the logit error.

- `compare` (one process, both models resident, the same seeded dummy weights, the fp8 one
  quantized from them at load): decode step time through `ModelRunner.forward` (CUDA graph
  replay) at each batch size, and the logits of a batched prefill of random prompts, every
  position: relative L2 error against the 16-bit logits, max |diff| over the logit range,
  and how often the argmax agrees.
- `offline`: `bench.offline`'s engine part (64 x 512 in / 128 out, overlap on) once per
  weight format, each in a fresh process.

Targets (issue 16, on the H200, `dummy:llama3-8b` bf16): the fp8 batch-1 decode step at most
0.6x the bf16 step; fp8 offline throughput at least 1.3x bf16.

    python -m bench.offline.fp8_weights [--model dummy:llama3-8b] [--dtype bfloat16] [--tiny]
                                [--skip-offline | --skip-compare] [--budget-s 300]
                                [--out bench/results/fp8-weights]

`--skip-compare` runs the offline part alone; `--budget-s` bounds it (a format whose run
would start past it is skipped, each run is cut at what is left).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from bench.outputs import write_outputs

ROOT = Path(__file__).resolve().parents[2]
STEP_TARGET = 0.6  # fp8 / bf16 batch-1 decode step, at most
THROUGHPUT_TARGET = 1.3  # fp8 / bf16 offline tok/s, at least
FORMATS = ("none", "fp8")


def prefill_batch(prompts: list[list[int]], device: torch.device):
    """One prefill of every prompt from position 0, all positions sampled; prompt s takes
    slots 1 + s * L ... (slot 0 is the padding sink)."""
    from runtime.worker.forward_batch import ForwardBatch

    b, n = len(prompts), len(prompts[0])
    i32, i64 = dict(dtype=torch.int32, device=device), dict(dtype=torch.int64, device=device)
    lens = torch.full((b,), n, **i32)  # [B]
    return ForwardBatch(
        input_ids=torch.tensor(prompts, **i64).flatten(),  # [B*n]
        positions=torch.arange(n, **i64).repeat(b),  # [B*n]
        out_slots=torch.arange(1, b * n + 1, **i64),  # [B*n]
        qo_indptr=torch.arange(b + 1, **i32) * n, kv_indptr=torch.arange(b + 1, **i32) * n,
        kv_indices=torch.arange(1, b * n + 1, **i64), seq_lens=lens,
        prefix_lens=torch.zeros(b, **i32), sample_idx=torch.arange(b * n, **i64),
        is_decode=False, seq_lens_cpu=[n] * b, prefix_lens_cpu=[0] * b, extend_lens_cpu=[n] * b)


def logit_error(got: torch.Tensor, want: torch.Tensor) -> dict:
    """got, want `[P, V]` float32: how far the fp8 logits are from the 16-bit ones."""
    rel = (got - want).norm(dim=-1) / want.norm(dim=-1)  # [P]
    span = (want.amax(-1) - want.amin(-1)).mean().item()
    return {"positions": want.shape[0], "rel_l2_mean": rel.mean().item(),
            "rel_l2_max": rel.max().item(), "max_abs": (got - want).abs().max().item(),
            "mean_abs": (got - want).abs().mean().item(), "logit_span_mean": span,
            "top1_agree": (got.argmax(-1) == want.argmax(-1)).float().mean().item()}


def part_compare(model: str, dtype: str, batches: list[int], ctx: int, iters: int) -> dict:
    from bench.offline.parts import decode_batch, time_ms
    from bench.roofline import ModelBytes
    from runtime.model_config import resolve_model
    from runtime.worker.model_runner import ModelRunner

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    spec, dt = resolve_model(model), getattr(torch, dtype)
    top = max(batches)
    runners = {q: ModelRunner(spec, device, dt, kv_slots=top * ctx, max_rows=top, seed=0,
                              quantization=q) for q in FORMATS}
    vocab = runners["none"].vocab_size
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, vocab, (4, min(64, ctx)), generator=gen).tolist()
    logits = {q: r.forward(prefill_batch(prompts, device)).float() for q, r in runners.items()}
    steps = []
    for b in batches:
        row = {"batch": b, "context": ctx}
        for q, r in runners.items():
            fb = decode_batch(b, ctx, vocab, device)
            row[f"{q}_ms"] = time_ms(lambda fb=fb, r=r: r.forward(fb), iters)
            row[f"{q}_floor_ms"] = ModelBytes.of(model, dt, q).floor_ms(b, ctx)
        row["ratio"] = row["fp8_ms"] / row["none_ms"]
        steps.append(row)
    return {"steps": steps, "logits": logit_error(logits["fp8"], logits["none"]),
            "graphs": runners["fp8"].graphs is not None}


def run_child(args: list[str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "bench.offline.fp8_weights", *args, "--part-out", str(out)]
        rc = subprocess.run(cmd, cwd=ROOT, timeout=timeout).returncode
        return json.loads(out.read_text()) if rc == 0 and out.exists() else {
            "error": f"exit code {rc}"}


def markdown(res: dict) -> str:
    c = res.get("compare")
    lines = [f"# FP8 weights vs 16-bit: {res['model']} {res['dtype']}", "",
             f"Command: `{res['command']}`  ", f"Device: {res['device']}, {res['date']}", ""]
    if c is None:
        lines += ["compare: skipped (`--skip-compare`)", ""]
    elif "error" in c:
        lines += [f"compare: {c['error']}", ""]
    else:
        lines += ["| decode batch | context | 16-bit ms | fp8 ms | fp8 / 16-bit | floors ms |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {s['batch']} | {s['context']} | {s['none_ms']:.3f} | {s['fp8_ms']:.3f} | "
                  f"{s['ratio']:.2f} | {s['none_floor_ms']:.3f} / {s['fp8_floor_ms']:.3f} |"
                  for s in c["steps"]]
        b1 = next((s for s in c["steps"] if s["batch"] == 1), None)
        if b1 is not None:
            ok = "PASS" if b1["ratio"] <= STEP_TARGET else "FAIL"
            lines += ["", f"Batch-1 step: fp8 / 16-bit = {b1['ratio']:.2f} (target <= "
                          f"{STEP_TARGET}): {ok}. CUDA graphs: {c['graphs']}."]
        e = c["logits"]
        lines += ["", f"Logits over {e['positions']} prefill positions (same weights): "
                      f"relative L2 error mean {e['rel_l2_mean']:.4f}, max {e['rel_l2_max']:.4f}; "
                      f"max |diff| {e['max_abs']:.4f}, mean {e['mean_abs']:.5f} (mean logit "
                      f"span {e['logit_span_mean']:.3f}); argmax agrees at "
                      f"{100 * e['top1_agree']:.1f}%.", ""]
    off = res.get("offline")
    if off:
        lines += ["| weights | offline output tok/s | runs |", "|---|---|---|"]
        for q in FORMATS:
            r = off[q]
            lines.append(f"| {q} | {r.get('tok_s', 0):,.0f} | "
                         f"{r.get('error') or ', '.join(f'{t:,.0f}' for t in r['all_tok_s'])} |")
        if all("tok_s" in off[q] for q in FORMATS):
            ratio = off["fp8"]["tok_s"] / off["none"]["tok_s"]
            ok = "PASS" if ratio >= THROUGHPUT_TARGET else "FAIL"
            lines += ["", f"Offline: fp8 / 16-bit = {ratio:.2f} (target >= "
                          f"{THROUGHPUT_TARGET}): {ok}.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="dummy:llama3-8b")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--batches", default="1,64", help="decode batch sizes timed")
    ap.add_argument("--context", type=int, default=576, help="positions per decode sequence")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--tiny", action="store_true", help="dummy:tiny fp32 smoke run (CPU too)")
    skip = ap.add_mutually_exclusive_group()
    skip.add_argument("--skip-offline", action="store_true")
    skip.add_argument("--skip-compare", action="store_true", help="the offline part alone")
    ap.add_argument("--budget-s", type=float, default=1200,
                    help="seconds for the offline part (both formats)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "fp8-weights"))
    ap.add_argument("--part", help=argparse.SUPPRESS)  # internal: run one part, in a child
    ap.add_argument("--part-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tiny:
        args.model, args.dtype, args.batches, args.context, args.iters = (
            "dummy:tiny", "float32", "1,4", 40, 3)
    batches = [int(b) for b in args.batches.split(",")]
    if args.part == "compare":
        res = part_compare(args.model, args.dtype, batches, args.context, args.iters)
        Path(args.part_out).write_text(json.dumps(res))
        return
    command = "python -m bench.offline.fp8_weights " + " ".join(sys.argv[1:])
    res = {"model": args.model, "dtype": args.dtype, "command": command,
           "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "device": torch.cuda.get_device_name()
           if torch.cuda.is_available() else "cpu", "torch": torch.__version__}
    if not args.skip_compare:
        res["compare"] = run_child(["--part", "compare", "--model", args.model, "--dtype",
                                    args.dtype, "--batches", args.batches, "--context",
                                    str(args.context), "--iters", str(args.iters)], 600)
    if not args.skip_offline:
        from bench.offline.driver import run_part
        from bench.offline.parts import PRESETS

        base = PRESETS["tiny" if args.tiny else "full"]
        base = replace(base, model=args.model, dtype=args.dtype)
        deadline = time.monotonic() + args.budget_s
        res["offline"] = {q: run_part("sluice_overlap", replace(base, quantization=q), deadline)
                          for q in FORMATS}
        for r in res["offline"].values():
            r.pop("step_log_last_run", None)
    text = markdown(res)
    write_outputs(args.out, res, text)
    print(text)


if __name__ == "__main__":
    main()
