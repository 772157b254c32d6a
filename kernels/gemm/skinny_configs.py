"""Launch configs of `kernels.gemm.skinny`, chosen by a table measured on the GPU.

`skinny_gemm_table.json` beside this file is what `bench.kernels.skinny_gemm` writes as
`<out>-table.json`: for each (fp8 weight, M bucket, N, K) it swept, the fastest config and
whether it beat cuBLAS (for fp8 weights: per-token activation quant + `torch._scaled_mm`).
An entry with a `source` was set by timing the whole decode step instead, where that
disagreed with the kernel timed alone.
`TABLE` holds the configs, `VERDICTS` whether the kernel won; `use_kernel` reads them: a
16-bit linear uses the kernel only where it won, an fp8 linear everywhere but where it lost
(unmeasured fp8 shapes keep the kernel, which skips the activation quant). Shapes the table
does not hold get `rule_config`: enough split-K to put about three programs on each SM.
Without the file the table is empty: fp8 runs on `rule_config`, 16-bit linears stay on
cuBLAS.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SMS = 132  # H200 streaming multiprocessors
TABLE_FILE = Path(__file__).with_name("skinny_gemm_table.json")


@dataclass(frozen=True)
class SkinnyConfig:
    """Launch knobs: output channels and K elements per tile, K slices, warps, pipeline
    stages, whether M <= 4 also goes through the tensor-core product, and (row-sum kernel)
    how many neighbouring products along K a thread sums into one partial sum (capped at
    one 16-byte load)."""

    block_n: int = 32
    block_k: int = 256
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    dot: bool = True
    fold: int = 16


GATED_CONFIG = SkinnyConfig(block_n=4, block_k=2048, num_warps=4, num_stages=1, dot=False)
"""The row-sum config of a product that takes the MLP's gated activation in its loads
(`kernels.gemm.skinny`'s `gated`), picked in the bf16 batch-1 step of dummy:llama3-8b on two
H200s (2026-12-03): of seven tried, it and 8 x 2048 (0.6-7 us behind, within the noise) led
the others by 24-674 us."""


def m_bucket(m: int) -> int:
    """The power of two at or above m: the table's row key."""
    return 1 << max(0, m - 1).bit_length()


def rule_config(fp8: bool, m: int, n: int, k: int) -> SkinnyConfig:
    """A config for a shape the sweep did not measure: fp8 weights at up to four rows on the
    row-sum kernel (it beat the tensor-core one at M = 1 on every swept shape)."""
    rowsum = fp8 and m <= 4
    block_n, block_k = (16, 512) if rowsum else (32, 512 if fp8 else 256)
    split = 1
    while -(-n // block_n) * split < 3 * SMS and k // (block_k * split * 2) >= 2:
        split *= 2
    if rowsum:
        return SkinnyConfig(block_n, block_k, split, num_warps=8, num_stages=1, dot=False)
    return SkinnyConfig(block_n=block_n, block_k=block_k, split_k=split)


def pick_config(fp8: bool, m: int, n: int, k: int) -> SkinnyConfig:
    """The measured config for (fp8, bucket(m), n, k), else `rule_config`."""
    return TABLE.get((fp8, m_bucket(m), n, k)) or rule_config(fp8, m, n, k)


def use_kernel(fp8: bool, m: int, n: int, k: int) -> bool:
    """Whether a linear of this weight kind and shape runs the kernel rather than cuBLAS: the
    table's verdict, else yes for fp8 weights and no for 16-bit ones."""
    return VERDICTS.get((fp8, m_bucket(m), n, k), fp8)


Key = tuple[bool, int, int, int]  # (fp8 weight, M bucket, N, K)


def load_table(path: Path) -> tuple[dict[Key, SkinnyConfig], dict[Key, bool]]:
    """(configs by key, whether the kernel beat cuBLAS by key) from a table file; both empty
    when there is none."""
    if not path.exists():
        return {}, {}
    entries = json.loads(path.read_text())["entries"]
    keys = [(e["fp8"], e["m_bucket"], e["n"], e["k"]) for e in entries]
    table = {key: SkinnyConfig(**e["config"]) for key, e in zip(keys, entries, strict=True)}
    verdicts = {key: e["beats_cublas"] for key, e in zip(keys, entries, strict=True)}
    return table, verdicts


TABLE, VERDICTS = load_table(TABLE_FILE)
