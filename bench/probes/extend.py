"""Where extend attention over a scaled prefix loses to a 16-bit one: the kernel with parts of
the quantized path cut out (by editing a copy of its source), timed beside the unchanged
kernel (head_dim 128, bf16 q, paged-16, B4 x prefix 2,048 + 512 new, GQA 32/8 and MHA).

Variants, each at its pool's default config: `base` (unchanged, every pool); over a scaled
fp8/int8 pool `nomath` (codes widened, not scaled) and `noload` (no scale loads: scale 1);
over the 16-bit pool `regpath` (K and V multiplied by a runtime 1 in registers before the
products, as widened codes are scaled, so they cannot go from the load pipeline's shared
memory straight into the tensor cores); over every pool `masked` (every key tile loaded and
scored under its masks, as the kernel did before full tiles went unmasked), `per-head`
(a program's rows the tokens of one query head, not packed with its kv head's others, as
before packing, but launched row blocks first as unpacked programs are now), `seq-first`
and `rows-first` (every batch launched sequences first, as before launch orders were
chosen, or row blocks first). Cut variants compute wrong outputs
(`regpath`, `masked`, `per-head` and the launch orders the right ones): only their times
mean something. Each case passes its prefix length as `max_prefix_len`, as the engine does
(a case without a prefix runs the 16-bit kernel, launched as such, whatever the pool).

    python -m bench.probes.extend --out /tmp/xprobe [--pools bfloat16,fp8,int8]
                                 [--variants base,masked] [--cases 4x0x2048x32x8,...] [--graph]
"""

import argparse
import importlib.util
import json
import sys
import time
from functools import partial
from pathlib import Path

import torch

from bench.kernels.attention import QUANT_POOLS, paged_pool
from bench.kernels.common import Preset, module_with_cuts, timeit

# (`kernels` exports the function under the module's name: find the modules by their specs)
SRC = Path(importlib.util.find_spec("kernels.attention.extend").origin).read_text()
TILES_SRC = Path(importlib.util.find_spec("kernels.attention.extend_tiles").origin).read_text()
ONE = "(slot * 0).to(tl.float32) + 1.0"
SCALE_LOADS = [  # the scale loads of masked and full tiles
    (f"tl.load({x}_scale_ptr + slot * stride_ss{tail})", ONE)
    for x in "kv" for tail in (", mask=mask_n, other=0.0", "")
]
STEP = ("    m, l_sum, alpha, p = _softmax_step(q_prefix, k, mask_n[None, :], m, l_sum, "
        "prefix_scale,")
ORDER = "packed_prefix=rows > 1 and prefix"
CUTS = {
    "nomath": [("    return x.to(DT) * scale.to(DT)[:, None]", "    return x.to(DT)")],
    "noload": SCALE_LOADS,
    "regpath": [(STEP, "    unit = prefix_scale / prefix_scale  # 1, not foldable\n"
                       "    k = (k * unit).to(k.dtype)\n"
                       "    v = (v * unit).to(v.dtype)\n" + STEP)],
    "masked": [("MASK=False", "MASK=True")],
    "per-head": [("rows_per_token(Hq, Hkv, pack_heads)", "rows_per_token(Hq, Hkv, False)")],
    "seq-first": [(ORDER, "packed_prefix=True")],
    "rows-first": [(ORDER, "packed_prefix=False")],
}
ORDERS = ("seq-first", "rows-first")
POOL_VARIANTS = {"bfloat16": ("base", "masked", "per-head", "regpath", *ORDERS),
                 "fp8": ("base", "masked", "per-head", "nomath", "noload", *ORDERS),
                 "int8": ("base", "masked", "per-head", "nomath", "noload", *ORDERS)}  # fmt: skip
CASES = [(4, 2048, 512, 32, 8), (4, 2048, 512, 32, 32)]  # (B, prefix, new, Hq, Hkv)


def variant(name: str):
    """A module like `kernels.attention.extend` with `name`'s cuts, made in it or in the
    key tiles it imports (`kernels.attention.extend_tiles`, then rebuilt as well)."""
    cuts = CUTS.get(name, [])
    tiles = module_with_cuts(TILES_SRC, [c for c in cuts if c[0] in TILES_SRC],
                             f"extend_tiles_{name.replace('-', '_')}")  # fmt: skip
    sys.modules[tiles.__name__] = tiles  # for the rebuilt kernel's import
    own = [c for c in cuts if c[0] not in TILES_SRC]
    own.append(("from kernels.attention.extend_tiles import", f"from {tiles.__name__} import"))
    return module_with_cuts(SRC, own, f"extend_{name.replace('-', '_')}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--pools", default="bfloat16,fp8,int8")
    ap.add_argument("--variants", default=None, help="comma-separated (default: all)")
    ap.add_argument("--graph", action="store_true",
                    help="time replays of a CUDA graph (short kernels: not their launch)")
    ap.add_argument("--cases", default=None,
                    help="comma-separated BxPREFIXxNEWxHQxHKV cases instead of CASES")
    args = ap.parse_args()
    cases = ([tuple(map(int, c.split("x"))) for c in args.cases.split(",")] if args.cases
             else CASES)  # fmt: skip
    wanted = set(args.variants.split(",")) if args.variants else None
    args.out.mkdir(parents=True, exist_ok=True)
    t0, p, dev, D = time.monotonic(), Preset(warmup=3, iters=20), "cuda", 128
    mods = {v: variant(v) for v in ("base", *CUTS)}
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for B, prefix, new, Hq, Hkv in cases:
        q, kn, vn = (torch.randn(B * new, h, D, device=dev, dtype=torch.bfloat16, generator=gen)
                     for h in (Hq, Hkv, Hkv))  # [T, H, D]  # fmt: skip
        kc, vc = (torch.randn(B, Hkv, max(prefix, 16), D, device=dev, dtype=torch.bfloat16,
                              generator=gen)
                  for _ in "kv")  # [B, Hkv, prefix, D]  # fmt: skip
        qo = torch.arange(B + 1, device=dev, dtype=torch.int32) * new
        prefix_lens = torch.full((B,), prefix, dtype=torch.int32, device=dev)
        for pool in args.pools.split(","):
            dtype = QUANT_POOLS.get(pool, torch.bfloat16)
            k_buf, v_buf, indptr, indices, scales = paged_pool(kc, vc, 16, dtype)
            for name in POOL_VARIANTS[pool]:
                if wanted is not None and name not in wanted:
                    continue
                run = partial(mods[name].extend_attention, q, kn, vn, k_buf, v_buf, qo,
                              prefix_lens, indptr, indices, 16, D**-0.5, max_new_len=new,
                              max_prefix_len=prefix, **scales)  # fmt: skip
                run()
                rows.append({"case": f"B{B} prefix{prefix} new{new} H{Hq}/{Hkv}", "pool": pool,
                             "variant": name, "time_us": round(timeit(run, p, graph=args.graph), 1),
                             "elapsed_s": round(time.monotonic() - t0, 1)})  # fmt: skip
                print(" ".join(f"{a}={b}" for a, b in rows[-1].items()), flush=True)
                (args.out / "extend_probe.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
