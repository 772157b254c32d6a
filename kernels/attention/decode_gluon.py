"""Stage 1 of split-KV decode attention over an fp8 (e4m3) or int8 pool, in Gluon (explicit
layouts): the default for such pools with head_dim 128 (fp8 on sm_89+, int8 on sm_80+).

The Triton stage 1 (`decode_attention_quant`) reads V's 8-bit tile back from shared memory one
byte at a time to build the tensor-core operand of `p @ v`. Here every operand is built in
registers (`gluon_operands`), from layouts chosen so that a thread holds what its MMA fragments
need (`bench.probes.gluon_fp8_operand` is the probe that checked the V half on the H200):
- the 4 warps split each tile of `block_n` keys and keep their own online softmax (the batch
  dimension of a rank-3 `mma_v2`); they merge once, after the loop;
- tiles are copied global -> shared with `cp.async` (16 bytes a copy) into a ring of
  `num_stages` stages, swizzled so neither the copies nor the loads conflict on banks; the
  next tile's page ids load while a tile computes. A warp's copy covers whole 128-byte key
  rows (4 lines), since the memory system's limit here is line requests, not bytes;
- K and V are handled as 32-bit words of 4 codes (a loop carries words packed, bytes not);
- K^T's operand: a thread's 32 head_dim entries of a key are made one 32-byte run by
  permuting head_dim (the contraction: q is loaded under the same permutation);
- V's operand: a thread's 16 columns become one 16-byte run by permuting the output columns
  (undone at the store), and two keys' words become (key, key+1) fp16 pairs with `PRMT` +
  `cvt.rn.f16x2.e4m3x2` in one inline-assembly step (int8: `PRMT` each code under the
  exponent byte of 1024 and subtract 1152, exact for -128..127);
- every relabelling is a reshape/permute, and each conversion into an MMA layout is asserted
  free of data movement.
Scales as in the Triton kernel: k_scale multiplies its key's score, v_scale its softmax
weight (normalized by the warp tile's largest); an unscaled fp8 pool (SCALED off) reads none.
They load into registers a tile ahead, a key a lane, and go to the tile's stage before it is
read; a pool's `scale_pairs` (PAIRED) give a key's two in one 8-byte load, one line request
where two tensors take two. Programs run a sequence's KV heads side by side, so the heads
share the scales' sectors in L2. Head dim 128, group <= 16.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from kernels.attention.gluon_operands import WIDEN_ASM, _k_operand, _v_operand, tile_layouts
from kernels.kv.store import paired_scales

WARPS, ROWS, D = 4, 16, 128  # warps; q rows; head dim
# renamed after Triton 3.6
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared


@gluon.jit
def _pages(kv_indices_ptr, page_base, n0, end, k_rel, v_rel, c_rel, PAGE_SIZE: gl.constexpr,
           SCALED: gl.constexpr):
    """Page ids of the tile at key n0, in K's copies', V's copies' and (SCALED) the scales'
    layouts (keys past `end`: 0)."""
    k_page = gl.load(kv_indices_ptr + page_base + (n0 + k_rel) // PAGE_SIZE,
                     mask=n0 + k_rel < end, other=0)
    v_page = gl.load(kv_indices_ptr + page_base + (n0 + v_rel) // PAGE_SIZE,
                     mask=n0 + v_rel < end, other=0)
    s_page = v_page  # no scale to load
    if SCALED:
        s_page = gl.load(kv_indices_ptr + page_base + (n0 + c_rel) // PAGE_SIZE,
                         mask=n0 + c_rel < end, other=0)
    return k_page, v_page, s_page


@gluon.jit
def _issue_tile(k_smem, v_smem, k_ptr, v_ptr, end, kvh, stride_kvs, stride_kvh, k_rel, v_rel,
                kp, vp, k_page, v_page, n0, PAGE_SIZE: gl.constexpr):
    """Start copying the tile at key n0 into one stage: K^T words [4, 32, KEYS] and V words
    [4, KEYS, 32], from its keys' page ids (keys past `end` are zero-filled, with no memory
    read); one commit group."""
    k_key = n0 + k_rel
    k_slot = k_page.to(gl.int64) * PAGE_SIZE + k_key % PAGE_SIZE
    k_offs = gl.expand_dims(k_slot * stride_kvs + kvh * stride_kvh, 1) + kp[None, :, None]
    _async_load(k_smem, k_ptr + k_offs, mask=gl.expand_dims(k_key < end, 1))
    v_key = n0 + v_rel
    v_slot = v_page.to(gl.int64) * PAGE_SIZE + v_key % PAGE_SIZE
    v_offs = gl.expand_dims(v_slot * stride_kvs + kvh * stride_kvh, 2) + vp[None, None, :]
    _async_load(v_smem, v_ptr + v_offs, mask=gl.expand_dims(v_key < end, 2))
    async_copy.commit_group()


@gluon.jit
def _load_scales(k_scale_ptr, v_scale_ptr, end, kvh, stride_ss, stride_sh, c_rel, s_page, n0,
                 s_cp: gl.constexpr, HKV: gl.constexpr, PAGE_SIZE: gl.constexpr,
                 PAIRED: gl.constexpr):
    """The tile at key n0's K and V scales [4, KEYS] into registers, a key a lane (keys past
    `end`: 0); PAIRED (`scale_pairs`): both with one 8-byte load. Plain loads, not 4-byte
    `cp.async` (no faster): what costs is a load's line requests, one a key where a warp's
    keys sit on 32 lines (the token layout, or paged MHA)."""
    s_key = n0 + c_rel
    slot = s_page.to(gl.int64) * PAGE_SIZE + s_key % PAGE_SIZE  # [4, KEYS]
    if PAIRED:  # at (2 HKV slot + 2 kvh): constexpr strides show the pair 8-byte aligned,
        # which Triton must see to load it as one; stride_sh (2) as an argument would hide it
        p_ld: gl.constexpr = gl.BlockedLayout([1, 1, 2], [1, 32, 1], [4, 1, 1], [2, 1, 0])
        k_at = gl.convert_layout(2 * (slot * HKV + kvh), gl.SliceLayout(2, p_ld),
                                 assert_trivial=True)
        keep = gl.convert_layout(s_key < end, gl.SliceLayout(2, p_ld), assert_trivial=True)
        kv = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, p_ld)))
        pair = gl.load(k_scale_ptr + gl.expand_dims(k_at, 2) + kv[None, None, :],
                       mask=gl.expand_dims(keep, 2), other=0.0, cache_modifier=".cg")
        k_s, v_s = gl.split(pair)  # [4, KEYS] each
        k_s = gl.convert_layout(k_s, s_cp, assert_trivial=True)
        v_s = gl.convert_layout(v_s, s_cp, assert_trivial=True)
    else:
        at = slot * stride_ss + kvh * stride_sh
        k_s = gl.load(k_scale_ptr + at, mask=s_key < end, other=0.0, cache_modifier=".cg")
        v_s = gl.load(v_scale_ptr + at, mask=s_key < end, other=0.0, cache_modifier=".cg")
    return k_s, v_s


@gluon.jit
def _step(q, kw, vw, ks_stage, vs_stage, n0, end, s_rel, m, l_sum, acc, c, mma: gl.constexpr,
          a_op: gl.constexpr, b_op: gl.constexpr, s_rows: gl.constexpr, s_keys: gl.constexpr,
          PAIRS: gl.constexpr, WIDEN: gl.constexpr, KEYS: gl.constexpr, v_pairs: gl.constexpr,
          SCALED: gl.constexpr):
    """One tile of the online softmax: (m, l_sum, acc, c) after keys n0 .. n0 + 4 KEYS (an
    unscaled pool's codes are the values themselves: no scale is read and c stays 1)."""
    s = mma_v2(q, _k_operand(kw, b_op, WIDEN, KEYS),
               gl.zeros([4, 16, KEYS], gl.float32, layout=mma))  # [4, 16 rows, KEYS keys]
    if SCALED:
        s = s * gl.expand_dims(ks_stage.load(s_keys), 1)  # base-2 logits
    s = gl.where(gl.expand_dims(n0 + s_rel < end, 1), s, float("-inf"))
    m_new = gl.maximum(m, gl.max(s, 2))  # [4, 16]
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)  # a warp with no keys yet
    alpha = gl.exp2(m - m_safe)
    p = gl.exp2(s - gl.expand_dims(m_safe, 2))
    l_sum = l_sum * alpha + gl.sum(p, 2)
    if SCALED:
        v_s = vs_stage.load(s_keys)
        v_max = gl.maximum(gl.max(v_s, 1), 1e-30)  # [4]
        w = (p * gl.expand_dims(v_s / gl.expand_dims(v_max, 1), 1)).to(gl.float16)
        # this tile's weights are in units of v_max: rescale acc to them, then accumulate (a
        # warp with no key in the tile keeps acc's units)
        v_max_rows = gl.convert_layout(v_max, gl.SliceLayout(1, s_rows))
        v_max_rows = gl.where(v_max_rows > 1e-30, v_max_rows, c)
        factor = alpha * gl.expand_dims(c / v_max_rows, 1)  # [4, 16]
        c = v_max_rows
    else:
        w = p.to(gl.float16)
        factor = alpha
    acc = mma_v2(gl.convert_layout(w, a_op, assert_trivial=True),
                 _v_operand(vw, v_pairs, b_op, PAIRS, KEYS), acc * gl.expand_dims(factor, 2))
    return m_new, l_sum, acc, c


