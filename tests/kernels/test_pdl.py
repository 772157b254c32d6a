"""Programmatic dependent launch: a chain of decode-step kernels, each launched while the one
before it may still run, must compute exactly what the same chain computes without PDL."""

import pytest
import torch

from kernels.attention.decode import decode_attention
from kernels.gemm.skinny import skinny_gemm
from kernels.gemm.skinny_configs import SkinnyConfig
from kernels.kv.rope_store import rope_store_kv
from kernels.norm_rope.activation import silu_and_mul
from kernels.norm_rope.rmsnorm import rmsnorm
from kernels.norm_rope.rope import rope_cos_sin_cache
from kernels.pdl import pdl_args


def test_off_without_a_gpu_or_when_switched_off(monkeypatch):
    assert pdl_args(torch.device("cpu")) == {"PDL": False}
    monkeypatch.setenv("SLUICE_PDL", "0")
    assert pdl_args(torch.device("cuda", 0)) == {"PDL": False}


def _chain(x, res, w, w_up, w_down, kv, cfgs):
    """A decoder layer's kernel sequence at batch 1..: add+norm, skinny matmuls (one of them
    split-K: workspace and counters shared across launches; one with per-channel scales),
    SiLU, RoPE storing each sequence's newest key, decode attention over it."""
    normed, h = rmsnorm(x, w["norm"], 1e-6, residual=res)  # [M, H] each
    up = skinny_gemm(normed, w_up, config=cfgs[0])  # [M, 2I]
    y = skinny_gemm(silu_and_mul(up), w_down, w["scale"], config=cfgs[1])  # [M, H]
    k_buf, v_buf, indptr, indices, lens, cos_sin, newest, slots = kv
    rows, hidden = y.shape
    heads = hidden // 64
    q, _, _ = rope_store_kv(y.view(rows, heads, 64), up[:, :hidden].view(rows, heads, 64),
                            up[:, hidden : 2 * hidden].view(rows, heads, 64), k_buf, v_buf,
                            slots, newest, cos_sin)
    o = decode_attention(q, k_buf, v_buf, indptr, indices, lens, 1, 0.125, num_splits=4)
    return skinny_gemm(o.reshape(y.shape), w_down[:, : y.shape[1]].contiguous(),
                       config=cfgs[2]), h


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="PDL needs sm_90")
@pytest.mark.parametrize("rows", [1, 3])
def test_graph_of_pdl_launches_equals_plain_launches(monkeypatch, rows):
    dev, dt = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(rows)
    hidden, inter, ctx = 512, 1408, 300

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=dev).to(dt)

    w = {"norm": rand(hidden), "scale": torch.rand(hidden, generator=gen, device=dev) + 0.5}
    w_up, w_down = rand(2 * inter, hidden) / 20, rand(hidden, inter) / 30
    heads = hidden // 64
    k_buf, v_buf = rand(rows * ctx + 1, heads, 64), rand(rows * ctx + 1, heads, 64)
    # sequence r holds slots r * ctx + 1 ...; the chain stores its newest key (position
    # ctx - 1, in split 3 of 4) each time
    newest = torch.full((rows,), ctx - 1, device=dev)
    kv = (k_buf, v_buf, torch.arange(rows + 1, dtype=torch.int32, device=dev) * ctx,
          torch.arange(1, rows * ctx + 1, device=dev),
          torch.full((rows,), ctx, dtype=torch.int32, device=dev),
          rope_cos_sin_cache(64, ctx, 10000.0, None, dev), newest,
          torch.arange(rows, device=dev) * ctx + ctx)
    cfgs = [SkinnyConfig(block_n=16, block_k=128, split_k=1, dot=rows > 1),
            SkinnyConfig(block_n=32, block_k=128, split_k=4),
            SkinnyConfig(block_n=16, block_k=64, split_k=2, dot=False)]
    x, res = rand(rows, hidden), rand(rows, hidden)

    monkeypatch.setenv("SLUICE_PDL", "0")
    want = [_chain(x * (i + 1), res, w, w_up, w_down, kv, cfgs) for i in range(3)]
    monkeypatch.setenv("SLUICE_PDL", "1")
    assert pdl_args(dev)["PDL"]
    x_in = x.clone()
    _chain(x_in, res, w, w_up, w_down, kv, cfgs)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _chain(x_in, res, w, w_up, w_down, kv, cfgs)
    for _ in range(20):  # replays back to back: a read before its producer finished would show
        for i in range(3):
            x_in.copy_(x * (i + 1))
            graph.replay()
            torch.testing.assert_close(out[0], want[i][0], rtol=0, atol=0)
            torch.testing.assert_close(out[1], want[i][1], rtol=0, atol=0)
