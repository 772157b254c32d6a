"""The whole model's extend step over a cached prefix (a radix hit) followed by a short run
of new tokens, with the extend kernel's query heads packed by kv head (its default under
GQA) and one query head a program, over each KV pool.

`--batch` sequences hold `--prefix` cached tokens each (filled by a prefill first), then
one step extends every sequence by S new tokens, for each S of `--new`, sampling one
position a sequence as the engine does. The step is `ModelRunner.forward` (eager, as every
extend runs): its wall time (CUDA events, median of `--iters`), which the host's launches
bound when the kernels are short, and from the torch profiler over as many steps its
device time (every kernel's, summed) and the extend attention kernel's. The per-head
variant makes the launcher's `rows_per_token` answer 1 while inside: one query head's
tokens a program, with what the launcher derives from that (the default config, and the
launch order of unpacked programs: row blocks first). GPU only.
`dummy:llama3-8b` has 32 query heads over 8 kv heads, so packing puts 4 heads x a token in a
row block. S = 1 times the extend kernel in a step that the engine runs as decode when every
sequence has one new token (`BatchBuilder`); mixed batches with such runs do extend.

    python -m bench.offline.extend_step [--model dummy:llama3-8b] [--batch 32] [--prefix 2048]
                                [--new 1,4,16,64] [--pools auto,fp8,int8] [--iters 20]
                                [--out bench/results/<date>-extend-step]

Writes `<out>.json` and `<out>.md`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from bench.offline.parts import step_batch, time_ms
from bench.outputs import write_outputs

VARIANTS = ("packed", "per-head")


@contextlib.contextmanager
def per_head():
    """The extend launcher gives each program one query head's rows while inside."""
    mod = sys.modules["kernels.attention.extend"]  # `kernels` exports the function by that name
    packed = mod.rows_per_token
    mod.rows_per_token = lambda q_heads, kv_heads, pack_heads=None: packed(q_heads, kv_heads,
                                                                           False)  # fmt: skip
    try:
        yield
    finally:
        mod.rows_per_token = packed


def fill_prefixes(runner, ids: torch.Tensor, stride: int, chunk: int = 4) -> None:
    """Prefill ids `[B, P]` into their sequences' slots, `chunk` sequences a forward."""
    for s0 in range(0, ids.shape[0], chunk):
        runner.forward(step_batch(ids[s0 : s0 + chunk], 0, stride, seq0=s0))


def measure(fn, iters: int) -> dict:
    """fn's wall milliseconds (median), and its device and extend-kernel milliseconds a call
    from the profiler (kernel times summed)."""
    wall = time_ms(fn, iters)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    evts = prof.key_averages()
    busy = sum(e.device_time_total for e in evts)  # us, over iters calls
    attn = sum(e.device_time_total for e in evts if "_extend_attention_kernel" in e.key)
    return {"wall_ms": round(wall, 4), "busy_ms": round(busy / iters / 1e3, 4),
            "attn_ms": round(attn / iters / 1e3, 4)}  # fmt: skip


def run_pool(model: str, pool: str, batch: int, prefix: int, news: list[int],
             iters: int) -> list[dict]:  # fmt: skip
    """Every (S, variant) step time over one KV pool."""
    from runtime.model_config import resolve_model
    from runtime.worker.model_runner import ModelRunner

    dev = torch.device("cuda")
    stride = prefix + max(news)
    runner = ModelRunner(resolve_model(model), dev, torch.bfloat16, kv_slots=batch * stride,
                         max_rows=batch, seed=0, cuda_graph=False, kv_dtype=pool)  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, runner.vocab_size, (batch, stride), generator=gen).to(dev)  # [B, L]
    fill_prefixes(runner, ids[:, :prefix], stride)
    rows = []
    for s in news:
        fb = step_batch(ids[:, prefix : prefix + s], prefix, stride)
        for name in VARIANTS:
            with per_head() if name == "per-head" else contextlib.nullcontext():
                times = measure(lambda fb=fb, r=runner: r.forward(fb), iters)
            rows.append({"pool": pool, "new": s, "variant": name, **times})
            print(rows[-1], flush=True)
    del runner
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def markdown(res: dict) -> str:
    """One row per (pool, S): each variant's wall, device and extend-kernel milliseconds a
    step, and per-head over packed for the last two."""
    lines = [f"# Extend step over a cached prefix: {res['model']}, {res['batch']} x "
             f"{res['prefix']} cached + S new tokens", "",
             f"Command: `{res['command']}`  ", f"Device: {res['device']}, {res['date']}, "
             f"tree {res['tree']}", "",
             "Milliseconds a step: wall / device (all kernels) / extend kernel.", "",
             "| pool | S | packed | per-head | device: per-head / packed | kernel: per-head / "
             "packed |", "|---|---|---|---|---|---|"]  # fmt: skip
    got = {(r["pool"], r["new"], r["variant"]): r for r in res["rows"]}
    for pool, s in dict.fromkeys((r["pool"], r["new"]) for r in res["rows"]):
        packed, head = got.get((pool, s, "packed")), got.get((pool, s, "per-head"))
        if packed is None or head is None:
            continue
        cells = [" / ".join(f"{r[k]:.2f}" for k in ("wall_ms", "busy_ms", "attn_ms"))
                 for r in (packed, head)]  # fmt: skip
        lines.append(f"| {pool} | {s} | {cells[0]} | {cells[1]} | "
                     f"{head['busy_ms'] / packed['busy_ms']:.2f}x | "
                     f"{head['attn_ms'] / packed['attn_ms']:.2f}x |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    from bench.serving.server_proc import device_name, git_rev

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="dummy:llama3-8b")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prefix", type=int, default=2048)
    ap.add_argument("--new", default="1,4,16,64", help="comma-separated runs of new tokens")
    ap.add_argument("--pools", default="auto,fp8,int8", help="comma-separated --kv-dtype values")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=f"bench/results/{time.strftime('%Y-%m-%d')}-extend-step")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench.offline.extend_step times the GPU's step: no CUDA device here")
    news = [int(s) for s in args.new.split(",")]
    res = {"model": args.model, "batch": args.batch, "prefix": args.prefix,
           "device": device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "tree": git_rev(),
           "command": "python -m bench.offline.extend_step " + " ".join(sys.argv[1:]),
           "rows": []}  # fmt: skip
    for pool in args.pools.split(","):
        res["rows"] += run_pool(args.model, pool, args.batch, args.prefix, news, args.iters)
        write_outputs(args.out, res, markdown(res))  # what finished, if a limit cuts the run
    print(markdown(res))


if __name__ == "__main__":
    main()