@gluon.jit
def _decode_quant_gluon_kernel(
    q_ptr, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, kv_indptr_ptr, kv_indices_ptr, seq_lens_ptr,
    mid_o_ptr, mid_lse_ptr, qk_scale, num_splits, stride_qb, stride_qh, stride_kvs, stride_kvh,
    stride_ss, stride_sh,
    Q_HEADS: gl.constexpr, GROUP: gl.constexpr, PAGE_SIZE: gl.constexpr, PAIRS: gl.constexpr,
    WIDEN: gl.constexpr, KEYS: gl.constexpr, STAGES: gl.constexpr, SCALED: gl.constexpr,
    PAIRED: gl.constexpr,
    k_ld: gl.constexpr, v_ld: gl.constexpr, v_pairs: gl.constexpr,
):  # fmt: skip
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1, 1],
                                                  instr_shape=[1, 16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(2, mma)  # [4, 16] per (warp, q row)
    s_keys: gl.constexpr = gl.SliceLayout(1, mma)  # [4, KEYS] per (warp, key)
    TILE: gl.constexpr = 4 * KEYS
    # shared stages (each [4, ..]): 16-byte chunks of a key's words swizzled by the key, so
    # neither the copies nor the loads conflict on banks
    k_sl: gl.constexpr = gl.SwizzledSharedLayout(4, 1, 8, order=[1, 2, 0])
    v_sl: gl.constexpr = gl.SwizzledSharedLayout(4, 1, 8, order=[2, 1, 0])
    s_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    # the scales' copies: [4, KEYS], a key a lane
    s_cp: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [4, 1], [1, 0])
    HKV: gl.constexpr = Q_HEADS // GROUP
    kvh = gl.program_id(0)  # a sequence's heads run side by side: they share the scales' sectors
    b = gl.program_id(1)
    split = gl.program_id(2)
    seq_len = gl.load(seq_lens_ptr + b)
    split_len = gl.cdiv(gl.cdiv(seq_len, num_splits), TILE) * TILE
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

    # a tile's keys, relative to its first, in each layout: key KEYS w + n of warp w
    # K's copies: 8 lanes a key's 128 bytes, so a warp's copy covers 4 whole lines (k_ld's
    # layout would cover 8 keys' half lines, each sector asked for twice)
    k_cp: gl.constexpr = gl.BlockedLayout([1, 4, 1], [1, 8, 4], [4, 1, 1], [1, 2, 0])
    kw = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(1, k_cp)))
    kn = gl.arange(0, KEYS, layout=gl.SliceLayout(0, gl.SliceLayout(1, k_cp)))
    kp = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, k_cp)))
    vw = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, v_ld)))
    vn = gl.arange(0, KEYS, layout=gl.SliceLayout(0, gl.SliceLayout(2, v_ld)))
    vp = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, v_ld)))
    sw = gl.arange(0, 4, layout=gl.SliceLayout(1, s_keys))
    sn = gl.arange(0, KEYS, layout=gl.SliceLayout(0, s_keys))
    k_rel = KEYS * kw[:, None] + kn[None, :]  # [4, KEYS]
    v_rel = KEYS * vw[:, None] + vn[None, :]
    s_rel = KEYS * sw[:, None] + sn[None, :]
    cw = gl.arange(0, 4, layout=gl.SliceLayout(1, s_cp))
    cn = gl.arange(0, KEYS, layout=gl.SliceLayout(0, s_cp))
    c_rel = KEYS * cw[:, None] + cn[None, :]

    # pipeline: STAGES - 1 tiles are copying into shared memory while one computes, and the
    # page ids of the next tile to copy are loading
    k_smem = gl.allocate_shared_memory(gl.int32, [STAGES, 4, 32, KEYS], k_sl)
    v_smem = gl.allocate_shared_memory(gl.int32, [STAGES, 4, KEYS, 32], v_sl)
    ks_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 4, KEYS], s_sl)
    vs_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 4, KEYS], s_sl)
    ld = (k_ptr, v_ptr, end, kvh, stride_kvs, stride_kvh, k_rel, v_rel, kp, vp)
    sc = (k_scale_ptr, v_scale_ptr, end, kvh, stride_ss, stride_sh, c_rel)
    pg = (kv_indices_ptr, page_base)
    for i in gl.static_range(STAGES - 1):
        pages = _pages(*pg, start + i * TILE, end, k_rel, v_rel, c_rel, PAGE_SIZE, SCALED)
        _issue_tile(k_smem.index(i), v_smem.index(i), *ld, pages[0], pages[1],
                    start + i * TILE, PAGE_SIZE)
        if SCALED:
            k_s, v_s = _load_scales(*sc, pages[2], start + i * TILE, s_cp, HKV, PAGE_SIZE,
                                    PAIRED)
            if i < STAGES - 2:  # the last tile's (k_s, v_s) go in at the loop's first pass
                ks_smem.index(i).store(k_s)
                vs_smem.index(i).store(v_s)
    ahead = start + (STAGES - 1) * TILE  # the next tile to copy
    pages = _pages(*pg, ahead, end, k_rel, v_rel, c_rel, PAGE_SIZE, SCALED)
    m = gl.full([4, 16], float("-inf"), gl.float32, layout=s_rows)
    l_sum = gl.zeros([4, 16], gl.float32, layout=s_rows)
    acc = gl.zeros([4, 16, 128], gl.float32, layout=mma)  # the output over c, per warp
    c = gl.full([4], 1.0, gl.float32, layout=gl.SliceLayout(1, s_rows))
    for n0 in range(start, end, TILE):
        t = (n0 - start) // TILE
        if SCALED:  # the scales loaded last pass (tile t + STAGES - 2), into their stage
            ks_smem.index((t + STAGES - 2) % STAGES).store(k_s)
            vs_smem.index((t + STAGES - 2) % STAGES).store(v_s)
        async_copy.wait_group(STAGES - 2)  # tile t is in
        _barrier()  # ... for every thread; and every thread is done with tile t - 1's stage
        st = (t + STAGES - 1) % STAGES
        _issue_tile(k_smem.index(st), v_smem.index(st), *ld, pages[0], pages[1], ahead,
                    PAGE_SIZE)
        if SCALED:
            k_s, v_s = _load_scales(*sc, pages[2], ahead, s_cp, HKV, PAGE_SIZE, PAIRED)
        ahead += TILE
        pages = _pages(*pg, ahead, end, k_rel, v_rel, c_rel, PAGE_SIZE, SCALED)
        st = t % STAGES
        k_words = k_smem.index(st).load(k_ld)
        v_words = v_smem.index(st).load(v_ld)
        m, l_sum, acc, c = _step(q, k_words, v_words, ks_smem.index(st), vs_smem.index(st), n0,
                                 end, s_rel, m, l_sum, acc, c, mma, a_op, b_op, s_rows, s_keys,
                                 PAIRS, WIDEN, KEYS, v_pairs, SCALED)
    async_copy.wait_group(0)  # no copy may land after the program ends

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


