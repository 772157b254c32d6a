"""Stage 1 of split-KV decode attention over an fp8 (e4m3) pool, in Gluon (explicit layouts).

The Triton stage 1 (`decode_attention_quant`) reads V's 8-bit tile back from shared memory one
byte at a time to build the tensor-core operand of `p @ v`. Here every operand is built in
registers, from layouts chosen so that a thread loads what its MMA fragments need
(`bench.gluon_fp8_operand` is the probe that checked the V half on the H200):
- the 4 warps split each 128-key tile, 32 keys each, and keep their own online softmax (the
  batch dimension of a rank-3 `mma_v2`); they merge once, after the loop;
- K^T's operand: a thread's 32 head_dim entries of a key are made one 32-byte run by
  permuting head_dim (the contraction: q is loaded under the same permutation);
- V's operand: a thread's 16 columns become one 16-byte run by permuting the output
  columns (undone at the store), and two keys' words become (key, key+1) fp16 pairs with
  `PRMT` + `cvt.rn.f16x2.e4m3x2` in one inline-assembly step;
- every relabelling is a reshape/permute, and each conversion into an MMA layout is asserted
  free of data movement.
Scales as in the Triton kernel: k_scale multiplies its key's score, v_scale its softmax
weight (normalized by the warp tile's largest). Head dim 128, group <= 16, fp8 only.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

WARPS, KEYS, ROWS, D = 4, 32, 16, 128  # warps; keys a warp takes of each tile; q rows; head dim

PAIRS_ASM = (  # $4, $5: 4 bytes of key k and of key k+1 -> 4 (k, k+1) fp16 pairs
    "{ .reg .b32 lo, hi; .reg .b16 a, b, c, d;\n"
    "prmt.b32 lo, $4, $5, 0x5140; prmt.b32 hi, $4, $5, 0x7362;\n"
    "mov.b32 {a, b}, lo; mov.b32 {c, d}, hi;\n"
    "cvt.rn.f16x2.e4m3x2 $0, a; cvt.rn.f16x2.e4m3x2 $1, b;\n"
    "cvt.rn.f16x2.e4m3x2 $2, c; cvt.rn.f16x2.e4m3x2 $3, d; }"
)


@gluon.jit
def _k_operand(k8, b_op: gl.constexpr):
    """K^T codes [4, 128 p, 32] -> fp16 B operand [4, 128 d, 32] (d = 8 m + 2 a + e)."""
    k = k8.to(gl.float16)
    k = k.reshape([4, 4, 16, 2, 32]).permute(0, 2, 1, 3, 4).reshape([4, 128, 32])
    return gl.convert_layout(k, b_op, assert_trivial=True)


@gluon.jit
def _v_operand(v8, v_pairs: gl.constexpr, b_op: gl.constexpr, PAIRS: gl.constexpr):
    """V codes [4, 32, 128 p] -> fp16 B operand [4, 32, 128 c] (c = n0 + 8 j)."""
    v8 = gl.convert_layout(v8, v_pairs)  # registers only
    # each 8 registers (c0', c1', r0') come back holding V[key r0 = c0', c0 = c1', c1 = r0']
    t = gl.inline_asm_elementwise(PAIRS, "=r,=r,=r,=r,r,r", [v8.to(gl.int8, bitcast=True)],
                                  dtype=gl.float16, is_pure=True, pack=8)
    t = t.reshape([4, 16, 2, 32, 2, 2]).permute(0, 1, 5, 3, 2, 4).reshape([4, 32, 128])
    v = t.reshape([4, 32, 8, 16]).permute(0, 1, 3, 2).reshape([4, 32, 128])  # logical
    return gl.convert_layout(v, b_op, assert_trivial=True)


@gluon.jit
def _decode_fp8_gluon_kernel(
    q_ptr, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, kv_indptr_ptr, kv_indices_ptr, seq_lens_ptr,
    mid_o_ptr, mid_lse_ptr, qk_scale, num_splits, stride_qb, stride_qh, stride_kvs, stride_kvh,
    Q_HEADS: gl.constexpr, GROUP: gl.constexpr, PAGE_SIZE: gl.constexpr, PAIRS: gl.constexpr,
):  # fmt: skip
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1, 1],
                                                  instr_shape=[1, 16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    # K^T tile [warp, 128 (physical head_dim p), 32 keys]: p = 32 a + 2 m + e holds logical
    # d = 8 m + 2 a + e (a = lane % 4): a thread's 32 bytes of a key are contiguous
    k_ld: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 1, 0], [0, 2, 0], [0, 4, 0], [0, 8, 0], [0, 16, 0], [0, 0, 8], [0, 0, 16]],
        lane_bases=[[0, 32, 0], [0, 64, 0], [0, 0, 1], [0, 0, 2], [0, 0, 4]],
        warp_bases=[[1, 0, 0], [2, 0, 0]], block_bases=[], shape=[4, 128, 32])
    # V tile [warp, 32 keys, 128 (physical column p)]: p = 16 n0 + j holds logical column
    # n0 + 8 j (n0 = lane // 4): a thread's 16 bytes of a key are contiguous
    v_ld: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [0, 1, 0], [0, 8, 0], [0, 16, 0]],
        lane_bases=[[0, 2, 0], [0, 4, 0], [0, 0, 16], [0, 0, 32], [0, 0, 64]],
        warp_bases=[[1, 0, 0], [2, 0, 0]], block_bases=[], shape=[4, 32, 128])
    # the same registers, ordered for PAIRS_ASM: 4 bytes of key k, then of key k + 1
    v_pairs: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 0, 4], [0, 0, 8], [0, 8, 0], [0, 16, 0]],
        lane_bases=[[0, 2, 0], [0, 4, 0], [0, 0, 16], [0, 0, 32], [0, 0, 64]],
        warp_bases=[[1, 0, 0], [2, 0, 0]], block_bases=[], shape=[4, 32, 128])
    s_rows: gl.constexpr = gl.SliceLayout(2, mma)  # [4, 16] per (warp, q row)
    s_keys: gl.constexpr = gl.SliceLayout(1, mma)  # [4, 32] per (warp, key)
    b = gl.program_id(0)
    kvh = gl.program_id(1)
    split = gl.program_id(2)
    seq_len = gl.load(seq_lens_ptr + b)
    split_len = gl.cdiv(gl.cdiv(seq_len, num_splits), 128) * 128
    start = split * split_len
    end = gl.minimum(start + split_len, seq_len)
    page_base = gl.load(kv_indptr_ptr + b)

    # q [4 (the same for every warp), 16 rows, 128 logical d] at physical p(d)
    qa: gl.constexpr = gl.SliceLayout(0, a_op)
    qr = gl.arange(0, 16, layout=gl.SliceLayout(1, qa))
    qd = gl.arange(0, 128, layout=gl.SliceLayout(0, qa))
    qp = 32 * ((qd // 2) % 4) + 2 * (qd // 8) + qd % 2
    q_mask = (qr < GROUP)[:, None] & (qd < 128)[None, :]
    q = gl.load(q_ptr + b * stride_qb + (kvh * GROUP + qr)[:, None] * stride_qh + qp[None, :],
                mask=q_mask, other=0.0)  # [16, 128]
    q = (q.to(gl.float32) * qk_scale).to(gl.float16)
    q = gl.convert_layout(gl.expand_dims(q, 0).broadcast_to([4, 16, 128]), a_op)

    # pointer pieces of the K^T and V tiles
    kw = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(1, k_ld)))
    kn = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, k_ld)))
    kp = gl.arange(0, 128, layout=gl.SliceLayout(0, gl.SliceLayout(2, k_ld)))
    vw = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, v_ld)))
    vn = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, v_ld)))
    vp = gl.arange(0, 128, layout=gl.SliceLayout(0, gl.SliceLayout(1, v_ld)))
    sw = gl.arange(0, 4, layout=gl.SliceLayout(1, s_keys))
    sn = gl.arange(0, 32, layout=gl.SliceLayout(0, s_keys))

    m = gl.full([4, 16], float("-inf"), gl.float32, layout=s_rows)
    l_sum = gl.zeros([4, 16], gl.float32, layout=s_rows)
    acc = gl.zeros([4, 16, 128], gl.float32, layout=mma)  # the output over c, per warp
    c = gl.full([4], 1.0, gl.float32, layout=gl.SliceLayout(1, s_rows))
    for n0 in range(start, end, 128):
        # K^T codes [4, 128, 32]: key n0 + 32 w + n
        k_key = n0 + 32 * kw[:, None] + kn[None, :]  # [4, 32]
        k_page = gl.load(kv_indices_ptr + page_base + k_key // PAGE_SIZE, mask=k_key < end,
                         other=0)
        k_slot = k_page.to(gl.int64) * PAGE_SIZE + k_key % PAGE_SIZE
        k_offs = gl.expand_dims(k_slot * stride_kvs + kvh * stride_kvh, 1) + kp[None, :, None]
        k8 = gl.load(k_ptr + k_offs, mask=gl.expand_dims(k_key < end, 1), other=0.0)
        # V codes [4, 16, 128]
        v_key = n0 + 32 * vw[:, None] + vn[None, :]  # [4, 32]
        v_page = gl.load(kv_indices_ptr + page_base + v_key // PAGE_SIZE, mask=v_key < end,
                         other=0)
        v_slot = v_page.to(gl.int64) * PAGE_SIZE + v_key % PAGE_SIZE
        v_offs = gl.expand_dims(v_slot * stride_kvs + kvh * stride_kvh, 2) + vp[None, None, :]
        v8 = gl.load(v_ptr + v_offs, mask=gl.expand_dims(v_key < end, 2), other=0.0)
        # scales [4, 32] per (warp, key)
        s_key = n0 + 32 * sw[:, None] + sn[None, :]
        s_slot = gl.convert_layout(v_slot, s_keys)  # V's keys sit in the same threads
        k_s = gl.load(k_scale_ptr + s_slot * (Q_HEADS // GROUP) + kvh, mask=s_key < end,
                      other=0.0)
        v_s = gl.load(v_scale_ptr + s_slot * (Q_HEADS // GROUP) + kvh, mask=s_key < end,
                      other=0.0)

        s = mma_v2(q, _k_operand(k8, b_op), gl.zeros([4, 16, 32], gl.float32, layout=mma))
        s = s * gl.expand_dims(k_s, 1)  # [4, 16 rows, 32 keys], base-2 logits
        s = gl.where(gl.expand_dims(s_key < end, 1), s, float("-inf"))
        m_new = gl.maximum(m, gl.max(s, 2))  # [4, 16]
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)  # a warp with no keys yet
        alpha = gl.exp2(m - m_safe)
        p = gl.exp2(s - gl.expand_dims(m_safe, 2))
        l_sum = l_sum * alpha + gl.sum(p, 2)
        v_max = gl.maximum(gl.max(v_s, 1), 1e-30)  # [4]
        w = (p * gl.expand_dims(v_s / gl.expand_dims(v_max, 1), 1)).to(gl.float16)
        # this tile's weights are in units of v_max: rescale acc to them, then accumulate
        v_max_rows = gl.convert_layout(v_max, gl.SliceLayout(1, s_rows))
        factor = alpha * gl.expand_dims(c / v_max_rows, 1)  # [4, 16]
        acc = mma_v2(gl.convert_layout(w, a_op, assert_trivial=True),
                     _v_operand(v8, v_pairs, b_op, PAIRS), acc * gl.expand_dims(factor, 2))
        c = v_max_rows
        m = m_new

    # merge the 4 warps: o = sum_w 2^(m_w - M) acc_w / sum_w 2^(m_w - M) l_w
    m_all = gl.max(m, 0)  # [16]
    m_all_safe = gl.where(m_all == float("-inf"), 0.0, m_all)
    f = gl.exp2(m - gl.expand_dims(m_all_safe, 0))  # [4, 16]
    l_all = gl.sum(l_sum * f, 0)  # [16]
    o = gl.sum(acc * gl.expand_dims(f * gl.expand_dims(c, 1), 2), 0)  # [16, 128] logical
    has_keys = l_all > 0
    l_safe = gl.where(has_keys, l_all, 1.0)
    lse = gl.where(has_keys, m_all + gl.log2(l_safe), float("-inf"))
    o_l: gl.constexpr = gl.SliceLayout(0, mma)
    o = o / gl.expand_dims(gl.convert_layout(l_safe, gl.SliceLayout(1, o_l)), 1)
    orow = gl.arange(0, 16, layout=gl.SliceLayout(1, o_l))
    ocol = gl.arange(0, 128, layout=gl.SliceLayout(0, o_l))
    row = b * Q_HEADS + kvh * GROUP + orow  # [16]
    phys = 16 * (ocol % 8) + ocol // 8  # logical column -> head_dim
    mid = (row[:, None] * num_splits + split) * 128 + phys[None, :]
    o_mask = (orow < GROUP)[:, None] & (ocol < 128)[None, :]
    gl.store(mid_o_ptr + mid, o.to(mid_o_ptr.dtype.element_ty), mask=o_mask)
    lse_rows = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, mma)))
    lse_row = b * Q_HEADS + kvh * GROUP + lse_rows
    gl.store(mid_lse_ptr + lse_row * num_splits + split, lse, mask=lse_rows < GROUP)


def decode_fp8_gluon_stage1(q, k_buf, v_buf, k_scale, v_scale, kv_indptr, kv_indices, seq_lens,
                            mid_o, mid_lse, page_size: int, qk_scale: float) -> None:
    """The Gluon stage 1 over an fp8 pool: same operands and partial outputs as
    `decode_attention_quant_stage1` (head_dim 128, a GQA group of at most 16)."""
    B, Hq, Dq = q.shape
    Hkv = k_buf.shape[1]
    assert Dq == D and Hq // Hkv <= ROWS, "the Gluon stage 1 takes head_dim 128, groups <= 16"
    num_splits = mid_lse.shape[2]
    _decode_fp8_gluon_kernel[(B, Hkv, num_splits)](
        q, k_buf, v_buf, k_scale, v_scale, kv_indptr, kv_indices, seq_lens, mid_o, mid_lse,
        qk_scale, num_splits, q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1),
        Q_HEADS=Hq, GROUP=Hq // Hkv, PAGE_SIZE=page_size, PAIRS=PAIRS_ASM, num_warps=WARPS,
    )  # fmt: skip


