"""Launch-config sweep of decode attention over fp8 and int8 KV pools on the issue's shapes.

For MHA 32/32 and GQA 32/8 (head_dim 128, bf16 q, B64 L4096) it times every config of
`CONFIGS` (byte or 32-bit word loads, pipelined by Triton or prefetched by the loop) on the
token layout for each quantized pool, the best one at 2x and 4x the default split count, then
the two defaults and the token layout's best on paged-16; each beside the 16-bit pool's
default kernel. With `--gluon`: the Triton stage 1's default against tile sizes and ring depths
of the Gluon stage 1 (`GLUON`), at 1x and 2x the default split count. `--pools fp8_e4m3`
adds an fp8 pool without scales (the codes are the values), timed like the others.
% is of the copy ceiling on the bytes the kernel reads (K/V plus the float32 scales); `vs16` is
the 16-bit pool's time over this one's; `diff` is the max |o - o of the pool's first row|.
Each row is printed and the JSON rewritten as it lands, so a time limit keeps what finished.

    python -m bench.kernels.decode_quant_sweep --out /tmp/sweep [--budget-s 150] [--smoke] [--gluon]
        [--pools fp8,int8]
"""

from dataclasses import asdict
from functools import partial
from itertools import product

import torch

from bench.kernels.attention import QUANT_POOLS, UNSCALED_POOLS, paged_pool
from bench.kernels.common import COPY_CEILING_GBPS, Preset, timeit
from bench.kernels.sweep_run import SweepRun, sweep_parser
from kernels.attention.decode import DecodeConfig, decode_attention, decode_num_splits
from kernels.attention.decode_config import triton_quant_config

CONFIGS = [  # the defaults (token; paged GQA), then the register-prefetch variants
    DecodeConfig(block_n=128, num_warps=4, num_stages=3),
    DecodeConfig(block_n=128, num_warps=4, num_stages=2, words=True),
    DecodeConfig(block_n=64, num_warps=4, num_stages=1, prefetch=True),
] + [
    DecodeConfig(block_n=n, num_warps=4, num_stages=1, words=True, prefetch=True)
    for n in (32, 64, 128)
]
GLUON = [DecodeConfig(gluon=True, block_n=n, num_stages=u) for n, u in ((64, 2), (64, 3), (128, 2))]


def main():
    ap = sweep_parser(__doc__.split("\n")[0], 150.0)
    ap.add_argument("--gluon", action="store_true",
                    help="the Triton stage 1's default against the Gluon stage 1's tile sizes "
                         "and ring depths (GPU)")
    ap.add_argument("--pools", default=",".join(QUANT_POOLS),
                    help="the quantized pools to time (comma-separated: fp8, int8, fp8_e4m3)")
    args = ap.parse_args()
    pools = {name: (QUANT_POOLS | UNSCALED_POOLS)[name] for name in args.pools.split(",")}
    sweep, p = SweepRun(args.out, "decode_quant_sweep", args.budget_s), Preset(warmup=5, iters=20)
    B, L, Hq, D = (2, 64, 8, 128) if args.smoke else (64, 4096, 32, 128)
    dtype = torch.float32 if args.smoke else torch.bfloat16
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(B, Hq, D, device=dev, dtype=dtype, generator=gen)  # [B, Hq, D]
    kv = {h: [torch.randn(B, h, L, D, device=dev, dtype=dtype, generator=gen) for _ in "kv"]
          for h in (Hq, Hq // 4)}  # [B, Hkv, L, D] k and v per kv head count  # fmt: skip
    seq_lens = torch.full((B,), L, dtype=torch.int32, device=dev)
    base_us = {}

    def measure(layout, page_size, Hkv, name, pool, configs, split_mults=(1,)):
        k_buf, v_buf, indptr, indices, scales = paged_pool(*kv[Hkv], page_size, pool,
                                                           name not in UNSCALED_POOLS)
        nbytes = 2 * k_buf.nbytes // k_buf.shape[0] * B * L + 2 * q.nbytes
        nbytes += indices.nbytes + 2 * B * L * Hkv * 4 * bool(scales)
        shape, ref = f"B{B} L{L} H{Hq}/{Hkv} D{D}", None
        for cfg, mult in product(configs, split_mults):
            sweep.check_budget()
            splits = mult * decode_num_splits(B, Hkv, L, quantized=name in pools)
            run = partial(decode_attention, q, k_buf, v_buf, indptr, indices, seq_lens,
                          page_size, D**-0.5, num_splits=splits, config=cfg, **scales)  # fmt: skip
            out = run()
            ref = out if ref is None else ref
            t = timeit(run, p)
            base_us.setdefault((layout, Hkv), t)
            sweep.add({"shape": shape, "layout": layout, "pool": name, "splits": splits,
                       "config": cfg and asdict(cfg), "time_us": t,
                       "pct": 100 * nbytes / t / 1e3 / COPY_CEILING_GBPS,
                       "vs16": base_us[layout, Hkv] / t, "diff": (out - ref).abs().max().item(),
                       "elapsed_s": sweep.elapsed()})  # fmt: skip

    def best(layout, Hkv, name, n):
        done = [r for r in sweep.rows if r["layout"] == layout and r["pool"] == name
                and f"/{Hkv} " in r["shape"]
                and r["splits"] == decode_num_splits(B, Hkv, L, quantized=name in pools)]
        return [DecodeConfig(**r["config"]) for r in sorted(done, key=lambda r: r["time_us"])[:n]]

    try:
        for layout, page_size in (("token", 1), ("paged16", 16)):
            for Hkv, (name, pool) in product(kv, [(str(dtype)[6:], dtype), *pools.items()]):
                if pool == dtype:
                    measure(layout, page_size, Hkv, name, pool, [None])
                elif args.gluon:
                    measure(layout, page_size, Hkv, name, pool,
                            [triton_quant_config(Hq, Hkv, page_size), *GLUON], (1, 2))
                elif layout == "token":
                    measure(layout, page_size, Hkv, name, pool, CONFIGS)
                    measure(layout, page_size, Hkv, name, pool, best(layout, Hkv, name, 1), (2, 4))
                else:
                    top = best("token", Hkv, name, 1)
                    measure(layout, page_size, Hkv, name, pool, CONFIGS[:2] + [
                        c for c in top if c not in CONFIGS[:2]])  # fmt: skip
    except TimeoutError:
        sweep.spent()


if __name__ == "__main__":
    main()
