"""fp8 checkpoint layers: each TP rank's weights and scales are its slice of the whole
layer's and its products add up to the whole product; rope rows permuted at load keep their
scales; the block layer's product against an explicit per-group computation (CPU), and its
CUDA paths (block GEMM, weight-only and w8a8) against the reference."""

from __future__ import annotations

import pytest
import torch

from runtime.model_config import resolve_model
from runtime.worker.loader import load_model
from runtime.worker.models.deepseek_rope import permute_output_rows
from runtime.worker.quant.block_fp8_linear import (
    BlockFp8Linear,
    block_fp8_linear,
    block_fp8_linear_ref,
)
from runtime.worker.quant.fp8_linear import Fp8Linear, QuantizationError
from runtime.worker.tp import TPGroup
from tests.worker.fp8_checkpoints import dequantize, quantize, write_fp8_pair
from tests.worker.test_fp8_checkpoints import tiny_hf

TP = 2


def weights(layer) -> torch.Tensor:
    """A fp8 layer's weight dequantized, float32 `[out, in]`."""
    if isinstance(layer, BlockFp8Linear):
        return dequantize(layer.weight, layer.weight_scale_inv, "block")
    return layer.weight.float() * layer.weight_scale[:, None]


@pytest.mark.parametrize("layout", ["block", "ct-channel"])
def test_tp_shards_are_slices_and_their_products_add_up(layout, tmp_path):
    """Llama, 2 KV heads of 128: at TP 2 each rank holds one head of Q, K and V (whole
    128-row blocks) and half of o_proj's columns (whole 128-column blocks)."""
    fp8_dir, _ = write_fp8_pair(tiny_hf("llama", num_key_value_heads=2), layout, tmp_path)
    spec = resolve_model(str(fp8_dir))
    whole = load_model(spec, "cpu", torch.float32).model.layers[1].self_attn
    shards = [load_model(spec, "cpu", torch.float32, tp=TPGroup(r, TP)).model.layers[1].self_attn
              for r in range(TP)]
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(0))
    qkv = whole.qkv_proj.product(x, None, None)  # [5, 768]: Q, K, V of 256 rows each
    o = whole.o_proj.product(x, None, None)  # [5, 256]
    w_qkv, w_o = weights(whole.qkv_proj), weights(whole.o_proj)
    for r, shard in enumerate(shards):
        rows = torch.cat([torch.arange(128) + 256 * part + 128 * r for part in range(3)])
        assert torch.equal(weights(shard.qkv_proj), w_qkv[rows])
        torch.testing.assert_close(shard.qkv_proj.product(x, None, None), qkv[:, rows])
        assert torch.equal(weights(shard.o_proj), w_o[:, 128 * r: 128 * (r + 1)])
    partial = [s.o_proj.product(x[:, 128 * r: 128 * (r + 1)], None, None)
               for r, s in enumerate(shards)]
    torch.testing.assert_close(partial[0] + partial[1], o)


def test_permuted_rows_keep_their_scales():
    w = torch.randn(256, 64, generator=torch.Generator().manual_seed(1))
    index = torch.arange(256)
    index[128:192] = index[128:192].flip(0)  # rows moving within their 128-row block
    channel = Fp8Linear(64, 256, bias=False)
    channel.load_rows(0, w)
    before = weights(channel)
    permute_output_rows(channel, index)
    assert torch.equal(weights(channel), before[index])
    block = BlockFp8Linear(64, 256, bias=False, block=(128, 128))
    q, scale = quantize(w, "block")
    block.load_fp8_rows(0, q)
    block.weight_scale_inv.copy_(scale)
    before = weights(block)
    permute_output_rows(block, index)
    assert torch.equal(weights(block), before[index])
    index[100], index[200] = 200, 100  # a row moving to another block
    with pytest.raises(QuantizationError, match="across its 128-row scale blocks"):
        permute_output_rows(block, index)


def test_long_steps_quantize_each_token_and_group():
    """Above 16 rows (and for whole groups) each token's 128-column groups are quantized
    on their own scales: the product equals that of the explicitly quantized activations."""
    gen = torch.Generator().manual_seed(2)
    q, scale = quantize(torch.randn(300, 384, generator=gen) * 0.05, "block")
    x = torch.randn(20, 384, generator=gen) * 3  # [T, K]
    x[3, 128:256] = 0  # an all-zero group: scale 1
    groups = x.view(20, 3, 128)
    s = groups.abs().amax(-1, keepdim=True) / 448  # [T, 3, 1]
    s = torch.where(s > 0, s, torch.ones_like(s))
    xq = ((groups / s).to(torch.float8_e4m3fn).float() * s).view(20, 384)
    want = xq @ dequantize(q, scale, "block").t()  # [T, 300]
    torch.testing.assert_close(block_fp8_linear(x, q, scale, (128, 128)), want,
                               rtol=1e-6, atol=1e-6)
    few = x[:16]  # weight-only: the activations as they are
    torch.testing.assert_close(block_fp8_linear(few, q, scale, (128, 128)),
                               few @ dequantize(q, scale, "block").t(), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- on the GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("tokens", [1, 7, 16, 40])
@pytest.mark.parametrize("shape", [(256, 512), (576, 200), (300, 384)], ids=str)
def test_cuda_block_gemm_matches_reference(shape, tokens, dtype):
    """Weight-only (up to 16 rows, or K = 200: a partial group) and w8a8 (40 rows, whole
    groups) through the block GEMM, against the float32 reference of the same numbers."""
    out, k = shape
    gen = torch.Generator().manual_seed(tokens)
    q, scale = quantize(torch.randn(out, k, generator=gen) * 0.05, "block")
    x = (torch.randn(tokens, k, generator=gen) * 2).to(dtype)
    bias = (torch.randn(out, generator=gen) * 0.1).to(dtype)
    args = (q.cuda(), scale.cuda(), (128, 128), bias.cuda())
    got = block_fp8_linear(x.cuda(), *args)
    want = block_fp8_linear_ref(x.cuda(), *args)
    assert got.dtype == dtype and got.shape == (tokens, out)
    err = (got.float() - want.float()).norm() / want.float().norm()
    assert err < 1e-2, err
