"""MoE benchmark: `fused_moe` at the DeepSeek-V2-Lite expert shape against its bound.

One layer's routed experts (H 2048, I 1408, E 64, k 6) at several token counts. The bound is
max(bytes / copy bandwidth, FLOPs / matmul rate): the bytes are the weights of the experts
actually picked plus x and the output, the FLOPs 2 * T * k * 3 * H * I. Rows time the eager
launch (routing excluded, the expert sort included), a CUDA-graph replay of it, the sort
alone (Triton, and its torch reference), and a per-expert torch loop in the same dtype (what
an eager model does); `--sweep` times a few tile configs per token count. Writes `<out>.json`
and `<out>.md`.

    python -m bench.kernels.moe [--sweep] [--dtype bfloat16] [--out PREFIX]
    python -m bench.kernels.moe --tiny   # CPU smoke run under TRITON_INTERPRET=1
"""

import argparse
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from triton.runtime.errors import OutOfResources  # noqa: E402

from bench.kernels.common import COPY_CEILING_GBPS, timeit, write_report  # noqa: E402
from bench.kernels.run_setup import add_run_args, run_setup  # noqa: E402
from kernels.moe import (  # noqa: E402
    MoeConfig,
    fused_moe,
    fused_moe_ref,
    grouped_topk,
    moe_align_block_size,
    moe_config,
)
from kernels.moe.align import moe_align_block_size_ref  # noqa: E402

MATMUL_TFLOPS = 780.0  # H200 dense bf16 matmul, measured (device.md)
SWEEP = (  # the three defaults of `moe_config`, then alternatives
    MoeConfig(16, 64, 128, num_stages=4),
    MoeConfig(32, 64, 128, num_stages=3),
    MoeConfig(64, 128, 64, group_m=8, num_stages=3),
    MoeConfig(16, 128, 128, num_stages=3),
    MoeConfig(64, 64, 64, group_m=8, num_stages=4),
    MoeConfig(128, 128, 64, group_m=8, num_warps=8, num_stages=3),
)


@dataclass(frozen=True)
class MoeShape:
    hidden: int
    inter: int
    experts: int
    top_k: int
    tokens: tuple[int, ...]
    warmup: int = 10
    iters: int = 50


SHAPES = {
    "v2-lite": MoeShape(2048, 1408, 64, 6, (1, 16, 64, 256, 2048)),
    "tiny": MoeShape(64, 48, 8, 2, (1, 7), warmup=1, iters=2),
}


def torch_loop(x, w13, w2, weights, ids):
    """Per-expert loop in x's dtype, the way an eager model runs its experts."""
    out = torch.zeros_like(x)  # [T, H]
    inter = w13.shape[1] // 2
    for e in ids.unique().tolist():
        tok, pick = torch.where(ids == e)  # [n] each
        h = x[tok] @ w13[e].t()  # [n, 2I]
        y = (torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]) @ w2[e].t()  # [n, H]
        out.index_add_(0, tok, y * weights[tok, pick, None].to(x.dtype))
    return out


