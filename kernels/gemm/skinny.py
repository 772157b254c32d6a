"""Skinny matmul y = x W^T (* scale) (+ b) for a few rows of x: the decode-time linear layers.

At decode batch 1..16 a linear layer reads its whole weight to produce a handful of outputs,
so it is memory bound and the kernel's job is to stream W at the device's bandwidth. W is
16-bit or float8_e4m3fn with one float32 scale per output channel (weight-only fp8: the
weight is widened in registers and the activations are never quantized).

Each program owns BLOCK_N output channels and one of SPLIT_K slices of K, and streams its
`[BLOCK_N, BLOCK_K]` weight tiles (contiguous along K, 16-byte loads). Two kernels:
- tensor core (`dot`): all M rows of x as a `[BLOCK_M, BLOCK_K]` tile (BLOCK_M = 16), the
  product with the operands swapped (acc `[BLOCK_N, BLOCK_M]` = W x^T: the tiny M is the
  MMA's N side); any M. An fp8 weight against bf16 rows multiplies in fp16 (e4m3 -> fp16
  is one packed conversion per two weights, -> bf16 a second, slow one per weight; bf16 x
  is exact in fp16 within its range and is clamped to it).
- row sum (`dot=False`, M <= 4): each weight element widened once to float32, multiplied by
  each x row and summed in-thread into float32 partial sums (one per `fold` elements a thread
  holds, per row), reduced across K once, after the loop: no shuffles or MMA operand
  reshuffling in the loop, and the weights read once for up to four rows. It also takes the
  MLP's gated activation in its loads (`gated`): x is the `[gate | up]` output of the
  gate/up projection and each row is silu(gate) * up as it is read, so the down projection
  needs no activation launch before it.
Split-K lets a small N fill the 132 SMs: each slice adds its partial sums into a float32
workspace with atomics, bumps a per-column-block counter, and the slice that arrives last
reads the sums back (an atomic add of zero, served by L2), zeroes them, writes y and resets
the counter.
The workspace and counters are therefore all-zero between calls and the kernel needs no
memset: one launch per linear, safe to capture in a CUDA graph. Calls that share a workspace
must not run concurrently (one compute stream). Under PDL (`kernels.pdl`) each program asks
L2 for its first weight tile, and loads its channels' scales and biases, before it waits for
the kernel before it.

Launch configs come from `kernels.gemm.skinny_configs`, a table measured on the GPU keyed on
(weight kind, M bucket, N, K), with a rule for shapes it does not hold: no autotuning, so
nothing is compiled or benchmarked inside a graph capture.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gemm.skinny_configs import GATED_CONFIG, SkinnyConfig, m_bucket, pick_config
from kernels.gemm.skinny_parts import fma_fold, program_start, skinny_finish, x_row
from kernels.norm_rope.activation import silu_and_mul_ref
from kernels.pdl import pdl_args

MAX_ROWS = 16  # x rows one launch handles; larger batches go to the tensor-core GEMMs
BLOCK_M = 16  # x rows padded to the smallest MMA width
FP16_MAX = tl.constexpr(65504.0)  # bf16 x rows go into the fp8 tensor-core product as fp16
ROWSUM_ROWS = 4  # x rows the row-sum kernel handles (a config with dot=False, M <= this)

_workspaces: dict[torch.device, list[tuple[torch.Tensor, torch.Tensor]]] = {}


@triton.jit(do_not_specialize=["M", "tiles_per_split", "SPLIT_K"])
def _skinny_dot_kernel(
    x_ptr,  # [M, K], unit stride along K
    w_ptr,  # [N, K], unit stride along K (16-bit or fp8)
    scale_ptr,  # [N] float32 when HAS_SCALE
    b_ptr,  # [N] when HAS_BIAS
    y_ptr,  # [M, N] contiguous
    ws_ptr,  # [M * N] float32 split-K sums, all zero between calls
    lock_ptr,  # [cdiv(N, BLOCK_N)] int32 arrival counters, all zero between calls
    M, N, K, stride_xm, stride_wn, tiles_per_split, SPLIT_K,
    HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
    PDL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_n, offs_n, mask_n, t_lo, t_hi, w_rows, scale, bias = program_start(
        w_ptr, scale_ptr, b_ptr, N, K, stride_wn, tiles_per_split, HAS_SCALE, HAS_BIAS, PDL,
        BLOCK_N, BLOCK_K)
    offs_m = tl.arange(0, BLOCK_M)  # [BM]
    mask_m = offs_m < M
    x_rows = x_ptr + offs_m[:, None] * stride_xm  # [BM, 1]
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    for t in range(t_lo, t_hi):
        # Tile starts are multiples of BLOCK_K (known to the compiler: 16-byte loads), and
        # only the last tile of K can be partial.
        offs_k = t * BLOCK_K + tl.arange(0, BLOCK_K)  # [BK]
        mask_k = (offs_k < K) | EVEN_K
        w = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :],
                    other=0.0, eviction_policy="evict_first")  # [BN, BK]
        x = tl.load(x_rows + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :],
                    other=0.0)  # [BM, BK]
        if w_ptr.dtype.element_ty == tl.float8e4nv and x_ptr.dtype.element_ty == tl.bfloat16:
            # e4m3 widens to fp16 in one packed conversion (to bf16 it takes a second,
            # slow one); bf16 x is exact in fp16 within its range, clamped to it.
            xh = tl.clamp(x.to(tl.float32), -FP16_MAX, FP16_MAX).to(tl.float16)  # [BM, BK]
            acc += tl.dot(w.to(tl.float16), tl.trans(xh))  # [BN, BM]
        else:
            acc += tl.dot(w.to(x.dtype), tl.trans(x))  # [BN, BM]
    skinny_finish(acc, pid_n, offs_n, offs_m, mask_n, mask_m, N, ws_ptr, lock_ptr,
                  scale, bias, y_ptr, SPLIT_K, HAS_SCALE, HAS_BIAS)


@triton.jit(do_not_specialize=["M", "tiles_per_split", "SPLIT_K"])
def _skinny_rowsum_kernel(
    x_ptr, w_ptr, scale_ptr, b_ptr, y_ptr, ws_ptr, lock_ptr,  # as in _skinny_dot_kernel
    M, N, K, stride_xm, stride_wn, tiles_per_split, SPLIT_K,
    HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
    PDL: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, VEC: tl.constexpr,
    GATED: tl.constexpr,
):
    pid_n, offs_n, mask_n, t_lo, t_hi, w_rows, scale, bias = program_start(
        w_ptr, scale_ptr, b_ptr, N, K, stride_wn, tiles_per_split, HAS_SCALE, HAS_BIAS, PDL,
        BLOCK_N, BLOCK_K)
    offs_m = tl.arange(0, ROWS)  # [R]
    mask_m = offs_m < M
    # Float32 partial sums, one per row of x and per VEC weight elements a thread holds (at
    # most one 16-byte load): each tile's products are summed in-thread into them, and across
    # K once, after the loop. A larger VEC saves registers: more programs per SM, more loads
    # in flight.
    acc0 = tl.zeros([BLOCK_N, BLOCK_K // VEC], tl.float32)
    acc1 = tl.zeros([BLOCK_N, BLOCK_K // VEC], tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_K // VEC], tl.float32)
    acc3 = tl.zeros([BLOCK_N, BLOCK_K // VEC], tl.float32)
    for t in range(t_lo, t_hi):
        offs_k = t * BLOCK_K + tl.arange(0, BLOCK_K)  # [BK]
        mask_k = (offs_k < K) | EVEN_K
        w = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :],
                    other=0.0, eviction_policy="evict_first")  # [BN, BK]
        wf = w.to(tl.float32)
        x0 = x_row(x_ptr, offs_k, mask_k, K, GATED)  # [BK] f32
        acc0 = fma_fold(acc0, wf, x0, BLOCK_N, BLOCK_K, VEC)
        if ROWS > 1:  # rows past M re-read the last row: their sums are never stored
            x1 = x_row(x_ptr + tl.minimum(1, M - 1) * stride_xm, offs_k, mask_k, K, GATED)
            acc1 = fma_fold(acc1, wf, x1, BLOCK_N, BLOCK_K, VEC)
        if ROWS > 2:
            x2 = x_row(x_ptr + tl.minimum(2, M - 1) * stride_xm, offs_k, mask_k, K, GATED)
            acc2 = fma_fold(acc2, wf, x2, BLOCK_N, BLOCK_K, VEC)
            x3 = x_row(x_ptr + tl.minimum(3, M - 1) * stride_xm, offs_k, mask_k, K, GATED)
            acc3 = fma_fold(acc3, wf, x3, BLOCK_N, BLOCK_K, VEC)
    row = offs_m[None, :]  # [1, R]
    acc = tl.where(row == 0, tl.sum(acc0, axis=1)[:, None], 0.0)  # [BN, R]
    if ROWS > 1:
        acc = tl.where(row == 1, tl.sum(acc1, axis=1)[:, None], acc)
    if ROWS > 2:
        acc = tl.where(row == 2, tl.sum(acc2, axis=1)[:, None], acc)
        acc = tl.where(row == 3, tl.sum(acc3, axis=1)[:, None], acc)
    skinny_finish(acc, pid_n, offs_n, offs_m, mask_n, mask_m, N, ws_ptr, lock_ptr,
                  scale, bias, y_ptr, SPLIT_K, HAS_SCALE, HAS_BIAS)


def _workspace(device: torch.device, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The device's zeroed split-K sums (float32, room for MAX_ROWS x n) and counters (int32,
    n), grown when a wider layer comes. A grown-out pair stays allocated: a CUDA graph
    captured with it keeps using it. The first forward of a model reaches the widest layer."""
    pairs = _workspaces.setdefault(device, [])
    if not pairs or pairs[-1][1].numel() < n:
        pairs.append((torch.zeros(MAX_ROWS * n, dtype=torch.float32, device=device),
                      torch.zeros(n, dtype=torch.int32, device=device)))
    return pairs[-1]


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, *, config: SkinnyConfig | None = None,
                gated: bool = False) -> torch.Tensor:
    """x `[M, K]` (1 <= M <= MAX_ROWS, unit stride along K) times `weight` `[N, K]` (16-bit
    or float8_e4m3fn, unit stride along K) transposed, each output channel times `scale`
    `[N]` float32 when given, plus `bias` `[N]`: y `[M, N]` in x's dtype, float32 accumulate.
    With `gated`, x is `[M, 2K]` (gate then up, M <= ROWSUM_ROWS) and the product is taken
    of silu(gate) * up, on a row-sum config (`GATED_CONFIG` unless given)."""
    assert x.dim() == 2 and weight.dim() == 2, "x must be [M, K] and weight [N, K]"
    M, N, K = x.shape[0], weight.shape[0], weight.shape[1]
    assert x.shape[1] == (2 * K if gated else K), f"x {tuple(x.shape)}, weight {(N, K)}"
    rows = ROWSUM_ROWS if gated else MAX_ROWS
    assert 1 <= M <= rows, f"skinny_gemm handles 1..{rows} rows here, got {M}"
    assert x.stride(1) == 1 and weight.stride(1) == 1, "x and weight need unit stride along K"
    for name, t in (("scale", scale), ("bias", bias)):
        assert t is None or (t.shape == (N,) and t.is_contiguous()), f"{name} must be [{N}]"
    fp8 = weight.dtype == torch.float8_e4m3fn
    cfg = config or (GATED_CONFIG if gated else pick_config(fp8, M, N, K))
    assert not (gated and cfg.dot), "the gated activation runs on the row-sum kernel"
    tiles = triton.cdiv(K, cfg.block_k)
    tiles_per_split = triton.cdiv(tiles, cfg.split_k)
    split = triton.cdiv(tiles, tiles_per_split)
    grid = (triton.cdiv(N, cfg.block_n), split)
    ws, lock = _workspace(x.device, N)
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    rowsum = not cfg.dot and M <= ROWSUM_ROWS
    args = (x, weight, scale if scale is not None else x, bias if bias is not None else x, y,
            ws, lock, M, N, K, x.stride(0), weight.stride(0), tiles_per_split, split,
            scale is not None, bias is not None, K % cfg.block_k == 0)
    if rowsum:
        vec = min(cfg.fold, 16 // weight.element_size(), cfg.block_k)  # within one load
        _skinny_rowsum_kernel[grid](*args, ROWS=m_bucket(M), BLOCK_N=cfg.block_n,
                                    BLOCK_K=cfg.block_k, VEC=vec, GATED=gated,
                                    num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                                    **pdl_args(x.device))
    else:
        _skinny_dot_kernel[grid](*args, BLOCK_M=BLOCK_M, BLOCK_N=cfg.block_n,
                                 BLOCK_K=cfg.block_k, num_warps=cfg.num_warps,
                                 num_stages=cfg.num_stages, **pdl_args(x.device))
    return y


def skinny_gemm_ref(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None,
                    bias: torch.Tensor | None = None, *, gated: bool = False) -> torch.Tensor:
    """Torch reference of `skinny_gemm`: the product in float32, rounded to x's dtype."""
    if gated:
        x = silu_and_mul_ref(x)  # [M, K]
    w = weight.float() if scale is None else weight.float() * scale[:, None]  # [N, K]
    y = x.float() @ w.T  # [M, N]
    return (y if bias is None else y + bias.float()).to(x.dtype)
