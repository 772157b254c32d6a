"""Where a scaled pool's decode time goes: the Gluon stage 1 with parts of its scale handling cut
out (by editing a copy of its source), timed beside the unchanged kernel on the sweep's shapes
(B64 L4096 head_dim 128, bf16 q, token layout and paged-16, MHA 32/32 and GQA 32/8).

Variants: `base` (unchanged, on the pool's `scale_pairs`), `two` (unchanged, on two scale
tensors: a load each), `noload` (no scale loads), `nomath` (no scale arithmetic), `against`
(the stage 1 in `--against`'s file). Cut variants compute wrong outputs: only their times
mean something.

    python -m bench.probes.decode_scale --out /tmp/probe [--pools fp8] [--tiles 64,128]
        [--variants base,two,noload,nomath] [--against FILE]
"""

import argparse
import json
import sys
import time
from dataclasses import replace
from functools import partial
from itertools import product
from pathlib import Path

import torch

import kernels.attention.decode_gluon as gluon_mod
from bench.kernels.attention import QUANT_POOLS, UNSCALED_POOLS, paged_pool
from bench.kernels.common import COPY_CEILING_GBPS, Preset, module_with_cuts, timeit
from bench.kernels.decode_quant_sweep import GLUON
from kernels.attention.decode import decode_attention, decode_num_splits

SRC = Path(gluon_mod.__file__).read_text()
PAIR_LOAD = """\
        pair = gl.load(k_scale_ptr + gl.expand_dims(k_at, 2) + kv[None, None, :],
                       mask=gl.expand_dims(keep, 2), other=0.0, cache_modifier=".cg")"""
CUTS = {
    "noload": [(PAIR_LOAD, "        pair = (gl.expand_dims(k_at, 2) + kv[None, None, :]) * 0.0")],
    "nomath": [("    if SCALED:\n        s = s * ", "    if False:\n        s = s * "),
               ("    if SCALED:\n        v_s = ", "    if False:\n        v_s = ")],
}
LAUNCH = "    _decode_quant_gluon_kernel[(Hkv, B, num_splits)]("


def variant(name: str, against: Path | None = None):
    """A module like `kernels.attention.decode_gluon` with `name`'s cuts (or, for "against",
    the source in that file); it keeps the last compiled kernel in `LAST`."""
    src = against.read_text() if name == "against" else SRC
    src = src.replace(LAUNCH, "    global LAST\n    LAST = " + LAUNCH.strip())
    return module_with_cuts(src, CUTS.get(name, []), f"dqg_{name}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--pools", default="fp8")
    ap.add_argument("--tiles", default="64,128")
    ap.add_argument("--variants", default="base,two,noload,nomath")
    ap.add_argument("--against", type=Path, help="another stage-1 source, timed as 'against'")
    ap.add_argument("--splits", default="1")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0, p = time.monotonic(), Preset(warmup=5, iters=20)
    B, L, Hq, D, dev = 64, 4096, 32, 128, "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(B, Hq, D, device=dev, dtype=torch.bfloat16, generator=gen)  # [B, Hq, D]
    seq_lens = torch.full((B,), L, dtype=torch.int32, device=dev)
    mods = {v: variant(v, args.against) for v in args.variants.split(",")}
    rows = []
    for (layout, ps), Hkv, pool in product((("token", 1), ("paged16", 16)), (Hq, Hq // 4),
                                           args.pools.split(",")):
        kv = [torch.randn(B, Hkv, L, D, device=dev, dtype=torch.bfloat16, generator=gen)
              for _ in "kv"]  # [B, Hkv, L, D]
        dtype = (QUANT_POOLS | UNSCALED_POOLS)[pool]
        k_buf, v_buf, indptr, indices, scales = paged_pool(*kv, ps, dtype, pool in QUANT_POOLS)
        nbytes = 2 * k_buf.nbytes // k_buf.shape[0] * B * L + 2 * q.nbytes
        nbytes += indices.nbytes + 2 * B * L * Hkv * 4 * bool(scales)
        two = {n: x.contiguous() for n, x in scales.items()}  # [S, Hkv] each
        for (vname, mod), block_n, mult in product(mods.items(), map(int, args.tiles.split(",")),
                                                   map(int, args.splits.split(","))):
            cfg = replace(GLUON[0], block_n=block_n, num_stages=2)
            splits = mult * decode_num_splits(B, Hkv, L, quantized=True)
            sys.modules["kernels.attention.decode_gluon"] = mod
            run = partial(decode_attention, q, k_buf, v_buf, indptr, indices, seq_lens, ps,
                          D**-0.5, num_splits=splits, config=cfg,
                          **(two if vname == "two" else scales))
            run()
            t = timeit(run, p)
            k = mod.LAST
            rows.append({"layout": layout, "heads": f"{Hq}/{Hkv}", "pool": pool, "variant": vname,
                         "block_n": block_n, "splits": splits, "time_us": round(t, 1),
                         "pct": round(100 * nbytes / t / 1e3 / COPY_CEILING_GBPS, 1),
                         "regs": k.n_regs, "spills": k.n_spills,
                         "elapsed_s": round(time.monotonic() - t0, 1)})
            print(" ".join(f"{a}={b}" for a, b in rows[-1].items()), flush=True)
            (args.out / "decode_scale_probe.json").write_text(json.dumps(rows, indent=1))
    sys.modules["kernels.attention.decode_gluon"] = gluon_mod


if __name__ == "__main__":
    main()
