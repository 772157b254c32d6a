"""Sweep `kernels.gemm.skinny` launch configs against cuBLAS on the decode linears.

For each weight kind (bf16, fp8 e4m3 + per-channel scale), llama3-8b and llama-7b projection
shape (N, K) and M in 1, 2, 4, 8, 16: every config of the grid below, timed inside a CUDA
graph over enough weight copies to miss L2 (as the layers of a model do), against cuBLAS:
`F.linear` for bf16, and for fp8 the path `Fp8Linear` takes above the kernel's rows (per-token
activation quant + row-wise `torch._scaled_mm`). Kernels are compiled first in a process pool
(the Triton cache is shared on disk). Prints a table; writes JSON and .md to `--out`, and
`<out>-table.json`, the config table `kernels.gemm.skinny_configs` reads (copy it to
kernels/skinny_gemm_table.json): the `--merge` table (by default that file) with the keys
this run measured replaced, so a restricted run keeps the other rows.

`--fp8-decode` is the restricted run (about a minute): fp8 weights, the llama3-8b shapes,
the row-sum kernel's grid (M = 1, 2, 4) and a few tensor-core configs around those that won
before (M = 1..16).

    python -m bench.kernels.skinny_gemm [--quick | --fp8-decode] [--out bench/results/skinny-gemm]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from multiprocessing import get_context
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

from kernels.gemm.skinny import ROWSUM_ROWS
from kernels.gemm.skinny_configs import TABLE_FILE, SkinnyConfig, m_bucket

CEILING_GBPS = 4260.0  # H200 device-to-device copy (docs/device.md)
SHAPES = {  # (N, K): the layers that have it
    (6144, 4096): "llama3-8b qkv", (4096, 4096): "o (both)", (28672, 4096): "llama3-8b gate_up",
    (4096, 14336): "llama3-8b down", (12288, 4096): "llama-7b qkv",
    (22016, 4096): "llama-7b gate_up", (4096, 11008): "llama-7b down",
}
ROWS = (1, 2, 4, 8, 16)
FP8_DECODE_SHAPES = list(SHAPES)[:4]  # llama3-8b
FP8_DECODE_ROWS = ROWS  # the row-sum grid only up to ROWSUM_ROWS
ROWSUM_REGS = 64  # row-sum partial sums a thread may hold (more: ~200+ registers)
ROWSUM_BYTES = 128  # row-sum weight tile bytes a thread may hold (8 16-byte loads)
ROTATE_BYTES = 256 << 20  # weight copies cycled per timing, well over the 50 MB L2
FP8 = torch.float8_e4m3fn
WIN_MARGIN = 0.95  # a 16-bit shape uses the kernel only if it is 5% faster than cuBLAS
DEVICE = "cuda"


def grid(fp8: bool, quick: bool, fp8_decode: bool = False) -> list[SkinnyConfig]:
    """Every config without split-K (split is a runtime argument, swept per shape)."""
    bns, bks = (16, 32, 64), ((256, 512, 1024) if fp8 else (128, 256, 512))
    row_bns, row_bks = (8, 16, 32), ((512, 1024, 2048) if fp8 else (256, 512, 1024))
    warps, stages, folds = (4, 8), (2, 4), (1, 16)
    row_warps = warps
    if quick:
        bns, bks, row_bns, row_bks, warps, stages = (32,), bks[1:2], (16,), row_bks[1:2], (4,), (3,)
        row_warps, folds = (4,), (16,)
    if fp8_decode:  # around the tensor-core configs that won at M = 2..16 in the full sweep
        bns, bks, warps = (32, 64), (256, 512), (4,)
    out = [SkinnyConfig(bn, bk, 1, w, s, True)
           for bn, bk, w, s in itertools.product(bns, bks, warps, stages)]
    # The row-sum kernel pipelines nothing: one stage.
    out += [SkinnyConfig(bn, bk, 1, w, 1, False, f)
            for bn, bk, w, f in itertools.product(row_bns, row_bks, row_warps, folds)]
    return out


def fits(cfg: SkinnyConfig, m: int, fp8: bool) -> bool:
    """Whether `cfg` runs M rows: the row-sum kernel takes up to ROWSUM_ROWS, within
    ROWSUM_REGS partial sums and ROWSUM_BYTES of weight tile per thread."""
    if cfg.dot:
        return True
    vec = min(cfg.fold, 16 if fp8 else 8, cfg.block_k)
    per_thread = cfg.block_n * cfg.block_k // (32 * cfg.num_warps)  # weight elements
    return (m <= ROWSUM_ROWS and m_bucket(m) * per_thread // vec <= ROWSUM_REGS
            and per_thread * (1 if fp8 else 2) <= ROWSUM_BYTES)


def splits(cfg: SkinnyConfig, n: int, k: int) -> list[int]:
    """Split-K values worth timing: 1, and those that put up to 2048 programs on the grid."""
    tiles = -(-n // cfg.block_n)
    return [s for s in (1, 2, 4, 8, 16)
            if s == 1 or (tiles * s <= 2048 and k // s >= cfg.block_k and tiles * (s // 2) < 800)]


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.float().abs().amax(1).clamp(min=1e-12) / 448.0  # [N]
    return (w.float() / scale[:, None]).clamp(-448, 448).to(FP8), scale


def compile_batch(cfgs: list[tuple[bool, SkinnyConfig]], ks: tuple[int, ...] = (4096, 4112),
                  rows: tuple[int, ...] = ROWS) -> int:
    """Compile (run once) each config in this worker, for each row count the row-sum kernel
    specializes on; fills the on-disk Triton cache. K in `ks`: a multiple of every block_k
    (unmasked loads), and, unless restricted, one that is not."""
    from kernels.gemm.skinny import skinny_gemm

    x = torch.randn(ROWSUM_ROWS, max(ks), device=DEVICE, dtype=torch.bfloat16)
    for k in ks:
        w = torch.randn(1024, k, device=DEVICE, dtype=torch.bfloat16)
        q, s = quantize(w)
        for fp8, cfg in cfgs:
            for m in {m_bucket(r) for r in rows if r <= ROWSUM_ROWS and fits(cfg, r, fp8)}:
                # a config over the shared memory fails again when timed, and is skipped there
                with contextlib.suppress(triton.runtime.errors.OutOfResources):
                    skinny_gemm(x[:m, :k], q if fp8 else w, s if fp8 else None, config=cfg)
    torch.cuda.synchronize()
    return len(cfgs)


def graph_us(calls: list) -> float:
    """Median time of one call, the calls captured back to back in a CUDA graph."""
    for c in calls[:2]:
        c()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(calls))
    return statistics.median(times)


def fp8_cublas(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """`Fp8Linear`'s tensor-core path: per-token activation quant, row-wise `_scaled_mm`."""
    from kernels.gemm.fp8_quant import per_token_fp8

    xq, xs = per_token_fp8(x)  # [M, K] fp8, [M, 1] f32
    return torch._scaled_mm(xq, q.t(), scale_a=xs, scale_b=s.view(1, -1),
                            out_dtype=torch.bfloat16)  # [M, N]


