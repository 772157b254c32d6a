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
- row sum (`dot=False`, M <= 4; `kernels.skinny_rowsum`): float32 FMAs, no MMA.
Split-K lets a small N fill the 132 SMs: each slice adds its partial sums into a float32
workspace with atomics, bumps a per-column-block counter, and the slice that arrives last
reads the sums back (an atomic add of zero, served by L2), zeroes them, writes y and resets
the counter.
The workspace and counters are therefore all-zero between calls and the kernel needs no
memset: one launch per linear, safe to capture in a CUDA graph. Calls that share a workspace
must not run concurrently (one compute stream).

x can come through a fused prologue (`kernels.skinny_parts`): `skinny_gemm_norm` takes the
residual add and RMSNorm before a layer's first projection, `skinny_gemm_silu` the SiLU-and-mul
before the down projection, one launch each instead of two. Under PDL (`kernels.pdl`) each
program asks L2 for its first weight tiles before it waits for the kernel before it.

Launch configs come from `kernels.skinny_gemm_configs`, a table measured on the GPU keyed on
(weight kind, M bucket, N, K), with a rule for shapes it does not hold: no autotuning, so
nothing is compiled or benchmarked inside a graph capture.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.activation import silu_and_mul_ref
from kernels.pdl import pdl_args, pdl_wait
from kernels.rmsnorm import rmsnorm_ref
from kernels.skinny_gemm_configs import SkinnyConfig, m_bucket, pick_config
from kernels.skinny_parts import (
    PRO_NORM,
    PRO_PLAIN,
    PRO_SILU,
    load_x,
    rstd_of,
    skinny_finish,
    weights_to_l2,
)
from kernels.skinny_rowsum import _skinny_rowsum_kernel

MAX_ROWS = 16  # x rows one launch handles; larger batches go to the tensor-core GEMMs
BLOCK_M = 16  # x rows padded to the smallest MMA width
FP16_MAX = tl.constexpr(65504.0)  # bf16 x rows go into the fp8 tensor-core product as fp16
ROWSUM_ROWS = 4  # x rows the row-sum kernel handles (a config with dot=False, M <= this)
PREFETCH_BYTES = 24 << 20  # weights one launch may request into L2 early: half the H200's L2

_workspaces: dict[torch.device, list[tuple[torch.Tensor, torch.Tensor]]] = {}


@triton.jit(do_not_specialize=["M", "tiles_per_split", "SPLIT_K", "prefetch_tiles"])
def _skinny_dot_kernel(
    x_ptr,  # [M, K] ([M, 2K] for PRO_SILU), unit stride along K
    w_ptr,  # [N, K], unit stride along K (16-bit or fp8)
    scale_ptr,  # [N] float32 when HAS_SCALE
    b_ptr,  # [N] when HAS_BIAS
    y_ptr,  # [M, N] contiguous
    ws_ptr,  # [M * N] float32 split-K sums, all zero between calls
    lock_ptr,  # [cdiv(N, BLOCK_N)] int32 arrival counters, all zero between calls
    r_ptr,  # PRO_NORM: the residual [M, K], unit stride along K
    g_ptr,  # PRO_NORM: the norm weight [K]
    h_ptr,  # PRO_NORM: x + residual [M, K] contiguous, written
    eps,
    M, N, K, stride_xm, stride_rm, stride_wn, tiles_per_split, SPLIT_K, prefetch_tiles,
    HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
    PRO: tl.constexpr, LINE: tl.constexpr, LINES: tl.constexpr, PDL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    offs_m = tl.arange(0, BLOCK_M)  # [BM]
    mask_n = offs_n < N
    mask_m = offs_m < M
    t_lo = pid_k * tiles_per_split  # this slice's BLOCK_K tiles of K
    t_hi = tl.minimum(t_lo + tiles_per_split, tl.cdiv(K, BLOCK_K))
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn  # [BN, 1]
    x_rows = x_ptr + offs_m[:, None] * stride_xm  # [BM, 1]
    r_rows = r_ptr + offs_m[:, None] * stride_rm  # [BM, 1]
    h_rows = h_ptr + offs_m[:, None] * K  # [BM, 1]
    write_h = (pid_n + 0 * offs_m[:, None]) == 0  # [BM, 1] PRO_NORM: block 0 writes h
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    ss = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)  # PRO_NORM: sums of squares, per column
    weights_to_l2(w_ptr, offs_n, N, K, stride_wn, t_lo, t_hi, prefetch_tiles, LINE, LINES,
                  PDL, BLOCK_K)  # fmt: skip
    pdl_wait(PDL)  # x, the workspace and y belong to the kernels around this one
    for t in range(t_lo, t_hi):
        # Tile starts are multiples of BLOCK_K (known to the compiler: 16-byte loads), and
        # only the last tile of K can be partial.
        offs_k = t * BLOCK_K + tl.arange(0, BLOCK_K)  # [BK]
        mask_k = (offs_k < K) | EVEN_K
        w = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :],
                    other=0.0, eviction_policy="evict_first")  # [BN, BK]
        cols = offs_k[None, :]  # [1, BK]
        g_cols = g_ptr + cols + 0 * offs_m[:, None]  # [BM, BK]: gamma, broadcast over rows
        x, ss = load_x(x_rows + cols, r_rows + cols, h_rows + cols, g_cols,
                       mask_m[:, None] & mask_k[None, :], ss, write_h, K, PRO)  # [BM, BK]
        if w_ptr.dtype.element_ty == tl.float8e4nv and x_ptr.dtype.element_ty == tl.bfloat16:
            # e4m3 widens to fp16 in one packed conversion (to bf16 it takes a second,
            # slow one); bf16 x is exact in fp16 within its range, clamped to it.
            xh = tl.clamp(x.to(tl.float32), -FP16_MAX, FP16_MAX).to(tl.float16)  # [BM, BK]
            acc += tl.dot(w.to(tl.float16), tl.trans(xh))  # [BN, BM]
        else:
            xt = x.to(x_ptr.dtype.element_ty)  # [BM, BK]
            acc += tl.dot(w.to(xt.dtype), tl.trans(xt))  # [BN, BM]
    if PRO == PRO_NORM:
        acc *= rstd_of(ss, K, eps, 1)[None, :]
    skinny_finish(acc, pid_n, offs_n, offs_m, mask_n, mask_m, N, ws_ptr, lock_ptr,
                  scale_ptr, b_ptr, y_ptr, SPLIT_K, HAS_SCALE, HAS_BIAS)  # fmt: skip


