import json

import pytest
import torch

from kernels.gemm.skinny import MAX_ROWS, _workspaces, skinny_gemm, skinny_gemm_ref
from kernels.gemm.skinny_configs import (
    SkinnyConfig,
    load_table,
    m_bucket,
    pick_config,
    rule_config,
    use_kernel,
)
from kernels.norm_rope.activation import silu_and_mul_ref
from tests.kernels.cases import DEVICE, DTYPES, randn

FP8 = torch.float8_e4m3fn
# Odd N and K (not multiples of any tile), M = 1, 3, 4 (the row-sum kernel's padded and
# full rows) and the largest handled; and a K that every tile divides (the unmasked loads).
SHAPES = [(1, 37, 100), (3, 50, 300), (4, 21, 170), (MAX_ROWS, 33, 129), (2, 40, 256)]
CONFIGS = [
    SkinnyConfig(block_n=16, block_k=64, split_k=1),
    SkinnyConfig(block_n=32, block_k=32, split_k=3),  # split-K: atomics and arrival counters
    SkinnyConfig(block_n=16, block_k=64, split_k=2, dot=False),  # row-sum kernel (M <= 4)
    SkinnyConfig(block_n=8, block_k=32, split_k=1, num_warps=2, dot=False, fold=1),
]
TOL = {torch.float32: 1e-4 if DEVICE == "cpu" else 3e-3, torch.float16: 3e-3,
       torch.bfloat16: 2e-2}


def inputs(m, n, k, dtype, fp8, seed):
    gen = torch.Generator().manual_seed(seed)
    x = randn(m, k, dtype=dtype, gen=gen)  # [M, K]
    w = randn(n, k, gen=gen)  # [N, K] f32
    bias = randn(n, dtype=dtype, gen=gen)  # [N]
    if not fp8:
        return x, w.to(dtype), None, bias
    scale = w.abs().amax(1) / 448.0  # [N]
    return x, (w / scale[:, None]).to(FP8), scale, bias


