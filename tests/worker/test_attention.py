"""TorchAttention against a per-token loop reference; KV pool arithmetic and sizing."""

from __future__ import annotations

import pytest
import torch

from kernels.kv.paging import page_slots
from runtime.worker.attention_torch import TorchAttention
from runtime.worker.kv_pool import GiB, KVPool, kv_bytes_per_token, slots_for_memory
from tests.worker.batching import Chunk, attend, make_batch, slot

Q_HEADS, KV_HEADS, HEAD_DIM, SEQS = 6, 2, 8, 3


def reference(q, k_cache, v_cache, fb):
    """Token by token: softmax(q . K[:pos+1]) V over the sequence's slots, GQA by head // G."""
    out = torch.empty_like(q)
    group = Q_HEADS // KV_HEADS
    t = 0
    for i, (n, prefix) in enumerate(zip(fb.extend_lens_cpu, fb.prefix_lens_cpu)):
        for j in range(n):
            slots = page_slots(fb.kv_indptr, fb.kv_indices, i, prefix + j + 1, fb.page_size)
            for h in range(Q_HEADS):
                keys = k_cache[slots, h // group]  # [L, D]
                weights = torch.softmax(keys @ q[t, h] / HEAD_DIM**0.5, dim=0)  # [L]
                out[t, h] = weights @ v_cache[slots, h // group]
            t += 1
    return out


@pytest.mark.parametrize("extend", [[5, 3, 1], [1, 1, 1], [4, 1, 7]])
@pytest.mark.parametrize("prefix", [[0, 0, 0], [3, 9, 1]])
@pytest.mark.parametrize("page_size", [1, 4])
def test_torch_attention_matches_reference(extend, prefix, page_size):
    torch.manual_seed(0)
    pool = KVPool(2, 64 * page_size, KV_HEADS, HEAD_DIM, torch.float64, "cpu")
    for cache in pool.k + pool.v:  # cached prefixes (and everything else) hold random K/V
        cache.normal_()
    chunks = [Chunk(s, [0] * n) for s, n in enumerate(extend)]
    fb = make_batch(chunks, prefix, SEQS, page_size=page_size)
    tokens = sum(extend)
    q = torch.randn(tokens, Q_HEADS, HEAD_DIM, dtype=torch.float64)
    k = torch.randn(tokens, KV_HEADS, HEAD_DIM, dtype=torch.float64)
    v = torch.randn(tokens, KV_HEADS, HEAD_DIM, dtype=torch.float64)
    out = attend(TorchAttention(pool), 1, q, k, v, fb)
    assert torch.equal(pool.k[1][fb.out_slots], k) and torch.equal(pool.v[1][fb.out_slots], v)
    assert not torch.equal(pool.k[0][fb.out_slots], k)  # other layers untouched
    torch.testing.assert_close(out, reference(q, pool.k[1], pool.v[1], fb))


def test_decode_padding_reads_slot_zero_harmlessly():
    pool = KVPool(1, 64, KV_HEADS, HEAD_DIM, torch.float32, "cpu")
    pool.k[0].normal_()
    pool.v[0][1:].normal_()
    fb = make_batch([Chunk(0, [0]), Chunk(1, [0])], [0, 12], 2)  # lengths 1 and 13: padding
    assert fb.is_decode and slot(2, 1, 12) == fb.out_slots[1]
    q = torch.randn(2, Q_HEADS, HEAD_DIM)
    k, v = torch.randn(2, KV_HEADS, HEAD_DIM), torch.randn(2, KV_HEADS, HEAD_DIM)
    out = attend(TorchAttention(pool), 0, q, k, v, fb)
    # a single key attends to itself only: the output is that token's V
    torch.testing.assert_close(out[0], pool.v[0][fb.out_slots[0]].repeat_interleave(3, 0))
    assert torch.isfinite(out).all()


def test_kv_bytes_per_token():
    assert kv_bytes_per_token(32, 32, 128, torch.float16) == 512 * 1024  # llama-2-7b shape
    assert kv_bytes_per_token(32, 8, 128, torch.bfloat16) == 128 * 1024  # llama-3-8b shape
    pool = KVPool(30, 100, 3, 64, torch.float32, "cpu")
    assert pool.bytes_per_token == 2 * 30 * 3 * 64 * 4
    assert pool.total_bytes == 100 * pool.bytes_per_token
    assert pool.k[0].shape == (100, 3, 64) and len(pool.v) == 30


def test_slots_for_memory():
    per_token = 128 * 1024
    assert slots_for_memory(100 * GiB, per_token, 0.5, 2 * GiB) == 48 * GiB // per_token
    with pytest.raises(MemoryError):
        slots_for_memory(1 * GiB, per_token, 0.9, 1 * GiB)
