"""Offline throughput of the whole engine against HF transformers, and decode against the roofline.

One command, one GPU, every part in its own fresh process (HF's memory and Sluice's worker
never share the device), then one table, `<out>.json` and `<out>.md`:

- `sluice`: `Engine.generate` of 64 prompts of 512 random token ids, 128 output tokens each
  (greedy, ignore_eos) on `dummy:llama-7b` fp16, after a warm-up generate; output tok/s =
  64*128 / wall time; overlap on and off.
- `hf_static`: transformers `model.generate` (static batching) on the same config and prompts.
- `hf_batch`: transformers `model.generate_batch` (continuous batching, paged KV); its time
  includes its own warm-up, as a user calling it once sees it.
- `steps`: decode step time at batch 1, 64 and 256 (context 576; CUDA graph replay and eager)
  through an in-process `ModelRunner`, against the floor (weights + KV read) / 4.26 TB/s.
- `idle`: device idle time between consecutive decode steps inside the engine, overlap on and
  off, from the worker's `SLUICE_STEP_TIMING` log (CUDA events on the compute stream). Measured
  during the `sluice` runs.

Weights: Sluice draws its dummy weights in its worker (seeded N(0, 0.02)); each HF peer gets
transformers' random init of the same LlamaConfig. The values differ, but with ignore_eos and
fixed lengths every system does the same work, so throughput compares and tokens do not.

    python -m bench.offline [--quick | --tiny] [--only sluice,hf_static,hf_batch,steps,idle]
                            [--out bench/results/offline-full] [--chunk-size N]
                            [--model dummy:llama3-8b] [--dtype bfloat16] [--quantization fp8]

`--quantization fp8` gives Sluice fp8 weights (the HF peers stay 16-bit);
`bench.offline.fp8_weights` runs fp8 against 16-bit in one command.
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

ROOT = Path(__file__).resolve().parents[2]
GROUPS = ("sluice", "hf_static", "hf_batch", "steps", "idle")
ENGINE_RUNS = ("sluice_overlap", "sluice_no_overlap")  # they serve `sluice` and `idle`


def run_part(name: str, preset, deadline: float) -> dict:
    """Run one part in a fresh interpreter; its result dict, or {"error": why}."""
    timeout = min(preset.timeout_s, deadline - time.monotonic())
    if timeout < 10:
        return {"error": "skipped: the time budget (--budget-s) is spent"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "bench.offline", "--part", name, "--part-out", str(out),
               "--preset-json", json.dumps(asdict(preset))]
        print(f"=== {name} (timeout {timeout:.0f} s)", flush=True)
        t0 = time.monotonic()
        try:
            rc = subprocess.run(cmd, cwd=ROOT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        print(f"=== {name}: {time.monotonic() - t0:.1f} s, exit code {rc}", flush=True)
        if rc != 0 or not out.exists():
            return {"error": f"exit code {rc} (its traceback is in the log above)"}
        return json.loads(out.read_text())


def run_child(name: str, preset_json: str, out: Path) -> None:
    from bench.offline.parts import PARTS, Preset, device_info

    fields = json.loads(preset_json)
    preset = Preset(**{**fields, "step_batches": tuple(fields["step_batches"])})
    out.write_text(json.dumps({**PARTS[name](preset), **device_info()}))


def git_commit() -> str | None:
    """HEAD, with "+dirty" for uncommitted changes; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, text=True,
                               capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one timed run, fewer iterations")
    parser.add_argument("--tiny", action="store_true", help="dummy:tiny smoke run (runs on CPU)")
    parser.add_argument("--only", default=",".join(GROUPS), help=f"subset of {','.join(GROUPS)}")
    parser.add_argument("--out", help="output path prefix (default bench/results/offline-<preset>)")
    parser.add_argument("--chunk-size", type=int, help="Sluice prefill tokens per step")
    parser.add_argument("--model", help="the model (default: the preset's, dummy:llama-7b)")
    parser.add_argument("--dtype", help="the model's dtype (default: the preset's, float16)")
    parser.add_argument("--quantization", choices=("none", "fp8"),
                        help="Sluice's weights (default none)")
    parser.add_argument("--budget-s", type=float, default=540,
                        help="start no part after this many seconds (default 540)")
    parser.add_argument("--part", help=argparse.SUPPRESS)  # internal: run one part, in a child
    parser.add_argument("--part-out", help=argparse.SUPPRESS)
    parser.add_argument("--preset-json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        run_child(args.part, args.preset_json, Path(args.part_out))
        return
    only = args.only.split(",")
    if not set(only) <= set(GROUPS):
        sys.exit(f"--only takes a subset of {','.join(GROUPS)}, got {args.only}")
    import torch  # the driver never touches the GPU: the parts own it, one at a time

    from bench.offline.parts import PRESETS
    from bench.offline.report import write_report
    from bench.roofline import BANDWIDTH, COMPUTE, ModelBytes

    name = "tiny" if args.tiny else "quick" if args.quick else "full"
    if name != "tiny" and not torch.cuda.is_available():
        sys.exit("no CUDA device: only --tiny runs here")
    preset = PRESETS[name]
    if args.chunk_size:
        preset = replace(preset, chunk_size=args.chunk_size)
    for name in ("model", "dtype", "quantization"):
        if getattr(args, name):
            preset = replace(preset, **{name: getattr(args, name)})
    deadline = time.monotonic() + args.budget_s
    # the engine first: if the time budget runs out, it is the slowest peer that goes
    todo = list(ENGINE_RUNS) if {"sluice", "idle"} & set(only) else []
    todo += [n for n in ("steps", "hf_static", "hf_batch") if n in only]
    results = {n: run_part(n, preset, deadline) for n in todo}
    sizes = ModelBytes.of(preset.model, getattr(torch, preset.dtype), preset.quantization)
    info = next((r for r in results.values() if "device" in r), {})
    meta = {
        "command": " ".join(["python -m bench.offline", *sys.argv[1:]]), "commit": git_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "preset": name, "config": asdict(preset),
        **{k: info.get(k) for k in ("device", "torch", "triton", "transformers")},
        "bandwidth_tb_s": BANDWIDTH / 1e12, "weights_gb": sizes.params / 1e9,
        "kv_bytes_per_token": sizes.kv_per_token,
        "roofline_tok_s": sizes.decode_tok_s(preset.batch, preset.input_len, preset.output_len),
        "roofline_with_prefill_tok_s": sizes.offline_tok_s(preset.batch, preset.input_len,
                                                           preset.output_len),
        "compute_tflop_s": COMPUTE / 1e12,
        "weights_note": "Sluice: seeded N(0, 0.02) dummy weights drawn in its worker; HF peers: "
                        "transformers' random init of the same LlamaConfig. Values differ; "
                        "with ignore_eos and fixed lengths the work (and so the speed) does not.",
    }  # fmt: skip
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"offline-{name}"
    write_report(out, meta, results, only)


if __name__ == "__main__":
    main()
