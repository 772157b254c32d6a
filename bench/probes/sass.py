"""What the decode-attention kernels compile to on an H100/H200, without a GPU.

Triton compiles for sm_90 on any machine (its wheel ships ptxas and cuobjdump), so a kernel's
registers, stack (spills), shared memory, resident warps and the instructions of its main loop
can be read before spending device time on a sweep:

    python -m bench.probes.sass [--kernel decode-fp8] [--heads 32/32] [--block-n 128] [--warps 4]
                         [--stages 3] [--words] [--unscaled] [--maxnreg N] [--top 12]

Kernels: `decode-16` (the 16-bit stage 1, padded tl.dot) and `decode-fp8` / `decode-int8`
(the quantized stage 1), bf16 q, head_dim 128, token layout. The loop is the longest
backward branch; "per byte" divides its instructions x threads by the K/V bytes of a tile.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental import gluon

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
REGS_PER_SM, MAX_WARPS_PER_SM = 65536, 64
HEAD_DIM = 128
COMMON = ["kv_indptr_ptr", "kv_indices_ptr", "seq_lens_ptr", "mid_o_ptr", "mid_lse_ptr",
          "qk_scale", "num_splits", "stride_qb", "stride_qh", "stride_kvs", "stride_kvh"]
COMMON_TYPES = ["*i32", "*i32", "*i32", "*bf16", "*fp32", "fp32", "i32", "i32", "i32", "i32",
                "i32"]
SCALE_STRIDES = {"stride_ss": "i32", "stride_sh": "i32"}  # the quantized kernels' next args


def kernel_source(kind: str, q_heads: int, kv_heads: int, block_n: int, words: bool,
                  stages: int = 3, scaled: bool = True):
    """(jit function, signature, constexprs, K/V bytes a tile) of one stage-1 kernel (`scaled`
    False: a quantized kernel over an fp8 pool without scales)."""
    group = q_heads // kv_heads
    if kind.endswith("-gluon"):  # 4 warps x block_n / 4 keys (16 or 32), head_dim 128
        mod = importlib.import_module("kernels.attention.decode_gluon")
        ops = importlib.import_module("kernels.attention.gluon_operands")
        widen, pairs = ops.WIDEN_ASM[torch.int8 if kind == "decode-int8-gluon" else
                                     torch.float8_e4m3fn]
        names = ["q_ptr", "k_ptr", "v_ptr", "k_scale_ptr", "v_scale_ptr", *COMMON]
        types = ["*bf16", "*i32", "*i32", "*fp32", "*fp32", *COMMON_TYPES]
        keys = block_n // mod.WARPS
        k_ld, v_ld, v_pairs = ops.tile_layouts(keys)
        const = dict(Q_HEADS=q_heads, GROUP=group, PAGE_SIZE=1, PAIRS=pairs, WIDEN=widen,
                     KEYS=keys, STAGES=stages, SCALED=scaled, PAIRED=scaled, k_ld=k_ld,
                     v_ld=v_ld, v_pairs=v_pairs)  # the scales as the engine's pool holds them
        fn = mod._decode_quant_gluon_kernel
        return fn, dict(zip(names, types)) | SCALE_STRIDES, const, 2 * block_n * HEAD_DIM
    if kind == "decode-16":
        mod = importlib.import_module("kernels.attention.decode")
        names = ["q_ptr", "k_ptr", "v_ptr", *COMMON]
        types = ["*bf16", "*bf16", "*bf16", *COMMON_TYPES]
        const = dict(Q_HEADS=q_heads, GROUP=group, HEAD_DIM=HEAD_DIM, PAGE_SIZE=1, USE_DOT=True,
                     BLOCK_H=16, BLOCK_N=block_n, BLOCK_D=HEAD_DIM, PDL=False)
        return mod._decode_attention_kernel, dict(zip(names, types)), const, 4 * block_n * HEAD_DIM
    is_int = kind == "decode-int8"
    code = "*i32" if words else "*i8" if is_int else "*fp8e4nv"
    mod = importlib.import_module("kernels.attention.decode_quant")
    names = ["q_ptr", "k_ptr", "v_ptr", "k_scale_ptr", "v_scale_ptr", *COMMON]
    types = ["*bf16", code, code, "*fp32", "*fp32", *COMMON_TYPES]
    const = dict(Q_HEADS=q_heads, GROUP=group, HEAD_DIM=HEAD_DIM, PAGE_SIZE=1,
                 DOT_DTYPE=tl.float16, INT_OFFSET=is_int, IS_INT=is_int, WORDS=words,
                 PREFETCH=False, CODE_SCALE=256.0 if words and not is_int else 1.0,
                 SCALED=scaled, BLOCK_H=16, BLOCK_N=block_n, BLOCK_D=HEAD_DIM, PDL=False)
    tile_bytes = 2 * block_n * HEAD_DIM
    signature = dict(zip(names, types)) | SCALE_STRIDES
    return mod._decode_attention_quant_kernel, signature, const, tile_bytes


def compile_sm90(fn, signature: dict, const: dict, warps: int, stages: int,
                 maxnreg: int | None = None) -> tuple[dict, str]:
    """Compile a Triton or Gluon kernel for sm_90: (resource usage from cuobjdump, SASS text).
    Pointers and strides are marked 16-divisible, as Triton specializes them at a launch."""
    sig = {**signature, **{k: "constexpr" for k in const}}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(signature)
             if n.endswith("_ptr") or n.startswith("stride")}
    options = dict(num_warps=warps, num_stages=stages, **({"maxnreg": maxnreg} if maxnreg else {}))
    source = (gluon._runtime.GluonASTSource if isinstance(fn, gluon._runtime.GluonJITFunction)
              else ASTSource)
    k = triton.compile(source(fn, sig, constexprs=const, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(k.asm["cubin"])
        res = subprocess.run([BIN / "cuobjdump", "-res-usage", cubin], capture_output=True,
                             text=True, check=True).stdout
        sass = subprocess.run([BIN / "cuobjdump", "-sass", cubin], capture_output=True,
                              text=True, check=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+)", res)
    return {"registers": int(m.group(1)), "stack": int(m.group(2)),
            "shared": k.metadata.shared}, sass


def main_loop(sass: str) -> list[str]:
    """Opcodes (with modifiers) of the longest loop: the span of the longest backward branch."""
    instrs, loops = [], []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*)", line)
        if not m:
            continue
        addr, op = int(m.group(1), 16), m.group(2)
        instrs.append((addr, op))
        target = re.match(r"0x([0-9a-f]+)", m.group(3).strip())
        if op == "BRA" and target and int(target.group(1), 16) < addr:
            loops.append((int(target.group(1), 16), addr))
    if not loops:
        return []
    lo, hi = max(loops, key=lambda span: span[1] - span[0])
    return [op for addr, op in instrs if lo <= addr <= hi]


def report(args) -> dict:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("bench.probes.sass compiles for the GPU: unset TRITON_INTERPRET")
    q_heads, kv_heads = map(int, args.heads.split("/"))
    fn, sig, const, tile_bytes = kernel_source(args.kernel, q_heads, kv_heads, args.block_n,
                                               args.words, args.stages, not args.unscaled)
    usage, sass = compile_sm90(fn, sig, const, args.warps, args.stages, args.maxnreg)
    loop = main_loop(sass)
    threads = 32 * args.warps
    programs = min(REGS_PER_SM // (usage["registers"] * threads), MAX_WARPS_PER_SM // args.warps)
    ops: dict[str, int] = {}
    for op in loop:
        ops[op] = ops.get(op, 0) + 1
    return {**usage, "warps_per_sm": programs * args.warps, "loop_instructions": len(loop),
            "tile_bytes": tile_bytes, "per_byte": len(loop) * threads / tile_bytes,
            "top": sorted(ops.items(), key=lambda kv: -kv[1])[: args.top]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernel", default="decode-fp8", choices=("decode-16", "decode-fp8",
                                                               "decode-int8", "decode-fp8-gluon",
                                                               "decode-int8-gluon"))
    ap.add_argument("--heads", default="32/32", help="query / kv heads")
    ap.add_argument("--block-n", type=int, default=128)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--words", action="store_true", help="quantized: 32-bit word loads")
    ap.add_argument("--unscaled", action="store_true",
                    help="decode-fp8(-gluon): a pool without scales (per-tensor scale 1)")
    ap.add_argument("--maxnreg", type=int, default=None, help="cap registers a thread")
    ap.add_argument("--top", type=int, default=12, help="most frequent loop instructions")
    r = report(ap.parse_args())
    print(f"registers {r['registers']}, stack {r['stack']} B, shared {r['shared'] / 1024:.1f} KB,"
          f" {r['warps_per_sm']} warps an SM (by registers)")
    print(f"main loop: {r['loop_instructions']} instructions a thread for a "
          f"{r['tile_bytes'] // 1024} KB tile of K and V = {r['per_byte']:.2f} "
          "thread-instructions a byte")
    print("  " + ", ".join(f"{op} {n}" for op, n in r["top"]))


if __name__ == "__main__":
    main()