def sweep_case(fp8: bool, n: int, k: int, cfgs: list[SkinnyConfig], weights,
               row_counts: tuple[int, ...]) -> list[dict]:
    from kernels.gemm.skinny import skinny_gemm, skinny_gemm_ref

    wbytes = n * k * (1 if fp8 else 2)
    rows = []
    for m in row_counts:
        x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
        if fp8:
            base = [lambda q=q, s=s, x=x: fp8_cublas(x, q, s) for q, s in weights]
        else:
            base = [lambda w=w, x=x: F.linear(x, w) for w, in weights]
        cublas = graph_us(base)
        timed = []
        for cfg in cfgs:
            if not fits(cfg, m, fp8):
                continue
            for s in splits(cfg, n, k):
                c = SkinnyConfig(**{**asdict(cfg), "split_k": s})
                try:
                    us = graph_us([lambda t=t, c=c, x=x: skinny_gemm(x, *t, config=c)
                                   for t in weights])
                except Exception as e:  # noqa: BLE001 - a config that fails is reported, skipped
                    print(f"  {c}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                    continue
                timed.append((us, c))
        timed.sort(key=lambda t: t[0])
        best_us, best = timed[0]
        y = skinny_gemm(x, *weights[0], config=best).float()
        want = skinny_gemm_ref(x, *weights[0]).float()
        err = ((y - want).norm() / want.norm()).item()
        rows.append({
            "kind": "fp8" if fp8 else "bf16", "n": n, "k": k, "m": m, "m_bucket": m_bucket(m),
            "layer": SHAPES[(n, k)], "weight_mb": wbytes / 1e6, "cublas_us": cublas,
            "best_us": best_us, "best": asdict(best), "rel_err": err,
            "pct_ceiling": wbytes / best_us / 1e3 / CEILING_GBPS * 100,
            "cublas_pct_ceiling": wbytes / cublas / 1e3 / CEILING_GBPS * 100,
            "top": [{"us": u, **asdict(c)} for u, c in timed[:6]]})
        r = rows[-1]
        print(f"{r['kind']:4} {n:6}x{k:<6} M={m:2} cublas {cublas:7.1f} us  best {best_us:7.1f} "
              f"us ({r['pct_ceiling']:5.1f}%) {best} err {err:.1e}", flush=True)
    return rows


def merged_table(res: dict, merge: str) -> dict:
    """The `merge` table file's entries (none if it is '' or missing) with those of the keys
    this run measured replaced by its own, except entries with a `source`: set by timing the
    whole decode step, they stand against a kernel timed alone."""
    entries = {}
    if merge and Path(merge).exists():
        entries = {(e["fp8"], e["m_bucket"], e["n"], e["k"]): e
                   for e in json.loads(Path(merge).read_text())["entries"]}
    for r in res["rows"]:
        key = (r["kind"] == "fp8", r["m_bucket"], r["n"], r["k"])
        if "source" in entries.get(key, {}):
            continue
        entries[key] = {
            "fp8": r["kind"] == "fp8", "m_bucket": r["m_bucket"], "n": r["n"], "k": r["k"],
            "config": r["best"], "beats_cublas": r["best_us"] < WIN_MARGIN * r["cublas_us"]}
    return {"device": res["device"], "date": res["date"], "entries": list(entries.values())}


def write(out: str, res: dict, merge: str) -> None:
    """`out`.json (every row), `out`.md (the table) and `out`-table.json (the configs)."""
    rows = res["rows"]
    Path(f"{out}.json").write_text(json.dumps(res, indent=1) + "\n")
    Path(f"{out}-table.json").write_text(json.dumps(merged_table(res, merge), indent=1) + "\n")
    md = ["| kind | layer | N x K | M | cuBLAS us | % ceil | kernel us | % ceil | config |",
          "|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['kind']} | {r['layer']} | {r['n']} x {r['k']} | {r['m']} | "
           f"{r['cublas_us']:.1f} | {r['cublas_pct_ceiling']:.0f} | {r['best_us']:.1f} | "
           f"{r['pct_ceiling']:.0f} | {tuple(r['best'].values())} |" for r in rows]
    Path(f"{out}.md").write_text("\n".join(md) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one config per kind")
    ap.add_argument("--fp8-decode", action="store_true",
                    help="fp8 only, llama3-8b shapes, the row-sum grid (about a minute)")
    ap.add_argument("--workers", type=int, default=14, help="compile processes")
    ap.add_argument("--out", default="bench/results/skinny-gemm")
    ap.add_argument("--merge", default=str(TABLE_FILE),
                    help="table whose other entries the -table.json keeps ('' for none)")
    args = ap.parse_args()
    t0 = time.monotonic()
    kinds = (True,) if args.fp8_decode else (True, False)
    shapes = FP8_DECODE_SHAPES if args.fp8_decode else list(SHAPES)
    row_counts = FP8_DECODE_ROWS if args.fp8_decode else ROWS
    ks = (4096,) if args.fp8_decode else (4096, 4112)
    jobs = [(fp8, c) for fp8 in kinds for c in grid(fp8, args.quick, args.fp8_decode)]
    with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn")) as pool:
        list(pool.map(compile_batch, [jobs[i::args.workers] for i in range(args.workers)],
                      [ks] * args.workers, [row_counts] * args.workers))
    print(f"compiled {len(jobs)} configs in {time.monotonic() - t0:.0f} s", flush=True)
    rows: list[dict] = []
    res = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE,
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "torch": torch.__version__, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for fp8, (n, k) in itertools.product(kinds, shapes):
        w = torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16)
        copies = max(2, -(-ROTATE_BYTES // (n * k * (1 if fp8 else 2))))
        weights = [quantize(w) if fp8 else (w.clone(),) for _ in range(copies)]
        del w
        try:
            rows += sweep_case(fp8, n, k, grid(fp8, args.quick, args.fp8_decode), weights,
                               row_counts)
        except Exception as e:  # noqa: BLE001 - keep the other shapes' results
            print(f"{n}x{k} fp8={fp8}: {type(e).__name__}: {e}", flush=True)
        del weights
        res["seconds"] = time.monotonic() - t0
        write(args.out, res, args.merge)  # after every shape: a cut-short run keeps its rows


if __name__ == "__main__":
    main()
