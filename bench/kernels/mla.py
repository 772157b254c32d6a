"""MLA (latent attention) kernel benchmark: decode over a paged latent pool, and extend.

Decode with few heads is memory bound on the latent rows, (Dl + Dr) * 2 bytes per token and
layer in 16 bits (1,152 for DeepSeek's 512 + 64); its bytes are those rows plus q, the output
and the page table, and its target is a share of the copy ceiling; an fp8 pool reads 1 byte a
value plus a float32 scale per row. H 16 is DeepSeek-V2-Lite, H 128 V2/V3. With 128 heads every
row costs
128 x 2 x (2 Dl + Dr) = 278 kFLOP against its 1,152 bytes, past the H200's ridge (780 TFLOP/s
over 4.26 TB/s = 183 FLOP/byte): that decode is compute bound, so its rows also show TFLOP/s.
`--sweep` times launch configs and split counts at a few points. Writes `<out>.json`, `<out>.md`.

    python -m bench.kernels.mla [--sweep] [--extend] [--dtype bfloat16] [--out PREFIX]
    python -m bench.kernels.mla --tiny   # CPU smoke run under TRITON_INTERPRET=1
"""

import argparse
import os
from dataclasses import asdict, replace
from functools import partial
from itertools import product
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from triton.runtime.errors import OutOfResources  # noqa: E402

from bench.kernels.common import COPY_CEILING_GBPS, PRESETS, Row, rows_table, timeit, write_report  # noqa: E402
from bench.kernels.run_setup import add_run_args, run_setup  # noqa: E402
from kernels.attention.mla_decode import MlaDecodeConfig, mla_decode, mla_decode_num_splits  # noqa: E402
from kernels.attention.mla_extend import mla_extend  # noqa: E402
from kernels.kv.store import quantize_ref  # noqa: E402

FULL = {"batches": (1, 32, 128), "contexts": (1024, 4096), "heads": (16, 128), "dims": (512, 64),
        "layouts": (("token", 1), ("paged16", 16)),
        "sweep_points": ((1, 4096, 128), (32, 4096, 16), (32, 4096, 128), (128, 4096, 128)),
        "extend": (4, 2048, 512)}  # fmt: skip
TINY = {"batches": (1, 3), "contexts": (48,), "heads": (3, 17), "dims": (32, 16),
        "layouts": (("token", 1), ("paged16", 16)), "sweep_points": ((3, 48, 17),),
        "extend": (2, 32, 24)}  # fmt: skip
# a few configs only: each is two compiles (split and direct) of a 512-wide kernel; those that
# spill registers in their sm_90 build (64 heads a block, 64 rows a tile) are left out
SWEEP_CONFIGS = [MlaDecodeConfig(16, 32, 8), MlaDecodeConfig(16, 32, 4), MlaDecodeConfig(16, 16, 4),
                 MlaDecodeConfig(32, 32, 8), MlaDecodeConfig(32, 32, 8, 3)]
SWEEP_SPLITS = (1, 2, 4, 8, 16)
FP8 = torch.float8_e4m3fn


def latent_pool(B, L, D, page_size, dtype, pool_dtype, dev):
    """A pool of B sequences x L random latent rows over shuffled pages (page 0 unused).

    Returns (kv_pool [S, 1, D], kv_indptr [B+1] int32, kv_indices int32, scale): scale is
    {"kv_scale": [S, 1] float32} for an 8-bit pool_dtype, else {}."""
    pages_per_seq = L // page_size
    pages = torch.randperm(B * pages_per_seq, device=dev, dtype=torch.int32) + 1
    kv_pool = torch.randn((B * pages_per_seq + 1) * page_size, 1, D, device=dev, dtype=dtype)
    kv_indptr = torch.arange(B + 1, device=dev, dtype=torch.int32) * pages_per_seq
    if pool_dtype == dtype:
        return kv_pool, kv_indptr, pages, {}
    kv_pool, kv_scale = quantize_ref(kv_pool, pool_dtype)  # [S, 1, D], [S, 1]
    return kv_pool, kv_indptr, pages, {"kv_scale": kv_scale}


def decode_case(B, L, H, page_size, s, dtype, pool_dtype, dev):
    """(run, bytes read and written) of one decode shape; run takes num_splits/config."""
    Dl, Dr = s["dims"]
    q = torch.randn(B, H, Dl + Dr, device=dev, dtype=dtype)  # [B, H, Dl + Dr]
    kv_pool, indptr, indices, scale = latent_pool(B, L, Dl + Dr, page_size, dtype, pool_dtype,
                                                  dev)  # fmt: skip
    seq_lens = torch.full((B,), L, dtype=torch.int32, device=dev)
    run = partial(mla_decode, q, kv_pool, indptr, indices, seq_lens, page_size,
                  (Dl + Dr) ** -0.5, kv_lora_rank=Dl, **scale)  # fmt: skip
    rows_bytes = B * L * ((Dl + Dr) * kv_pool.element_size() + 4 * bool(scale))
    return run, rows_bytes + q.nbytes + B * H * Dl * q.element_size() + indices.nbytes


