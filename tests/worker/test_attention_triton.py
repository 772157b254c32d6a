"""The Triton attention backend (interpreted on CPU) equals the torch backend, alone and in
a ModelRunner."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from kernels.norm_rope.rmsnorm import rmsnorm_ref
from kernels.norm_rope.rope import apply_rope_ref, rope_cos_sin_cache
from runtime.model_config import resolve_model
from runtime.worker.attention import Rotary
from runtime.worker.attention_torch import TorchAttention
from runtime.worker.attention_triton import TritonAttention, check_pool_support
from runtime.worker.kv_pool import KVPool
from runtime.worker.model_runner import ModelRunner, make_attention
from runtime.worker.quant.fp8_linear import QuantizationError
from tests.worker.batching import Chunk, attend, greedy, make_batch
from tests.worker.checkpoints import tiny_checkpoint

# the Triton interpreter runs on CPU tensors: on a CUDA host, tests/worker/test_gpu.py
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter tests")
Q_HEADS, KV_HEADS, HEAD_DIM, SEQS = 6, 2, 16, 3


def _random_pool(pool: KVPool) -> None:
    """Random K/V (codes and their scales, in a quantized pool) in every slot."""
    for cache in pool.k + pool.v:
        if cache.dtype == torch.int8:
            cache.copy_(torch.randint(-127, 128, cache.shape))
        else:
            cache.copy_(torch.randn(cache.shape))
    for scale in pool.scales(0):
        if scale is not None:
            scale.uniform_(0.005, 0.02)


@pytest.mark.parametrize(
    "extend, prefix", [([5, 3, 1], [0, 0, 0]), ([4, 1, 7], [3, 9, 1]), ([1, 1, 1], [3, 17, 0])]
)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("kv_dtype", ["auto", "int8"])
def test_triton_backend_matches_torch_backend(extend, prefix, page_size, kv_dtype):
    # a batch with and without cached prefixes, over a 16-bit and a quantized pool (none
    # cached: the pool unread). Not fp8 here: the interpreter rounds a few fp32 -> e4m3
    # casts a binade lower than torch, and a decode step reads the token it just stored.
    torch.manual_seed(1)
    pools = [KVPool(1, 96 * page_size, KV_HEADS, HEAD_DIM, torch.float32, "cpu", kv_dtype)
             for _ in range(2)]  # fmt: skip
    _random_pool(pools[0])
    for a, b in zip(pools[0].k + pools[0].v + [*pools[0].scales(0)],
                    pools[1].k + pools[1].v + [*pools[1].scales(0)]):  # fmt: skip
        if a is not None:
            b.copy_(a)
    fb = make_batch(
        [Chunk(s, [0] * n) for s, n in enumerate(extend)], prefix, SEQS, page_size=page_size
    )
    tokens = sum(extend)
    q = torch.randn(tokens, Q_HEADS, HEAD_DIM)
    k = torch.randn(tokens, KV_HEADS, HEAD_DIM)
    v = torch.randn(tokens, KV_HEADS, HEAD_DIM)
    want = attend(TorchAttention(pools[0]), 0, q, k, v, fb)
    got = attend(TritonAttention(pools[1]), 0, q, k, v, fb)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(pools[1].k[0], pools[0].k[0])


@pytest.mark.parametrize("extend, prefix", [([4, 1, 7], [3, 9, 1]), ([1, 1, 1], [3, 17, 0])])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qk_norm"])
def test_forward_rotary_equals_rotating_first(extend, prefix, page_size, qk_norm):
    """The fused path (norm, RoPE and store in one kernel) gives the unfused path's output
    and pool, for an extend and a decode batch, from views of one fused QKV output."""
    torch.manual_seed(2)
    pools = [KVPool(1, 96 * page_size, KV_HEADS, HEAD_DIM, torch.float32, "cpu") for _ in range(2)]
    for a, b in zip(pools[0].k + pools[0].v, pools[1].k + pools[1].v):
        b.copy_(a.normal_())
    fb = make_batch(
        [Chunk(s, [0] * n) for s, n in enumerate(extend)], prefix, SEQS, page_size=page_size
    )
    qkv = torch.randn(sum(extend), Q_HEADS + 2 * KV_HEADS, HEAD_DIM)
    q, k, v = qkv.split([Q_HEADS, KV_HEADS, KV_HEADS], dim=1)  # strided views
    norms = (1 + 0.1 * torch.randn(HEAD_DIM), 1 + 0.1 * torch.randn(HEAD_DIM)) if qk_norm else ()
    rotary = Rotary(rope_cos_sin_cache(HEAD_DIM, 64, 10000.0, None, "cpu"), *norms, eps=1e-6)
    if qk_norm:
        q_rot, k_rot = rmsnorm_ref(q, norms[0], 1e-6), rmsnorm_ref(k, norms[1], 1e-6)
    else:
        q_rot, k_rot = q, k
    q_rot, k_rot = apply_rope_ref(q_rot, k_rot, fb.positions, rotary.cos_sin_cache)
    want = attend(TorchAttention(pools[0]), 0, q_rot, k_rot, v, fb)
    triton = TritonAttention(pools[1])
    triton.prepare(fb)
    got = triton.forward_rotary(0, q, k, v, fb, rotary)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(pools[1].k[0], pools[0].k[0], atol=1e-6, rtol=1e-6)
    assert torch.equal(pools[1].v[0], pools[0].v[0])


def test_qwen3_greedy_equal_on_both_backends(tmp_path):
    """A Qwen3 model (q/k norm before RoPE) decodes the same tokens through the fused Triton
    path as through the torch ops."""
    tiny_checkpoint("qwen3", tmp_path)
    spec = resolve_model(str(tmp_path))
    runners = [
        ModelRunner(spec, "cpu", torch.float32, kv_slots=128, max_rows=4, attention_backend=name)
        for name in ("torch", "triton")
    ]
    prompts = [[5, 17, 30, 2, 9, 44, 8], [7, 7, 100]]
    (want_ids, want), (got_ids, got) = (greedy(r, prompts, 4) for r in runners)
    assert got_ids == want_ids
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_runner_picks_the_backend_and_both_decode_alike(monkeypatch):
    """`attention_backend`: auto is torch on the CPU; the interpreted triton backend gives
    the same greedy tokens and logits through a two-chunk prefill and decode steps."""
    spec = resolve_model("dummy:tiny")
    runners = {
        name: ModelRunner(
            spec, "cpu", torch.float32, kv_slots=128, max_rows=4, attention_backend=name
        )
        for name in ("auto", "triton")
    }
    assert isinstance(runners["auto"].attn, TorchAttention)
    assert isinstance(runners["triton"].attn, TritonAttention)
    prompts = [[5, 17, 300, 2, 9, 44, 8], [7, 7, 100]]
    (want_ids, want), (got_ids, got) = (greedy(r, prompts, 4) for r in runners.values())
    assert got_ids == want_ids
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="CUDA"):
        make_attention("triton", runners["auto"].kv_pool, torch.device("cpu"))


@pytest.mark.parametrize("page_size", [1, 16])
def test_graph_buffers_replay_a_decode_batch(page_size):
    """What a decode graph runs: the forward bound at capture to the backend's static
    buffers, which `prepare_replay` fills from the real batch (padding rows: no keys)."""
    torch.manual_seed(3)
    pools = [KVPool(1, 96 * page_size, KV_HEADS, HEAD_DIM, torch.float32, "cpu")
             for _ in range(2)]  # fmt: skip
    for a, b in zip(pools[0].k + pools[0].v, pools[1].k + pools[1].v):
        b.copy_(a.normal_())
    triton = TritonAttention(pools[1])
    triton.init_graph(8, 64, page_size)
    longer = make_batch([Chunk(s, [0]) for s in range(4)], [30, 5, 9, 40], 4, page_size=page_size)
    triton.prepare_replay(longer, 4)  # an earlier, larger batch leaves its page table behind
    fb = make_batch([Chunk(s, [0]) for s in range(3)], [3, 17, 0], SEQS, page_size=page_size)
    q = torch.randn(4, Q_HEADS, HEAD_DIM)  # row 3 pads the batch to the graph's 4 rows
    k, v = torch.randn(4, KV_HEADS, HEAD_DIM), torch.randn(4, KV_HEADS, HEAD_DIM)
    empty = torch.zeros(5, dtype=torch.int32)
    captured = replace(
        fb, out_slots=torch.cat([fb.out_slots, torch.zeros(1, dtype=torch.int64)]),
        kv_indptr=empty, kv_indices=empty[:0].long(), seq_lens=empty[:4], prefix_lens=empty[:4],
        seq_lens_cpu=[0] * 4, prefix_lens_cpu=[0] * 4, extend_lens_cpu=[1] * 4,
    )  # fmt: skip
    triton.prepare_capture(captured)
    triton.prepare_replay(fb, 4)
    got = triton.forward(0, q, k, v, captured)  # [4, Hq, D]
    want = attend(TorchAttention(pools[0]), 0, q[:3], k[:3], v[:3], fb)
    torch.testing.assert_close(got[:3], want, atol=2e-5, rtol=2e-5)
    assert not got[3].any()  # the padding row read nothing


def test_fp8_pool_is_refused_where_triton_has_no_fp8():
    """`--kv-dtype fp8` stops at start-up, with the flags to use instead, on a GPU whose
    Triton cannot convert to fp8 (an A100); int8 and the model's dtype run anywhere."""
    cuda = torch.device("cuda")
    check_pool_support(torch.float8_e4m3fn, cuda, capability=(9, 0))  # Hopper
    check_pool_support(torch.float8_e4m3fn, torch.device("cpu"))  # interpreted
    for dtype in (torch.int8, torch.bfloat16):
        check_pool_support(dtype, cuda, capability=(8, 0))
    with pytest.raises(QuantizationError, match=r"--kv-dtype fp8 .* 8\.9\+.* is 8\.0.*int8"):
        check_pool_support(torch.float8_e4m3fn, cuda, capability=(8, 0))
