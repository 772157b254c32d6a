"""Inline PTX that widens 8-bit KV codes to fp16 in registers, shared by the Gluon decode
stage 1 and the extend kernel. Each takes 32-bit words of 4 codes, byte 0 first."""

WIDEN_FP8 = (  # $2 (= $3 = $4 = $5): a word of 4 codes -> 4 fp16, in byte order
    "{ .reg .b16 a, b; mov.b32 {a, b}, $2;\n"
    "cvt.rn.f16x2.e4m3x2 $0, a; cvt.rn.f16x2.e4m3x2 $1, b; }"
)
PAIRS_FP8 = (  # $4 (= $5..$7): a word of key k; $8 (= $9..$11): of key k + 1 -> 4 (k, k+1) pairs
    "{ .reg .b32 lo, hi; .reg .b16 a, b, c, d;\n"
    "prmt.b32 lo, $4, $8, 0x5140; prmt.b32 hi, $4, $8, 0x7362;\n"
    "mov.b32 {a, b}, lo; mov.b32 {c, d}, hi;\n"
    "cvt.rn.f16x2.e4m3x2 $0, a; cvt.rn.f16x2.e4m3x2 $1, b;\n"
    "cvt.rn.f16x2.e4m3x2 $2, c; cvt.rn.f16x2.e4m3x2 $3, d; }"
)
# int8: code x + 128 as the low byte under 0x64 is the fp16 1024 + x + 128; minus 1152 is x
WIDEN_INT8 = (
    "{ .reg .b32 u, e, m, lo, hi; mov.b32 e, 0x64646464; mov.b32 m, 0x64806480;\n"
    "xor.b32 u, $2, 0x80808080; prmt.b32 lo, u, e, 0x4140; prmt.b32 hi, u, e, 0x4342;\n"
    "sub.f16x2 $0, lo, m; sub.f16x2 $1, hi, m; }"
)
PAIRS_INT8 = (
    "{ .reg .b32 a, b, e, m, lo, hi, p, q, r, t;\n"
    "mov.b32 e, 0x64646464; mov.b32 m, 0x64806480;\n"
    "xor.b32 a, $4, 0x80808080; xor.b32 b, $8, 0x80808080;\n"
    "prmt.b32 lo, a, b, 0x5140; prmt.b32 hi, a, b, 0x7362;\n"
    "prmt.b32 p, lo, e, 0x4140; prmt.b32 q, lo, e, 0x4342;\n"
    "prmt.b32 r, hi, e, 0x4140; prmt.b32 t, hi, e, 0x4342;\n"
    "sub.f16x2 $0, p, m; sub.f16x2 $1, q, m; sub.f16x2 $2, r, m; sub.f16x2 $3, t, m; }"
)