def _prefetch_tiles(grid: tuple[int, int], cfg: SkinnyConfig, elt: int, tiles: int) -> int:
    """Weight tiles a program requests into L2 before its PDL wait: all of them while the
    launch's total stays within PREFETCH_BYTES, else as many as fit (at least one)."""
    per_tile = grid[0] * grid[1] * cfg.block_n * cfg.block_k * elt  # bytes, all programs
    return max(1, min(tiles, PREFETCH_BYTES // per_tile))


def _workspace(device: torch.device, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The device's zeroed split-K sums (float32, room for MAX_ROWS x n) and counters (int32,
    n), grown when a wider layer comes. A grown-out pair stays allocated: a CUDA graph
    captured with it keeps using it. The first forward of a model reaches the widest layer."""
    pairs = _workspaces.setdefault(device, [])
    if not pairs or pairs[-1][1].numel() < n:
        pairs.append((torch.zeros(MAX_ROWS * n, dtype=torch.float32, device=device),
                      torch.zeros(n, dtype=torch.int32, device=device)))
    return pairs[-1]


def fuses_norm(fp8: bool, rows: int, n: int, k: int) -> bool:
    """Whether `skinny_gemm_norm` runs this product as one launch: its config must not split K
    (the norm needs each row's full sum of squares in one program)."""
    return pick_config(fp8, rows, n, k).split_k == 1


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, *,
                config: SkinnyConfig | None = None) -> torch.Tensor:
    """x `[M, K]` (1 <= M <= MAX_ROWS, unit stride along K) times `weight` `[N, K]` (16-bit
    or float8_e4m3fn, unit stride along K) transposed, each output channel times `scale`
    `[N]` float32 when given, plus `bias` `[N]`: y `[M, N]` in x's dtype, float32 accumulate."""
    return _launch(x, weight, scale, bias, config, PRO_PLAIN, x.shape[1])[0]


def skinny_gemm_norm(x: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor, eps: float,
                     weight: torch.Tensor, scale: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None, *, config: SkinnyConfig | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """`(skinny_gemm(rmsnorm(h) * gamma, weight, scale, bias), h)` with h = x + residual
    (`[M, K]` each, rounded to x's dtype, a new tensor) in one launch; gamma `[K]`. The config
    (given, or the table's) must not split K (`fuses_norm`)."""
    assert residual.shape == x.shape and residual.dtype == x.dtype, (
        f"residual {residual.dtype} {tuple(residual.shape)} must match x {x.dtype} "
        f"{tuple(x.shape)}")
    assert residual.stride(1) == 1, "residual needs unit stride along K"
    assert gamma.shape == (x.shape[1],) and gamma.is_contiguous(), f"gamma must be [{x.shape[1]}]"
    return _launch(x, weight, scale, bias, config, PRO_NORM, x.shape[1], residual, gamma, eps)


def skinny_gemm_silu(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None, *,
                     config: SkinnyConfig | None = None) -> torch.Tensor:
    """`skinny_gemm(silu(gate) * up, ...)` of x `[M, 2K]` (gate then up, unit stride) in one
    launch, for `weight` `[N, K]`."""
    assert x.dim() == 2 and x.shape[1] % 2 == 0, f"x must be [M, 2K], got {tuple(x.shape)}"
    return _launch(x, weight, scale, bias, config, PRO_SILU, x.shape[1] // 2)[0]


def _launch(x, weight, scale, bias, config, pro, K, residual=None, gamma=None, eps=0.0):
    """One skinny launch with prologue `pro` over K columns: (y, h or None)."""
    assert x.dim() == 2 and weight.dim() == 2, "x must be [M, K] and weight [N, K]"
    M = x.shape[0]
    N = weight.shape[0]
    assert weight.shape[1] == K, f"x has K={K}, weight {tuple(weight.shape)}"
    assert 1 <= M <= MAX_ROWS, f"skinny_gemm handles 1..{MAX_ROWS} rows, got {M}"
    assert x.stride(1) == 1 and weight.stride(1) == 1, "x and weight need unit stride along K"
    for name, t in (("scale", scale), ("bias", bias)):
        assert t is None or (t.shape == (N,) and t.is_contiguous()), f"{name} must be [{N}]"
    fp8 = weight.dtype == torch.float8_e4m3fn
    cfg = config or pick_config(fp8, M, N, K)
    tiles = triton.cdiv(K, cfg.block_k)
    tiles_per_split = triton.cdiv(tiles, cfg.split_k)
    split = triton.cdiv(tiles, tiles_per_split)
    assert pro != PRO_NORM or split == 1, f"the fused norm needs one slice of K, {cfg} splits it"
    grid = (triton.cdiv(N, cfg.block_n), split)
    ws, lock = _workspace(x.device, N)
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    h = torch.empty(M, K, dtype=x.dtype, device=x.device) if pro == PRO_NORM else None
    r = residual if residual is not None else x
    args = (x, weight, scale if scale is not None else x, bias if bias is not None else x, y,
            ws, lock, r, gamma if gamma is not None else x, h if h is not None else x, eps,
            M, N, K, x.stride(0), r.stride(0), weight.stride(0), tiles_per_split, split,
            _prefetch_tiles(grid, cfg, weight.element_size(), tiles_per_split),
            scale is not None, bias is not None, K % cfg.block_k == 0)
    line = 128 // weight.element_size()  # elements in a 128-byte line
    meta = {"PRO": pro.value, "LINE": line, "LINES": max(cfg.block_k // line, 1),
            "num_warps": cfg.num_warps, "num_stages": cfg.num_stages, **pdl_args(x.device)}
    if not cfg.dot and M <= ROWSUM_ROWS:
        vec = min(cfg.fold, 16 // weight.element_size(), cfg.block_k)  # within one load
        _skinny_rowsum_kernel[grid](*args, ROWS=m_bucket(M), BLOCK_N=cfg.block_n,
                                    BLOCK_K=cfg.block_k, VEC=vec, **meta)
    else:
        _skinny_dot_kernel[grid](*args, BLOCK_M=BLOCK_M, BLOCK_N=cfg.block_n,
                                 BLOCK_K=cfg.block_k, **meta)
    return y, h


def skinny_gemm_ref(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """Torch reference of `skinny_gemm`: the product in float32, rounded to x's dtype."""
    w = weight.float() if scale is None else weight.float() * scale[:, None]  # [N, K]
    y = x.float() @ w.T  # [M, N]
    return (y if bias is None else y + bias.float()).to(x.dtype)


def skinny_gemm_norm_ref(x, residual, gamma, eps, weight, scale=None, bias=None):
    """Torch reference of `skinny_gemm_norm`: the norm and the product unfused."""
    normed, h = rmsnorm_ref(x, gamma, eps, residual=residual)
    return skinny_gemm_ref(normed, weight, scale, bias), h


def skinny_gemm_silu_ref(x, weight, scale=None, bias=None):
    """Torch reference of `skinny_gemm_silu`: SiLU-and-mul, then the product."""
    return skinny_gemm_ref(silu_and_mul_ref(x), weight, scale, bias)
