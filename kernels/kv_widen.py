"""Widen a quantized KV tile (float8 e4m3 or int8) to fp16 in registers, for the tensor cores.

Both formats are exact in fp16 (e4m3 has 3 mantissa bits and a range of 448; int8 needs 8 bits),
so the attention kernels run their dots in fp16 on the widened tile and apply the per-row
scales to the scores and softmax weights instead of to every element.

On a GPU the widening is inline PTX over four bytes at a time: e4m3 pairs go through Hopper's
`cvt.rn.f16x2.e4m3x2`; int8 bytes, offset to unsigned, are permuted under the fp16 exponent of
1024 (bits 0x64XX = 1024 + XX) and 1152 is subtracted from each half. The asm is marked
impure on purpose: Triton would otherwise move a pure conversion behind the shared-memory load
of the dot operand, where an 8-bit tile that must be transposed (V in `p @ v`) is read one byte
at a time. Kept in front, the fp16 tile takes the same ldmatrix path as a 16-bit pool's. The
Triton interpreter (CPU) has no inline asm: `ASM=False` there casts, with the same result.
"""

import triton
import triton.language as tl


@triton.jit
def widen_to_fp16(x, ASM: tl.constexpr):
    """`x` (float8e4nv or int8, any shape whose last dim is a multiple of 4) as exact fp16."""
    if not ASM:
        return x.to(tl.float16)
    if x.dtype == tl.int8:
        return tl.inline_asm_elementwise(
            """{
            .reg .b32 t, lo, hi, bias;
            mov.b32 bias, 0x64806480;
            xor.b32 t, $2, 0x80808080;
            prmt.b32 lo, t, 0x64646464, 0x4140;
            prmt.b32 hi, t, 0x64646464, 0x4342;
            sub.f16x2 $0, lo, bias;
            sub.f16x2 $1, hi, bias;
            }""",
            "=r,=r,r",
            [x],
            dtype=tl.float16,
            is_pure=False,
            pack=4,
        )
    return tl.inline_asm_elementwise(
        """{
        .reg .b16 lo, hi;
        mov.b32 {lo, hi}, $2;
        cvt.rn.f16x2.e4m3x2 $0, lo;
        cvt.rn.f16x2.e4m3x2 $1, hi;
        }""",
        "=r,=r,r",
        [x.to(tl.uint8, bitcast=True)],
        dtype=tl.float16,
        is_pure=False,
        pack=4,
    )
