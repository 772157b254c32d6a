import pytest
import torch

from kernels.norm_rope.rope import apply_rope, apply_rope_ref, rope_cos_sin_cache, rope_inv_freq
from tests.kernels.cases import DEVICE, DTYPES, ELEMENTWISE_TOL, randn

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
LINEAR = {"rope_type": "linear", "factor": 4.0}
SCALINGS = [None, {"rope_type": "default"}, LINEAR, {"type": "linear", "factor": 2.0}, LLAMA3]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [(9, 3, 64), (4, 4, 16), (8, 1, 80)], ids=str)
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
def test_matches_reference(dtype, heads, pos_dtype):
    gen = torch.Generator().manual_seed(0)
    Hq, Hkv, D = heads
    T, max_pos = 11, 500
    cache = rope_cos_sin_cache(D, max_pos, 10000.0, None, DEVICE)  # [max_pos, D]
    qkv = randn(T, Hq + 2 * Hkv, D, dtype=dtype, gen=gen)  # strided views, as from a fused proj
    q, k = qkv[:, :Hq], qkv[:, Hq : Hq + Hkv]
    positions = torch.randint(0, max_pos, (T,), generator=gen).to(pos_dtype).to(DEVICE)
    q_ref, k_ref = apply_rope_ref(q, k, positions, cache)
    v_before = qkv[:, Hq + Hkv :].clone()
    apply_rope(q, k, positions, cache)
    tol = ELEMENTWISE_TOL[dtype]
    torch.testing.assert_close(q, q_ref, atol=tol, rtol=tol)
    torch.testing.assert_close(k, k_ref, atol=tol, rtol=tol)
    assert torch.equal(qkv[:, Hq + Hkv :], v_before)


@pytest.mark.parametrize("scaling", SCALINGS, ids=str)
def test_inv_freq_matches_transformers_exactly(scaling):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = transformers.LlamaConfig(
        hidden_size=8 * 16, num_attention_heads=8, rope_theta=500000.0, rope_scaling=scaling
    )
    want = LlamaRotaryEmbedding(config=config).inv_freq
    rope_type = config.rope_parameters["rope_type"]
    got = rope_inv_freq(16, 500000.0, scaling)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    if rope_type != "default":
        assert not torch.equal(got, rope_inv_freq(16, 500000.0, None))


@pytest.mark.parametrize("scaling", SCALINGS, ids=str)
def test_matches_transformers(scaling):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    D, T, base = 64, 9, 500000.0
    config = transformers.LlamaConfig(
        hidden_size=8 * D,
        num_attention_heads=8,
        rope_theta=base,
        rope_scaling=scaling,
        max_position_embeddings=131072,
    )
    positions = torch.tensor([0, 1, 2, 100, 4095, 8191, 9000, 65000, 131071])
    cos, sin = LlamaRotaryEmbedding(config=config)(torch.zeros(1, T, D), positions[None])
    cache = rope_cos_sin_cache(D, 131072, base, scaling, "cpu")
    ours_cos, ours_sin = cache[positions].chunk(2, dim=-1)
    torch.testing.assert_close(torch.cat([ours_cos, ours_cos], -1), cos[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat([ours_sin, ours_sin], -1), sin[0], atol=1e-5, rtol=0)

    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(T, 4, D, generator=gen), torch.randn(T, 2, D, generator=gen)
    hf_q, hf_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    ref_q, ref_k = apply_rope_ref(q, k, positions, cache)
    torch.testing.assert_close(ref_q, hf_q[0].transpose(0, 1), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ref_k, hf_k[0].transpose(0, 1), atol=1e-4, rtol=1e-4)


def test_rejects_unknown_scaling():
    with pytest.raises(ValueError, match="yarn"):
        rope_cos_sin_cache(64, 10, 10000.0, {"rope_type": "yarn", "factor": 2.0}, "cpu")