def graph_time_us(fn, s: MoeShape) -> float:
    """Median replay time of `fn` captured in a CUDA graph."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return timeit(graph.replay, s)


def bench_tokens(T, s: MoeShape, w13, w2, dev, dtype, args) -> dict:
    H, inter, E, k = s.hidden, s.inter, s.experts, s.top_k
    x = torch.randn(T, H, device=dev, dtype=dtype)  # [T, H]
    weights, ids = grouped_topk(torch.randn(T, E, device=dev), k)  # [T, k] each, greedy softmax
    touched = ids.unique().numel()
    nbytes = touched * 3 * H * inter * w13.element_size() + 2 * x.nbytes
    flops = 2 * T * k * 3 * H * inter
    bound_us = max(nbytes / COPY_CEILING_GBPS / 1e3, flops / MATMUL_TFLOPS / 1e6)
    cfg = moe_config(T, k, E)
    run = lambda c=cfg: fused_moe(x, w13, w2, weights, ids, config=c)  # noqa: E731
    err = (run().float() - fused_moe_ref(x, w13, w2, weights, ids).float()).abs().max().item()
    t = timeit(run, s)
    row = {
        "tokens": T, "experts_touched": touched, "config": asdict(cfg), "time_us": t,
        "graph_us": graph_time_us(run, s) if dev == "cuda" else None,
        "align_us": timeit(lambda: moe_align_block_size(ids, E, cfg.block_m), s),
        "align_ref_us": timeit(lambda: moe_align_block_size_ref(ids, E, cfg.block_m), s),
        "torch_loop_us": timeit(lambda: torch_loop(x, w13, w2, weights, ids), s),
        "bytes": nbytes, "flops": flops, "bound_us": bound_us, "max_abs_err": err,
    }  # fmt: skip
    best = row["graph_us"] or t
    row.update(pct_bound=100 * bound_us / best, gbps=nbytes / best / 1e3,
               tflops=flops / best / 1e6)  # fmt: skip
    if args.sweep:
        row["sweep"] = sorted((sweep_point(run, c, s) for c in SWEEP), key=lambda r: r["time_us"])
    return row


def sweep_point(run, cfg: MoeConfig, s: MoeShape) -> dict:
    """Eager time of one tile config; inf when it does not fit (shared memory, registers)."""
    try:
        t = timeit(lambda: run(cfg), s)
    except OutOfResources:
        t = float("inf")
    return {**asdict(cfg), "time_us": t}


def write_results(prefix: Path, meta: dict, rows: list[dict], echo: bool) -> None:
    lines = [f"# fused_moe ({meta['device']})", "", ", ".join(f"{k}: {v}" for k, v in meta.items()),
             "", "| T | experts hit | tiles (m/n/k) | eager (us) | graph (us) | sort (us) "
             "| torch sort (us) | torch loop (us) "
             "| bound (us) | % of bound | GB/s | TFLOP/s | max abs err |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        c, g = r["config"], r["graph_us"]
        lines.append(f"| {r['tokens']} | {r['experts_touched']} | {c['block_m']}/{c['block_n']}"
                     f"/{c['block_k']} | {r['time_us']:.1f} | {'-' if g is None else f'{g:.1f}'}"
                     f" | {r['align_us']:.1f} | {r['align_ref_us']:.1f}"
                     f" | {r['torch_loop_us']:.1f} | {r['bound_us']:.1f}"
                     f" | {r['pct_bound']:.0f} | {r['gbps']:.0f} | {r['tflops']:.1f}"
                     f" | {r['max_abs_err']:.2e} |")  # fmt: skip
    if any("sweep" in r for r in rows):
        lines += ["", "## Tile sweep (eager, fastest 3 per T)", "",
                  "| T | m/n/k | group_m | warps | stages | time (us) |",
                  "|---:|---|---:|---:|---:|---:|"]  # fmt: skip
        for r in rows:
            for c in r["sweep"][:3]:
                lines.append(f"| {r['tokens']} | {c['block_m']}/{c['block_n']}/{c['block_k']}"
                             f" | {c['group_m']} | {c['num_warps']} | {c['num_stages']}"
                             f" | {c['time_us']:.1f} |")  # fmt: skip
    write_report(prefix, {"meta": meta, "rows": rows}, lines, echo)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", action="store_true", help="time the tile configs in SWEEP")
    add_run_args(parser, "bfloat16")
    parser.add_argument("--out", default="bench/results/kernels_moe", help="output path prefix")
    args = parser.parse_args(argv)
    s = SHAPES["tiny" if args.tiny else "v2-lite"]
    dev, dtype, meta = run_setup(args.tiny, args.dtype, s.iters,
                                 shape=f"H{s.hidden} I{s.inter} E{s.experts} k{s.top_k}")
    meta["matmul_tflops"] = MATMUL_TFLOPS
    torch.manual_seed(0)
    w13 = torch.randn(s.experts, 2 * s.inter, s.hidden, device=dev, dtype=dtype) * 0.02
    w2 = torch.randn(s.experts, s.hidden, s.inter, device=dev, dtype=dtype) * 0.02
    rows = []
    for T in s.tokens:  # the files are rewritten after each row: a cut-off run keeps its rows
        rows.append(bench_tokens(T, s, w13, w2, dev, dtype, args))
        write_results(Path(args.out), meta, rows, echo=len(rows) == len(s.tokens))


if __name__ == "__main__":
    main()
