"""Kernel benchmarks: time, bytes moved, GB/s and % of the H200 copy ceiling for every kernel.

Decode attention is the one that matters (memory bound, target >= 80% of copy bandwidth at
batch 64 x 4096 keys x 32 heads x 128, over 16-bit, fp8 and int8 pools); it is compared with
torch SDPA's flash backend on contiguous KV of the same shape (`bench/kernels/attention.py`).
Writes `<out>.json` and `<out>.md`.

    python -m bench.kernels [--quick] [--sweep] [--only decode,extend] [--dtype bfloat16]
                            [--out PREFIX]
    python -m bench.kernels.driver --tiny   # CPU smoke run of this script under TRITON_INTERPRET=1
"""

import argparse
import os
from functools import partial
from itertools import product
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from bench.kernels.attention import (  # noqa: E402
    QUANT_POOLS,
    bench_decode,  # noqa: F401 (a group, called by name)
    bench_extend,  # noqa: F401
    pool_summary,
)
from bench.kernels.common import PRESETS, Row, rows_table, timeit, write_report  # noqa: E402
from bench.kernels.run_setup import add_run_args, run_setup  # noqa: E402
from kernels.kv.store import store_kv  # noqa: E402
from kernels.norm_rope.activation import silu_and_mul  # noqa: E402
from kernels.norm_rope.rmsnorm import rmsnorm  # noqa: E402
from kernels.norm_rope.rope import apply_rope, rope_cos_sin_cache  # noqa: E402

GROUPS = ("copy", "decode", "extend", "store_kv", "rmsnorm", "rope", "silu_and_mul")


def bench_copy(p, dev, dtype, args):
    x = torch.empty(p.copy_mib << 20, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    return [Row("copy", f"{p.copy_mib} MiB", timeit(lambda: y.copy_(x), p), 2 * x.numel())]


def bench_store_kv(p, dev, dtype, args):
    Hkv, D, rows = p.gqa_kv_heads, p.head_dim, []
    batch = p.decode_points[0][0]
    for T, pool_dtype in product((batch, p.tokens), (dtype, *QUANT_POOLS.values())):
        k, v = (torch.randn(T, Hkv, D, device=dev, dtype=dtype) for _ in range(2))
        num_slots = 2 * T + 1
        slots = torch.randperm(num_slots - 1, device=dev)[:T] + 1
        k_buf = torch.empty(num_slots, Hkv, D, dtype=pool_dtype, device=dev)
        v_buf = torch.empty_like(k_buf)
        scales = {}
        if pool_dtype != dtype:
            scales = {n: torch.empty(num_slots, Hkv, device=dev) for n in ("k_scale", "v_scale")}
        nbytes = 2 * k.nbytes + 2 * T * Hkv * D * k_buf.element_size() + slots.nbytes
        nbytes += 2 * T * Hkv * 4 * bool(scales)
        t = timeit(partial(store_kv, k, v, k_buf, v_buf, slots, **scales), p)
        rows.append(Row("store_kv", f"T{T} H{Hkv} D{D} -> {str(pool_dtype)[6:]}", t, nbytes))
    return rows


def bench_rmsnorm(p, dev, dtype, args):
    x, r = (torch.randn(p.tokens, p.hidden, device=dev, dtype=dtype) for _ in range(2))
    w = torch.randn(p.hidden, device=dev, dtype=dtype)
    case = f"T{p.tokens} hidden{p.hidden}"
    return [
        Row("rmsnorm", case, timeit(lambda: rmsnorm(x, w, 1e-6), p), 2 * x.nbytes + w.nbytes),
        Row("rmsnorm", f"{case} +residual", timeit(lambda: rmsnorm(x, w, 1e-6, r), p),
            4 * x.nbytes + w.nbytes),
    ]  # fmt: skip


def bench_rope(p, dev, dtype, args):
    T, Hq, Hkv, D = p.tokens, p.heads, p.gqa_kv_heads, p.head_dim
    q = torch.randn(T, Hq, D, device=dev, dtype=dtype)  # [T, Hq, D]
    k = torch.randn(T, Hkv, D, device=dev, dtype=dtype)  # [T, Hkv, D]
    cache = rope_cos_sin_cache(D, 8192, 500000.0, None, dev)  # [8192, D]
    pos = torch.randint(0, 8192, (T,), device=dev)
    nbytes = 2 * (q.nbytes + k.nbytes) + T * D * 4 + pos.nbytes
    return [Row("rope", f"T{T} H{Hq}/{Hkv} D{D}", timeit(lambda: apply_rope(q, k, pos, cache), p),
                nbytes)]  # fmt: skip


def bench_silu_and_mul(p, dev, dtype, args):
    x = torch.randn(p.tokens, 2 * p.inter, device=dev, dtype=dtype)  # [T, 2I]
    t = timeit(lambda: silu_and_mul(x), p)
    return [Row("silu_and_mul", f"T{p.tokens} I{p.inter}", t, x.nbytes * 3 // 2)]


def write_results(prefix: Path, meta: dict, rows: list[Row], sweep: list[dict]) -> None:
    data = {"meta": meta, "rows": [r.as_dict() for r in rows], "decode_sweep": sweep}
    lines = rows_table("Kernel benchmark", meta, data["rows"])
    if sweep:
        lines += ["", f"## Decode sweep (token layout, {sweep[0]['pool']} pool, fastest 10 per "
                  "head layout)", "",
                  "| mha | splits | block_n | warps | stages | use_dot | time (us) | % ceiling |",
                  "|---|---:|---:|---:|---:|---|---:|---:|"]  # fmt: skip
        for mha in (True, False):
            for s in [s for s in sweep if s["mha"] == mha][:10]:
                lines.append(f"| {mha} | {s['splits']} | {s['block_n']} | {s['num_warps']} |"
                             f" {s['num_stages']} | {s['use_dot']} | {s['time_us']:.1f} |"
                             f" {s['pct_ceiling']:.1f} |")  # fmt: skip
    lines += pool_summary(data["rows"], meta["dtype"])
    write_report(prefix, data, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations and variants")
    parser.add_argument("--sweep", action="store_true", help="search decode launch configs")
    parser.add_argument("--sweep-pool", choices=("compute", *QUANT_POOLS), default="compute",
                        help="the KV pool dtype the sweep runs on")
    add_run_args(parser, "float16")
    parser.add_argument("--only", default=",".join(GROUPS), help=f"subset of {','.join(GROUPS)}")
    parser.add_argument("--out", default="bench/results/kernels", help="output path prefix")
    args = parser.parse_args()
    only = args.only.split(",")
    assert set(only) <= set(GROUPS), f"--only takes {GROUPS}, got {only}"
    preset_name = "tiny" if args.tiny else "quick" if args.quick else "full"
    p = PRESETS[preset_name]
    dev, dtype, meta = run_setup(args.tiny, args.dtype, p.iters, preset=preset_name)
    torch.manual_seed(0)
    rows, sweep = [], []
    for group in only:
        result = globals()[f"bench_{group}"](p, dev, dtype, args)
        if group == "decode":
            result, sweep = result
        rows += result
        if dev == "cuda":
            torch.cuda.empty_cache()
    write_results(Path(args.out), meta, rows, sweep)


if __name__ == "__main__":
    main()
