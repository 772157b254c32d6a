"""The register-level MMA operands of the Gluon decode stage 1 (`decode_attention_gluon`):
the load layouts of a tile of 8-bit K/V codes carried as 32-bit words, and their widening to
the fp16 B operands of `mma_v2` by inline PTX (`widen_ptx`), every relabelling a reshape or
permute that moves no data."""

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from kernels.widen_ptx import PAIRS_FP8, PAIRS_INT8, WIDEN_FP8, WIDEN_INT8

# pool dtype -> (the K widening, the V pair widening)
WIDEN_ASM = {torch.float8_e4m3fn: (WIDEN_FP8, PAIRS_FP8), torch.int8: (WIDEN_INT8, PAIRS_INT8)}


@functools.cache
def tile_layouts(keys: int):
    """(k_ld, v_ld, v_pairs): the load layouts of a tile of 4 warps x `keys` keys, in 32-bit
    words of 4 codes (u: word p // 4 of a key's 128 bytes; words, unlike bytes, stay packed
    four codes a register when a loop carries them).

    k_ld, K^T [warp, 32 u, keys]: byte p = 32 a + 2 m + e holds logical d = 8 m + 2 a + e
    (a = lane % 4), so a thread's 8 words of a key are contiguous.
    v_ld, V [warp, keys, 32 u]: byte p = 16 n0 + j holds logical column n0 + 8 j
    (n0 = lane // 4), so a thread's 4 words of a key are contiguous.
    v_pairs: v_ld's registers reordered for the PAIRS asm: a word of key k, then of key k + 1.
    """
    k_keys = [[0, 0, 8], [0, 0, 16]][: keys // 16]
    v_keys = [[0, 8, 0], [0, 16, 0]][: keys // 16]
    warps = dict(warp_bases=[[1, 0, 0], [2, 0, 0]], block_bases=[])
    v_lanes = [[0, 2, 0], [0, 4, 0], [0, 0, 4], [0, 0, 8], [0, 0, 16]]
    k_ld = gl.DistributedLinearLayout(
        reg_bases=[[0, 1, 0], [0, 2, 0], [0, 4, 0], *k_keys],
        lane_bases=[[0, 8, 0], [0, 16, 0], [0, 0, 1], [0, 0, 2], [0, 0, 4]],
        shape=[4, 32, keys], **warps)
    v_ld = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 0, 2], [0, 1, 0], *v_keys],
        lane_bases=v_lanes, shape=[4, keys, 32], **warps)
    v_pairs = gl.DistributedLinearLayout(
        reg_bases=[[0, 1, 0], [0, 0, 1], [0, 0, 2], *v_keys],
        lane_bases=v_lanes, shape=[4, keys, 32], **warps)
    return k_ld, v_ld, v_pairs


@gluon.jit
def _copies4(x):
    """x [..] -> [.., 2, 2]: each element 4 times, in consecutive registers (no instruction)."""
    return gl.join(gl.join(x, x), gl.join(x, x))


@gluon.jit
def _k_operand(kw, b_op: gl.constexpr, WIDEN: gl.constexpr, KEYS: gl.constexpr):
    """K^T words [4, 32 u, KEYS] -> fp16 B operand [4, 128 d, KEYS] (d = 8 m + 2 a + e)."""
    k = gl.inline_asm_elementwise(WIDEN, "=r,=r,r,r,r,r", [_copies4(kw)], dtype=gl.float16,
                                  is_pure=True, pack=4)  # [4, 32, KEYS, byte // 2, byte % 2]
    k = k.permute(0, 1, 3, 4, 2).reshape([4, 128, KEYS])  # byte p = 4 u + byte
    k = k.reshape([4, 4, 16, 2, KEYS]).permute(0, 2, 1, 3, 4).reshape([4, 128, KEYS])
    return gl.convert_layout(k, b_op, assert_trivial=True)


@gluon.jit
def _v_operand(vw, v_pairs: gl.constexpr, b_op: gl.constexpr, PAIRS: gl.constexpr,
               KEYS: gl.constexpr):
    """V words [4, KEYS, 32 u] -> fp16 B operand [4, KEYS, 128 c] (c = n0 + 8 j)."""
    vw = gl.convert_layout(vw, v_pairs)  # registers only
    # each 8 registers (x, y, r0') come back holding V[key r0 = y, byte (r0', x)]
    t = gl.inline_asm_elementwise(PAIRS, "=r,=r,=r,=r,r,r,r,r,r,r,r,r", [_copies4(vw)],
                                  dtype=gl.float16, is_pure=True, pack=8)
    t = t.reshape([4, KEYS // 2, 2, 32, 2, 2]).permute(0, 1, 5, 3, 2, 4)
    t = t.reshape([4, KEYS, 128])  # byte p = 4 u + 2 r0' + x
    v = t.reshape([4, KEYS, 8, 16]).permute(0, 1, 3, 2).reshape([4, KEYS, 128])  # logical
    return gl.convert_layout(v, b_op, assert_trivial=True)
