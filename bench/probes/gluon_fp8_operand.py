"""An fp8 V tile as a tensor-core operand without the byte-by-byte transpose: a probe.

Decode attention's `p @ v` contracts over keys, and the pool stores V key-major, so each MMA B
register needs two keys' bytes for one column. Triton's quantized decode kernel gets there
through shared memory one byte at a time (`LDS.U8` plus `IMAD.MOV`: `python -m bench.probes.sass
--kernel decode-fp8`). Gluon (Triton's explicit-layout dialect, in Triton 3.6 and newer) lets a
kernel choose its load layout:
- each thread loads 4-byte words of two adjacent keys (the columns it owns, made contiguous by
  a column permutation that the output store undoes);
- one inline-assembly step turns two words into four (key, key+1) fp16 pairs (2 `PRMT`,
  4 conversions);
- reshapes and permutes relabel registers, and the conversion to the MMA operand layout is
  asserted trivial (no data movement).

This module compiles that loop (P `[16, 64]` fp16 times V `[64, 128]` e4m3 tiles, `mma_v2`)
for sm_90 on any machine and reports its instruction mix, the same way `bench.probes.sass` does;
on a GPU, `--check` also runs it against torch. It is a measured design note for the quantized
decode kernel, not a runtime kernel.

    python -m bench.probes.gluon_fp8_operand [--check]
"""

from __future__ import annotations

import argparse
import os
from collections import Counter

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from bench.probes.sass import compile_sm90, main_loop

KEYS, COLS, ROWS = 64, 128, 16  # a V tile, and P's rows (a GQA group padded to the MMA)
# two rows' words -> four (key, key+1) fp16 pairs; $4 holds row k's 4 bytes, $5 row k+1's
PAIRS_ASM = (
    "{ .reg .b32 lo, hi; .reg .b16 a, b, c, d;\n"
    "prmt.b32 lo, $4, $5, 0x5140; prmt.b32 hi, $4, $5, 0x7362;\n"
    "mov.b32 {a, b}, lo; mov.b32 {c, d}, hi;\n"
    "cvt.rn.f16x2.e4m3x2 $0, a; cvt.rn.f16x2.e4m3x2 $1, b;\n"
    "cvt.rn.f16x2.e4m3x2 $2, c; cvt.rn.f16x2.e4m3x2 $3, d; }"
)


@gluon.jit
def _pv_kernel(v_ptr, p_ptr, o_ptr, stride_v, n_tiles, PAIRS: gl.constexpr):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4],
                                                  instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    # b_l over [64 keys, 128 logical columns] gives a thread columns n0 + 32 j (j = 0..3); in
    # physical columns 4 n0 + j they are one 4-byte word. Registers: 4 bytes, then key + 1.
    ld: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [1, 0], [8, 0], [16, 0], [32, 0]],
        lane_bases=[[2, 0], [4, 0], [0, 4], [0, 8], [0, 16]],
        warp_bases=[[0, 32], [0, 64]], block_bases=[], shape=[64, 128])
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, ld))
    cols = gl.arange(0, 128, layout=gl.SliceLayout(0, ld))
    pr = gl.arange(0, 16, layout=gl.SliceLayout(1, a_l))
    pc = gl.arange(0, 64, layout=gl.SliceLayout(0, a_l))
    p = gl.load(p_ptr + pr[:, None] * 64 + pc[None, :])  # [16, 64] fp16
    acc = gl.zeros([16, 128], gl.float32, layout=mma)
    for t in range(n_tiles):
        v8 = gl.load(v_ptr + (t * 64 + rows)[:, None] * stride_v + cols[None, :])  # [64, 128]
        # slot (c0', c1', r0') of each 8 holds V[key r0 = c0', column bits c0 = c1', c1 = r0']
        pairs = gl.inline_asm_elementwise(PAIRS, "=r,=r,=r,=r,r,r", [v8.to(gl.int8, bitcast=True)],
                                          dtype=gl.float16, is_pure=True, pack=8)
        v = pairs.reshape([32, 2, 32, 2, 2]).permute(0, 4, 2, 1, 3).reshape([64, 128])
        v = v.reshape([64, 32, 4]).permute(0, 2, 1).reshape([64, 128])  # logical columns
        acc = mma_v2(p, gl.convert_layout(v, b_l, assert_trivial=True), acc)
    orow = gl.arange(0, 16, layout=gl.SliceLayout(1, mma))
    ocol = gl.arange(0, 128, layout=gl.SliceLayout(0, mma))
    gl.store(o_ptr + orow[:, None] * 128 + ((ocol % 32) * 4 + ocol // 32)[None, :], acc)


SIGNATURE = {"v_ptr": "*fp8e4nv", "p_ptr": "*fp16", "o_ptr": "*fp32", "stride_v": "i32",
             "n_tiles": "i32"}


def report() -> dict:
    """Compile for sm_90 (no GPU needed): registers and the loop's instruction mix."""
    os.environ.pop("TRITON_INTERPRET", None)
    usage, sass = compile_sm90(_pv_kernel, SIGNATURE, {"PAIRS": PAIRS_ASM}, warps=4, stages=1)
    loop = main_loop(sass)
    tile = KEYS * COLS  # bytes of V a loop step reads, over 128 threads
    shared = sum(op.startswith(("LDS", "STS", "LDSM")) for op in loop)
    return {**usage, "loop_instructions": len(loop), "per_byte": len(loop) * 128 / tile,
            "shared": shared, "mix": Counter(loop).most_common(10)}


def check_gpu(n_tiles: int = 5) -> float:
    """Run the probe on random data; the largest |error| against torch's P @ V (fp32)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    v = (torch.randn(n_tiles * KEYS, COLS, device="cuda", generator=gen) * 4).to(
        torch.float8_e4m3fn)
    p = torch.rand(ROWS, KEYS, device="cuda", generator=gen).half()
    o = torch.empty(ROWS, COLS, device="cuda")
    _pv_kernel[(1,)](v, p, o, v.stride(0), n_tiles, PAIRS_ASM, num_warps=4)
    want = sum(p.float() @ v[t * KEYS:(t + 1) * KEYS].float() for t in range(n_tiles))
    return (o - want).abs().max().item() / want.abs().max().item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="also run it on the GPU")
    args = ap.parse_args()
    r = report()
    print(f"loop: {r['loop_instructions']} instructions a thread per {KEYS * COLS // 1024} KB "
          f"V tile = {r['per_byte']:.2f} thread-instructions a byte")
    print("  " + ", ".join(f"{op} {n}" for op, n in r["mix"]))
    print(f"shared-memory instructions in the loop: {r['shared']}")
    if args.check:
        print(f"GPU: max |error| / max |P @ V| = {check_gpu():.2e}")


if __name__ == "__main__":
    main()