def close(got, want, dtype):
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert err < TOL[dtype], err


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8", [False, True], ids=["16bit", "fp8"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=["plain", "splitk", "rowsum", "rowsum-unfolded"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_reference(shape, cfg, fp8, dtype):
    x, w, scale, bias = inputs(*shape, dtype, fp8, seed=sum(shape))
    y = skinny_gemm(x, w, scale, bias, config=cfg)
    assert y.shape == (shape[0], shape[1]) and y.dtype == dtype
    close(y, skinny_gemm_ref(x, w, scale, bias), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8", [False, True], ids=["16bit", "fp8"])
@pytest.mark.parametrize("cfg", CONFIGS[2:], ids=["rowsum", "rowsum-unfolded"])
@pytest.mark.parametrize("shape", [s for s in SHAPES if s[0] <= 4], ids=str)
def test_gated_rows_match_the_activation_then_the_product(shape, cfg, fp8, dtype):
    """x `[M, 2K]` (gate then up) taken through silu(gate) * up inside the loads gives what
    the activation followed by the product gives."""
    m, n, k = shape
    x, w, scale, bias = inputs(m, n, 2 * k, dtype, fp8, seed=sum(shape) + 1)
    w = w[:, :k].contiguous()  # [N, K]
    x[:, :k] *= 4  # gates far into silu's tails
    y = skinny_gemm(x, w, scale, bias, config=cfg, gated=True)
    assert y.shape == (m, n) and y.dtype == dtype
    close(y, skinny_gemm_ref(silu_and_mul_ref(x), w, scale, bias), dtype)


def test_gated_product_takes_a_row_sum_config_and_refuses_others():
    x, w, scale, _ = inputs(2, 24, 160, torch.float32, fp8=True, seed=3)
    w = w[:, :80].contiguous()
    close(skinny_gemm(x, w, scale, gated=True), skinny_gemm_ref(x, w, scale, gated=True),
          torch.float32)  # GATED_CONFIG
    with pytest.raises(AssertionError, match="row-sum"):
        skinny_gemm(x, w, scale, gated=True, config=CONFIGS[0])
    with pytest.raises(AssertionError, match="rows"):
        skinny_gemm(torch.cat([x, x, x]), w, scale, gated=True)
    with pytest.raises(AssertionError, match="weight"):
        skinny_gemm(x[:, :80], w, scale, gated=True)  # x must hold gate and up


@pytest.mark.gpu
def test_every_table_entry_matches_the_reference_at_its_shape():
    """The measured table's configs on the shapes they were picked for, at the bucket's row
    count (the interpreter cases above use small shapes and tiles)."""
    from kernels.gemm.skinny_configs import TABLE

    assert TABLE, "kernels/skinny_gemm_table.json holds no entries"
    for (fp8, m, n, k), cfg in sorted(TABLE.items()):
        x, w, scale, bias = inputs(m, n, k, torch.bfloat16, fp8, seed=n + k + m)
        close(skinny_gemm(x, w, scale, bias, config=cfg), skinny_gemm_ref(x, w, scale, bias),
              torch.bfloat16)


def test_split_k_leaves_workspace_zero_for_the_next_call():
    cfg = SkinnyConfig(block_n=16, block_k=32, split_k=4)
    for seed, (m, n, k) in enumerate([(2, 40, 200), (5, 40, 200), (1, 17, 150)]):
        x, w, scale, _ = inputs(m, n, k, torch.float32, fp8=True, seed=seed)
        close(skinny_gemm(x, w, scale, config=cfg), skinny_gemm_ref(x, w, scale), torch.float32)
        for ws, lock in _workspaces[x.device]:
            assert not ws.any() and not lock.any()


def test_strided_rows_and_unmeasured_shapes():
    x, w, scale, _ = inputs(3, 24, 80, torch.float32, fp8=True, seed=7)
    wide = torch.zeros(3, 96, device=DEVICE)
    wide[:, :80] = x
    close(skinny_gemm(wide[:, :80], w, scale), skinny_gemm_ref(x, w, scale), torch.float32)
    assert m_bucket(1) == 1 and m_bucket(3) == 4 and m_bucket(16) == 16
    assert pick_config(True, 3, 24, 80) == rule_config(True, 3, 24, 80)
    assert rule_config(True, 1, 4096, 4096).split_k > 1  # a small N is split to fill the SMs


def test_table_file_picks_configs_and_cublas_wins(tmp_path):
    cfg = {"block_n": 64, "block_k": 128, "split_k": 4, "num_warps": 8, "num_stages": 2,
           "dot": True}
    entries = [{"fp8": True, "m_bucket": 4, "n": 96, "k": 512, "config": cfg,
                "beats_cublas": False},
               {"fp8": False, "m_bucket": 1, "n": 96, "k": 512, "config": cfg,
                "beats_cublas": True}]
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"device": "test", "entries": entries}))
    table, verdicts = load_table(path)
    assert table[(True, 4, 96, 512)] == SkinnyConfig(**cfg)
    assert verdicts == {(True, 4, 96, 512): False, (False, 1, 96, 512): True}
    assert load_table(tmp_path / "missing.json") == ({}, {})


def test_unmeasured_shapes_use_the_kernel_for_fp8_only(monkeypatch):
    import kernels.gemm.skinny_configs as configs

    monkeypatch.setattr(configs, "VERDICTS", {(True, 4, 96, 512): False,
                                              (False, 1, 96, 512): True})
    assert not use_kernel(True, 3, 96, 512)  # measured: fp8 cuBLAS won at M bucket 4
    assert use_kernel(True, 2, 96, 512) and use_kernel(True, 1, 7, 9)  # unmeasured fp8
    assert use_kernel(False, 1, 96, 512) and not use_kernel(False, 2, 96, 512)


@pytest.mark.parametrize("shape", [(3, 50, 300), (MAX_ROWS, 33, 129)], ids=str)
def test_fp8_tensor_core_product_of_bf16_rows_runs_in_fp16(shape):
    """bf16 rows against an fp8 weight on the tensor-core kernel go through fp16: the same
    product, with x clamped into fp16's range (+-65504)."""
    m, n, k = shape
    x, w, scale, bias = inputs(m, n, k, torch.bfloat16, fp8=True, seed=m + n)
    x[0, 0] = 1e5  # beyond fp16
    y = skinny_gemm(x, w, scale, bias, config=SkinnyConfig(block_n=16, block_k=64, split_k=2))
    close(y, skinny_gemm_ref(x.clamp(-65504, 65504), w, scale, bias), torch.bfloat16)
