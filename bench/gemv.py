"""Skinny matmuls of decode at batch 1-4: `kernels.gemv` (each config of a small sweep) against
cuBLAS (`F.linear`) on the linear layers of a model, in GB/s of weight read and % of the
4.26 TB/s copy ceiling. Writes `<out>.json` and `<out>.md`.

    python -m bench.gemv [--model dummy:llama-7b] [--rows 1,2,4] [--out PREFIX]
"""

from __future__ import annotations

import argparse
import datetime
import json
from dataclasses import asdict
from itertools import product
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.offline_parts import time_ms
from bench.roofline import BANDWIDTH
from kernels.gemv import GemvConfig, gemv
from runtime.model_config import resolve_model
from runtime.worker.models.llama import LlamaArch

CONFIGS = [GemvConfig(n, k, w) for n, k, w in product((4, 8, 16), (256, 512, 1024), (4, 8))]


def shapes(model: str) -> dict[str, tuple[int, int]]:
    """(N, K) of each linear layer of `model`, fused as Sluice runs them."""
    a = LlamaArch.from_hf(resolve_model(model).hf_config())
    q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    return {"qkv_proj": (q + 2 * kv, a.hidden_size), "o_proj": (a.hidden_size, q),
            "gate_up_proj": (2 * a.intermediate_size, a.hidden_size),
            "down_proj": (a.hidden_size, a.intermediate_size),
            "lm_head": (a.vocab_size, a.hidden_size)}


def graph_us(fn, reps: int = 20) -> float:
    """Device microseconds of one `fn()`, from a CUDA graph of `reps` back-to-back calls (as
    decode runs them: no launch gaps between kernels)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    return time_ms(graph.replay, 20) * 1e3 / reps


def run(model: str, rows: list[int]) -> list[dict]:
    out = []
    for (name, (n, k)), m in product(shapes(model).items(), rows):
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02  # [N, K]
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)  # [M, K]
        ref = F.linear(x, w)
        cublas = graph_us(lambda x=x, w=w: F.linear(x, w))
        best = None
        for cfg in CONFIGS:
            err = (gemv(x, w, config=cfg) - ref).abs().max().item()
            us = graph_us(lambda x=x, w=w, cfg=cfg: gemv(x, w, config=cfg))
            if best is None or us < best[0]:
                best = (us, cfg, err)
        pct = 100 * w.nbytes / (BANDWIDTH * 1e-6)
        out.append({"layer": name, "n": n, "k": k, "rows": m, "weight_mb": w.nbytes / 1e6,
                    "cublas_us": cublas, "cublas_pct": pct / cublas, "gemv_us": best[0],
                    "gemv_pct": pct / best[0], "gemv_config": asdict(best[1]),
                    "max_abs_err": best[2]})
        print(out[-1], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="dummy:llama-7b")
    ap.add_argument("--rows", default="1,2,4")
    ap.add_argument("--out", default=f"bench/results/{datetime.date.today()}-gemv-h200")
    args = ap.parse_args()
    res = run(args.model, [int(r) for r in args.rows.split(",")])
    lines = [f"# Skinny matmuls, {args.model} fp16 ({torch.cuda.get_device_name()}, "
             f"{datetime.date.today()})", "",
             f"Command: `python -m bench.gemv --model {args.model} --rows {args.rows}`", "",
             "| layer | N x K | rows | weight MB | cuBLAS us | % ceiling | gemv us | % ceiling "
             "| best config (block_n, block_k, warps) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in res:
        c = r["gemv_config"]
        lines.append(f"| {r['layer']} | {r['n']} x {r['k']} | {r['rows']} | "
                     f"{r['weight_mb']:.1f} | {r['cublas_us']:.1f} | {r['cublas_pct']:.1f} | "
                     f"{r['gemv_us']:.1f} | {r['gemv_pct']:.1f} | "
                     f"{c['block_n']}, {c['block_k']}, {c['num_warps']} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps(res, indent=2) + "\n")
    Path(f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