def bench_decode(s, p, dev, dtype):
    rows = []
    for (B, L, H), (layout, page_size), pool_dtype in product(
        product(s["batches"], s["contexts"], s["heads"]), s["layouts"], (dtype, FP8)
    ):
        run, nbytes = decode_case(B, L, H, page_size, s, dtype, pool_dtype, dev)
        splits = mla_decode_num_splits(B, H, L)  # given, as under CUDA graphs: no host sync
        t = timeit(partial(run, num_splits=splits), p)
        pool = "fp8" if pool_dtype == FP8 else str(dtype)[6:]
        flops = 2 * B * L * H * (2 * s["dims"][0] + s["dims"][1])
        rows.append(Row("mla_decode", f"{layout} {pool} B{B} L{L} H{H}", t, nbytes, flops,
                        note=f"splits {splits}"))  # fmt: skip
        print(f"{rows[-1].case}: {t:.1f} us, {100 * rows[-1].gbps / COPY_CEILING_GBPS:.1f}%",
              flush=True)  # fmt: skip
    return rows


def sweep_decode(s, p, dev, dtype):
    """Token-layout decode over launch configs and split counts at s["sweep_points"]."""
    out = []
    for B, L, H in s["sweep_points"]:
        run, nbytes = decode_case(B, L, H, 1, s, dtype, dtype, dev)
        for cfg, splits in product(SWEEP_CONFIGS, SWEEP_SPLITS):
            try:
                t = timeit(partial(run, num_splits=splits, config=cfg), p)
            except OutOfResources as e:  # a tile too large for shared memory: skip the config
                print("sweep skips", cfg, e, flush=True)
                continue
            out.append({"B": B, "L": L, "H": H, "splits": splits, **asdict(cfg), "time_us": t,
                        "pct_ceiling": 100 * nbytes / t / 1e3 / COPY_CEILING_GBPS})  # fmt: skip
            print("sweep", out[-1], flush=True)  # partial results survive a time limit
    return out


def bench_extend(s, p, dev, dtype):
    B, prefix, new = s["extend"]
    Dl, Dr = s["dims"]
    rows = []
    for H in s["heads"]:
        T = B * new
        q = torch.randn(T, H, Dl + Dr, device=dev, dtype=dtype)  # [T, H, Dl + Dr]
        kv_new = torch.randn(T, 1, Dl + Dr, device=dev, dtype=dtype)  # [T, 1, Dl + Dr]
        kv_pool, indptr, indices, _ = latent_pool(B, prefix, Dl + Dr, 16, dtype, dtype, dev)
        qo = torch.arange(B + 1, device=dev, dtype=torch.int32) * new
        prefix_lens = torch.full((B,), prefix, dtype=torch.int32, device=dev)
        run = partial(mla_extend, q, kv_new, kv_pool, qo, prefix_lens, indptr, indices, 16,
                      (Dl + Dr) ** -0.5, kv_lora_rank=Dl, max_new_len=new)  # fmt: skip
        flops = 2 * (2 * Dl + Dr) * H * B * (new * prefix + new * (new + 1) / 2)
        nbytes = q.nbytes + kv_new.nbytes + B * prefix * (Dl + Dr) * 2 + T * H * Dl * 2
        rows.append(Row("mla_extend", f"paged16 B{B} prefix{prefix} new{new} H{H}",
                        timeit(run, p), nbytes, flops))  # fmt: skip
    return rows


def write_results(prefix: Path, meta: dict, rows: list[Row], sweep: list[dict]) -> None:
    data = {"meta": meta, "rows": [r.as_dict() for r in rows], "sweep": sweep}
    lines = rows_table("MLA kernel benchmark", meta, data["rows"])
    if sweep:
        lines += ["", "## Decode sweep (token layout; fastest 5 per point)", "",
                  "| B | L | H | splits | block_h | block_n | warps | stages | time (us) | % |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for point in dict.fromkeys((r["B"], r["L"], r["H"]) for r in sweep):
            best = sorted((r for r in sweep if (r["B"], r["L"], r["H"]) == point),
                          key=lambda r: r["time_us"])[:5]  # fmt: skip
            lines += [f"| {r['B']} | {r['L']} | {r['H']} | {r['splits']} | {r['block_h']} |"
                      f" {r['block_n']} | {r['num_warps']} | {r['num_stages']} |"
                      f" {r['time_us']:.1f} | {r['pct_ceiling']:.1f} |" for r in best]  # fmt: skip
    write_report(prefix, data, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", action="store_true", help="search decode configs and splits")
    parser.add_argument("--extend", action="store_true", help="also time mla_extend")
    add_run_args(parser, "bfloat16")
    parser.add_argument("--out", default="bench/results/kernels_mla", help="output path prefix")
    args = parser.parse_args()
    s, p = (TINY, PRESETS["tiny"]) if args.tiny else (FULL, replace(PRESETS["full"], iters=30))
    dev, dtype, meta = run_setup(args.tiny, args.dtype, p.iters, dims=s["dims"])
    torch.manual_seed(0)
    rows = bench_decode(s, p, dev, dtype)
    if args.extend:
        rows += bench_extend(s, p, dev, dtype)
    write_results(Path(args.out), meta, rows, [])  # the main table survives a slow sweep
    if args.sweep:
        write_results(Path(args.out), meta, rows, sweep_decode(s, p, dev, dtype))


if __name__ == "__main__":
    main()
