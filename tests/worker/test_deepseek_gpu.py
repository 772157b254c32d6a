"""`dummy:deepseek-tiny` on a CUDA device: bf16 with the Triton MLA kernels, fused MoE and
CUDA-graph decode (over a bf16 or an fp8 latent pool) against the fp32 torch path holding
the same weights."""

from __future__ import annotations

import pytest
import torch

from runtime.model_config import resolve_model
from runtime.worker.model_runner import ModelRunner
from tests.worker.batching import greedy

pytestmark = pytest.mark.gpu
DEVICE = "cuda"


@torch.no_grad()
def copy_weights(dst: ModelRunner, src: ModelRunner) -> None:
    """dst's weights (and absorbed W_UK / W_UV, in place: graphs read them) := src's."""
    params = dict(src.model.named_parameters())
    for name, p in dst.model.named_parameters():
        p.copy_(params[name])
    for d, s in zip(dst.model.model.layers, src.model.model.layers):
        d.self_attn.w_uk.copy_(s.self_attn.w_uk)
        d.self_attn.w_uv_t.copy_(s.self_attn.w_uv_t)


@pytest.mark.parametrize(("kv_dtype", "row_bytes", "tol"), [("auto", 96 * 2, 0.05),
                                                            ("fp8", 96 + 4, 0.1)])
def test_bf16_triton_graphs_match_fp32_torch_path(kv_dtype, row_bytes, tol):
    spec = resolve_model("dummy:deepseek-tiny")
    ref = ModelRunner(spec, DEVICE, torch.float32, kv_slots=1024, max_rows=8, seed=0,
                      attention_backend="torch")
    fast = ModelRunner(spec, DEVICE, torch.bfloat16, kv_slots=1024, max_rows=8, seed=0,
                       attention_backend="triton", kv_dtype=kv_dtype)
    assert ref.graphs is None and fast.graphs is not None
    assert fast.kv_pool.k[0].shape[1:] == (1, 96) and fast.kv_bytes_per_token == 2 * row_bytes
    copy_weights(fast, ref)
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 1024, (n,), generator=gen).tolist() for n in (9, 70, 2, 33)]
    tokens, want = greedy(ref, prompts, 12)  # [P, 12, V] fp32
    _, got = greedy(fast, prompts, 12, forced=tokens)  # the same tokens fed
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, atol=tol * scale, rtol=0)
    # greedy picks agree wherever the reference's top two are not a near tie
    top2 = want.topk(2, dim=-1).values  # [P, 12, 2]
    clear = (top2[..., 0] - top2[..., 1]) > 2 * tol * scale
    assert (got.argmax(-1) == want.argmax(-1))[clear].all()
