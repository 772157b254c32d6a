"""Launch configs of decode attention's stage 1: the knobs (`DecodeConfig`), the defaults
measured on the H200 for each pool, and the split count that fills the GPU."""

import functools
import os
from dataclasses import dataclass
from typing import ClassVar

import torch

H200_SMS = 132
PROGRAMS_PER_SM = 4  # enough resident programs per SM; more splits only add merge traffic
# a quantized pool's stage 1 pays more to start a program (page-table loads before the first
# copy, the ring's fill, the warps' merge: about 6.5 us on the H200), so it takes half as many:
# at B64 L4096 GQA 32/8 one split against two is 67.1 / 64.2% of the copy ceiling for fp8
# (token), 74.2 / 69.2% (paged-16), int8 71.0 / 60.0% and 72.0 / 63.8%
# (bench/results/kernels/2026-12-02-gluon-decode-splits-layouts-h200.json); measured after the
# change, the unscaled fp8 pool's GQA rows went from 78.4 / 78.8% (2 splits) to 88.1 / 89.5%
# (1 split) (bench/results/kernels/2026-12-02-decode-quant-one-split-h200.md)
QUANT_PROGRAMS_PER_SM = 2
MIN_SPLIT_TOKENS = 256  # a split shorter than this costs more to merge than it hides
MAX_SPLITS = 32


@dataclass(frozen=True)
class LaunchConfig:
    """What every attention kernel's launch config checks when it is made: its tile sides
    (`TILES`, the names of its fields) powers of two >= 16 (tl.dot's least), `num_warps` 1 to
    16 and `num_stages` >= 1. The subclasses hold the fields."""

    TILES: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        for name in self.TILES:
            n = getattr(self, name)
            assert n >= 16 and n & (n - 1) == 0, f"{name} {n} must be a power of two >= 16"
        assert self.num_warps in (1, 2, 4, 8, 16), (
            f"num_warps {self.num_warps} must be 1, 2, 4, 8 or 16"
        )
        assert self.num_stages >= 1, f"num_stages {self.num_stages} must be >= 1"


@dataclass(frozen=True)
class DecodeConfig(LaunchConfig):
    """Launch knobs of the stage-1 kernel (bench/kernels/driver.py --sweep searches them).

    use_dot None means tl.dot only for GQA groups; True also pads a single head to 16 rows.
    A quantized pool always uses tl.dot (its kernel ignores use_dot); `words` loads its codes
    as 32-bit words and widens them by bit arithmetic (else, or when head_dim or the pool's
    strides are not multiples of 4, as bytes widened by casts), and `prefetch` has the loop
    carry the next tile's codes in registers (meant for num_stages=1, so that Triton's
    pipeliner leaves those loads alone). The 16-bit kernel ignores both. `gluon` runs the
    Gluon stage 1 over a quantized pool (`decode_attention_gluon`: block_n 64 or 128,
    num_stages its ring of copies, the other knobs unused).
    """

    TILES = ("block_n",)
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    use_dot: bool | None = None
    words: bool = False
    prefetch: bool = False
    gluon: bool = False



# fastest in `python -m bench.kernels --only decode --sweep` on the H200 (B64, L4096, D128, fp16):
# MHA 961 us with padded tl.dot, 128 keys a tile; GQA (32/8 heads) 249 us with 64 keys a tile
MHA_CONFIG = DecodeConfig(block_n=128, num_warps=4, num_stages=3, use_dot=True)
GQA_CONFIG = DecodeConfig(block_n=64, num_warps=4, num_stages=2)
# quantized pools, `python -m bench.kernels.decode_quant_sweep` on the H200 (B64 L4096 D128,
# bf16 q; bench/results/kernels/2026-12-01-decode-fp8-words-h200.md): byte loads led on the
# token layout (MHA fp8 920 us, GQA 260 us) and for paged MHA; 32-bit words led for paged GQA
# (fp8 233 us against 268 us, int8 241 against 283 us)
QUANT_MHA_CONFIG = DecodeConfig(block_n=128, num_warps=4, num_stages=3)
QUANT_GQA_CONFIG = DecodeConfig(block_n=128, num_warps=4, num_stages=3)
QUANT_PAGED_GQA_CONFIG = DecodeConfig(block_n=128, num_warps=4, num_stages=2, words=True)
# the Gluon stage 1, every pool (`python -m bench.kernels.decode_quant_sweep --gluon --pools
# fp8_e4m3,fp8,int8` on the H200, bench/results/kernels/2026-12-03-decode-scale-pairs-h200.md): 128
# keys a tile, 2 stages. With K copied in whole lines and the scales read as pairs, the
# 64-key tile's registers (175-182) leave 2 programs an SM, as the 128-key tile's do
GLUON_CONFIG = DecodeConfig(block_n=128, num_stages=2, gluon=True)


FP8_CAPABILITY = (8, 9)  # e4m3 conversions and fp8 tensor cores
# the GPUs the Gluon stage 1 runs on, per pool: fp8 conversion needs sm_89, cp.async sm_80
GLUON_CAPABILITY = {torch.float8_e4m3fn: FP8_CAPABILITY, torch.int8: (8, 0)}


@functools.cache
def kernel_capability(device: torch.device) -> tuple[int, int]:
    """The CUDA compute capability compiled kernels run at here; (0, 0) on the CPU or under
    the Triton interpreter."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return (0, 0)
    return torch.cuda.get_device_capability(device)


def default_quant_config(q: torch.Tensor, k_buf: torch.Tensor, page_size: int) -> DecodeConfig:
    """The stage-1 config over a quantized pool (scaled or not): the Gluon kernel for head_dim
    128, a group of at most 16 and a 16-bit q on a GPU it runs on (`GLUON_CAPABILITY`); else
    the Triton kernel's measured defaults."""
    Hq, D = q.shape[1:]
    Hkv = k_buf.shape[1]
    if (D == 128 and Hq // Hkv <= 16 and q.dtype in (torch.float16, torch.bfloat16)
            and kernel_capability(q.device) >= GLUON_CAPABILITY[k_buf.dtype]):
        return GLUON_CONFIG
    return triton_quant_config(Hq, Hkv, page_size)


def triton_quant_config(q_heads: int, kv_heads: int, page_size: int) -> DecodeConfig:
    """The Triton stage 1's measured default over a quantized pool of this shape."""
    if q_heads == kv_heads:
        return QUANT_MHA_CONFIG
    return QUANT_PAGED_GQA_CONFIG if page_size > 1 else QUANT_GQA_CONFIG


def decode_num_splits(batch: int, kv_heads: int, max_seq_len: int, num_sms: int = H200_SMS,
                      quantized: bool = False) -> int:
    """Splits per sequence: PROGRAMS_PER_SM programs per SM (QUANT_PROGRAMS_PER_SM over a
    `quantized` fp8/int8 pool), no split under MIN_SPLIT_TOKENS.

    Exposed so a CUDA-graph caller can fix the split count from host-side lengths.
    """
    per_sm = QUANT_PROGRAMS_PER_SM if quantized else PROGRAMS_PER_SM
    want = -(-per_sm * num_sms // max(batch * kv_heads, 1))
    most = -(-max_seq_len // MIN_SPLIT_TOKENS)
    return max(1, min(want, most, MAX_SPLITS))