def decode_quant_gluon_stage1(q, k_buf, v_buf, k_scale, v_scale, kv_indptr, kv_indices, seq_lens,
                            mid_o, mid_lse, page_size: int, qk_scale: float, block_n: int = 64,
                            num_stages: int = 2) -> None:
    """The Gluon stage 1 over an fp8 or int8 pool: same operands and partial outputs as
    `decode_attention_quant_stage1` (head_dim 128, a GQA group of at most 16); tiles of
    `block_n` keys (64 or 128, a quarter a warp) in a ring of `num_stages` (>= 2) stages.
    k_scale and v_scale None: an unscaled fp8 pool (its codes are the values)."""
    B, Hq, Dq = q.shape
    Hkv = k_buf.shape[1]
    assert Dq == D and Hq // Hkv <= ROWS, "the Gluon stage 1 takes head_dim 128, groups <= 16"
    assert block_n in (64, 128), f"the Gluon stage 1 takes tiles of 64 or 128 keys, not {block_n}"
    assert num_stages >= 2, f"the Gluon stage 1 needs 2 or more stages, not {num_stages}"
    k_ld, v_ld, v_pairs = tile_layouts(block_n // WARPS)
    widen, pairs = WIDEN_ASM[k_buf.dtype]
    num_splits = mid_lse.shape[2]
    k_words, v_words = k_buf.view(torch.int32), v_buf.view(torch.int32)  # [S, Hkv, 32]
    scaled = k_scale is not None
    s_strides = (k_scale.stride(0), k_scale.stride(1)) if scaled else (0, 0)
    paired = scaled and paired_scales(k_scale, v_scale)
    if not scaled:  # the kernel reads no scale: any pointer will do
        k_scale = v_scale = mid_lse
    _decode_quant_gluon_kernel[(Hkv, B, num_splits)](
        q, k_words, v_words, k_scale, v_scale, kv_indptr, kv_indices, seq_lens, mid_o, mid_lse,
        qk_scale, num_splits, q.stride(0), q.stride(1), k_words.stride(0), k_words.stride(1),
        *s_strides,
        Q_HEADS=Hq, GROUP=Hq // Hkv, PAGE_SIZE=page_size, PAIRS=pairs, WIDEN=widen,
        KEYS=block_n // WARPS, STAGES=num_stages, SCALED=scaled, PAIRED=paired, k_ld=k_ld,
        v_ld=v_ld, v_pairs=v_pairs,
        num_warps=WARPS,
    )  # fmt: skip
