"""Launch-config sweep of extend attention over a 16-bit, fp8, int8 and unscaled fp8
(`fp8_e4m3`) cached prefix (GPU); the unscaled pool twice: its default (scored on fp8 tensor
cores where the GPU has them) and `fp8_e4m3 f16-scores` (q and the prefix in fp16).

Each case of `CASES` is B sequences of a cached prefix plus new tokens (head_dim 128, bf16 q,
paged-16 pool). For each pool it times every config of `CONFIGS`; `default` marks the one
`default_extend_config` picks here. `vs16` is the 16-bit pool's default over this row's time
(nan where that default is not in `CONFIGS`), `vs16best` the 16-bit pool's fastest config over
it (the issue's bar: a quantized prefix no slower than a 16-bit one). Each case passes its
prefix length as `max_prefix_len`: without a prefix every pool runs the 16-bit kernel (and
its default config, as a quantized prefix under `SHORT_RUN` query rows does). TFLOP/s counts the
attention's two matmuls; `diff` is the max |o - o of the 16-bit pool's first config|. Each
row is printed and the JSON rewritten as it lands, so a time limit keeps what finished.

    python -m bench.kernels.extend_sweep --out /tmp/ext [--budget-s 120] [--smoke] [--quick]
                                 [--graph] [--configs 64x64x4x3,256x64x16x2]
                                 [--pools bfloat16,fp8,int8]
                                 [--cases 4x0x2048x32x8,16x2048x64x32x8]
"""

from dataclasses import asdict
from functools import partial

import torch

from bench.kernels.attention import QUANT_POOLS, UNSCALED_POOLS, paged_pool
from bench.kernels.common import Preset, timeit
from bench.kernels.sweep_run import SweepRun, sweep_parser
from kernels.attention.extend import extend_attention
from kernels.attention.extend_config import ExtendConfig, default_extend_config, rows_per_token

CASES = [  # (B, prefix, new, Hq, Hkv)
    (4, 2048, 512, 32, 8),
    (4, 2048, 512, 32, 32),
    (2, 8192, 1024, 32, 8),
]
CONFIGS = [  # the 16-bit default first: the rows after it compare with it
    ExtendConfig(block_m=m, block_n=n, num_warps=w, num_stages=s)
    for m, n, w, s in [(64, 64, 4, 3), (64, 64, 4, 2), (128, 32, 4, 2), (128, 64, 8, 1),
                       (128, 64, 8, 3), (128, 128, 8, 1), (128, 128, 8, 2), (128, 128, 8, 3)]
]  # fmt: skip


def main():
    ap = sweep_parser(__doc__.split("\n")[0], 120.0)
    ap.add_argument("--quick", action="store_true",
                    help="only the 16-bit default and the 128 x 128 tiles in 2 and 3 stages")
    ap.add_argument("--configs", default=None,
                    help="comma-separated MxNxWARPSxSTAGES tiles instead of CONFIGS "
                         "(the first is the 16-bit baseline the rows compare with)")
    ap.add_argument("--pools", default=None,
                    help="comma-separated pool names (default: all; the 16-bit baseline "
                         "always runs)")
    ap.add_argument("--graph", action="store_true",
                    help="time replays of a CUDA graph (short kernels: not their launch)")
    ap.add_argument("--cases", default=None,
                    help="comma-separated BxPREFIXxNEWxHQxHKV cases instead of CASES")
    args = ap.parse_args()
    sweep, p = SweepRun(args.out, "extend_sweep", args.budget_s), Preset(warmup=3, iters=10)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    cases, configs = ([(2, 48, 24, 4, 2)], CONFIGS[:2]) if args.smoke else (CASES, CONFIGS)
    if args.quick:
        configs = [CONFIGS[0], *(c for c in CONFIGS if c.block_m == c.block_n == 128
                                 and c.num_stages > 1)]  # fmt: skip
    if args.cases:
        cases = [tuple(map(int, c.split("x"))) for c in args.cases.split(",")]
    if args.configs:
        configs = [ExtendConfig(*map(int, c.split("x"))) for c in args.configs.split(",")]
    D = 32 if args.smoke else 128
    gen = torch.Generator(device=dev).manual_seed(0)
    try:
        for B, prefix, new, Hq, Hkv in cases:
            T = B * new
            q, kn, vn = (torch.randn(T, h, D, device=dev, dtype=dtype, generator=gen)
                         for h in (Hq, Hkv, Hkv))  # [T, H, D]  # fmt: skip
            kc, vc = (torch.randn(B, Hkv, prefix, D, device=dev, dtype=dtype, generator=gen)
                      for _ in "kv")  # [B, Hkv, prefix, D]  # fmt: skip
            qo = torch.arange(B + 1, device=dev, dtype=torch.int32) * new
            prefix_lens = torch.full((B,), prefix, dtype=torch.int32, device=dev)
            flops = 4 * D * Hq * B * (new * prefix + new * (new + 1) / 2)
            q_rows = new * rows_per_token(Hq, Hkv)  # as the launcher packs them
            case, ref, base = f"B{B} prefix{prefix} new{new} H{Hq}/{Hkv} D{D} paged16", None, {}
            pools = [(str(dtype)[6:], dtype, {}),
                     *((n, d, {}) for n, d in (QUANT_POOLS | UNSCALED_POOLS).items()),
                     *((f"{n} f16-scores", d, {"fp8_scores": False})
                       for n, d in UNSCALED_POOLS.items())]  # fmt: skip
            if args.pools:
                pools = [x for x in pools if x[1] == dtype or x[0] in args.pools.split(",")]
            for name, pool, extra in pools:
                k_buf, v_buf, indptr, indices, scales = paged_pool(
                    kc, vc, 16, pool, name.split()[0] not in UNSCALED_POOLS)
                for cfg in configs:
                    sweep.check_budget()
                    run = partial(extend_attention, q, kn, vn, k_buf, v_buf, qo, prefix_lens,
                                  indptr, indices, 16, D**-0.5, max_new_len=new,
                                  max_prefix_len=prefix, config=cfg, **scales,
                                  **extra)  # fmt: skip
                    out = run()
                    ref = out if ref is None else ref
                    t = timeit(run, p, graph=args.graph)
                    default = cfg == default_extend_config(D, pool != dtype and prefix > 0,
                                                           q.device, rows=q_rows)
                    if pool == dtype:
                        base["best"] = min(base.get("best", t), t)
                        if default:
                            base["default"] = t
                    sweep.add({"case": case, "pool": name, "config": asdict(cfg),
                               "default": default, "time_us": t, "tflops": flops / t / 1e6,
                               "vs16": base.get("default", float("nan")) / t,
                               "vs16best": base["best"] / t,
                               "diff": (out - ref).abs().max().item()})  # fmt: skip
    except TimeoutError:
        sweep.spent()


if __name__ == "__main__":
    main()
