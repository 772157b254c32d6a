import pytest
import torch

from kernels.kv.store import quantize_ref
from kernels.sparse.sparse_mqa import (
    SparseMqaConfig,
    sparse_mqa_attention,
    sparse_mqa_attention_ref,
)
from tests.kernels.attention_cases import assert_matches_ref
from tests.kernels.cases import ATTN_TOL, DEVICE, DTYPES, randn

SLOTS = 131


def key_lists(T: int, K: int, gen: torch.Generator, holes: float = 0.25) -> torch.Tensor:
    """`[T, K]` int32: each row K distinct slots of SLOTS, a `holes` share of them -1."""
    idx = torch.rand(T, SLOTS, generator=gen).argsort(1)[:, :K]  # [T, K]
    idx[torch.rand(T, K, generator=gen) < holes] = -1
    return idx.to(torch.int32).to(DEVICE)


def make_inputs(T, H, d, K, dtype, pool_dtype=None, seed=0):
    """(q, kv, indices, sink, scale): kv a column range of wider pool rows."""
    gen = torch.Generator().manual_seed(seed)
    q = randn(T, H, d, dtype=dtype, gen=gen)  # [T, H, d]
    rows = randn(SLOTS, d + 9, dtype=pool_dtype or dtype, gen=gen)  # [S, width]
    sink = randn(H, gen=gen)  # [H]
    return q, rows[:, 5 : 5 + d], key_lists(T, K, gen), sink, d**-0.5


def check(args, dtype, both=None, **kernel_only):
    """The kernel against its reference on `args` (and the keyword arguments `both`)."""
    return assert_matches_ref(sparse_mqa_attention, sparse_mqa_attention_ref, args, both or {},
                              dtype, **kernel_only)


def naive(q, kv, indices, sink, scale):
    """Per query and head: the listed rows' softmax with the sink in its denominator, float64."""
    T, H, d = q.shape
    out = torch.zeros(T, H, d, dtype=torch.float64, device=q.device)
    for t in range(T):
        rows = kv[indices[t][indices[t] >= 0].long()].double()  # [k, d]
        for h in range(H):
            e = torch.exp(rows @ q[t, h].double() * scale)  # [k]
            out[t, h] = e @ rows / (e.sum() + torch.exp(sink[h].double()))
    return out


def test_reference_matches_naive():
    q, kv, indices, sink, scale = make_inputs(4, 3, 16, 20, torch.float32, seed=1)
    indices[2] = -1  # a query with no key: the sink takes it all, output 0
    out = sparse_mqa_attention_ref(q, kv, indices, sink, scale)
    tol = ATTN_TOL[torch.float32]
    torch.testing.assert_close(out.double(), naive(q, kv, indices, sink, scale), atol=tol,
                               rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 512])
@pytest.mark.parametrize("T, H, K", [(1, 16, 37), (3, 3, 70), (37, 3, 5)], ids=str)
def test_matches_reference(T, H, K, d, dtype):
    # 3 heads pad a 16-head block; 16 fill one; 37 and 70 keys end in a partial tile
    check(make_inputs(T, H, d, K, dtype, seed=T), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_queries_and_empty_tiles(dtype):
    q, kv, indices, sink, scale = make_inputs(3, 5, 64, 100, dtype, seed=2)
    indices[0] = -1  # no key: 0
    indices[1, :64] = -1  # the first tiles all -1, keys after them
    out = check((q, kv, indices, sink, scale), dtype, config=SparseMqaConfig(block_k=16))
    assert (out[0] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_entries_from_a_second_view(dtype):
    # window rows and compressed entries at two column ranges of the same pool rows
    gen = torch.Generator().manual_seed(3)
    q, kv, indices, sink, scale = make_inputs(7, 6, 64, 40, dtype, seed=3)
    rows = randn(SLOTS, 200, dtype=dtype, gen=gen)
    both = {"entry_kv": rows[:, 100:164], "entry_indices": key_lists(7, 19, gen, 0.5)}
    check((q, rows[:, 3:67], indices, sink, scale), dtype, both)


def fp8_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows `[S, d]` as e4m3 codes and their float32 scales `[S]` (`quantize_ref`), quantized
    on the CPU (the Triton interpreter rounds to e4m3 wrongly) and moved to DEVICE."""
    codes, scale = quantize_ref(rows.float().cpu(), torch.float8_e4m3fn)
    return codes.to(DEVICE), scale.to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T, H, d, K, E", [(1, 16, 64, 37, 11), (3, 3, 512, 70, 0),
                                           (37, 5, 64, 5, 19)], ids=str)
def test_fp8_pool_matches_reference(T, H, d, K, E, dtype):
    """e4m3 window rows (and entries) with a float32 scale a row: decode (one query) and
    extend shapes, partial head blocks and tiles, rows of three magnitudes (each its own
    scale), against the reference, which reads `codes * scale` in float32; and within
    e4m3's rounding of the attention over the rows before quantizing (of the largest
    output)."""
    gen = torch.Generator().manual_seed(T + E)
    q, _, indices, sink, scale = make_inputs(T, H, d, K, dtype, seed=T)
    rows = torch.randn(SLOTS, d, generator=gen) * torch.tensor([0.05, 1.0, 3.0])[
        torch.arange(SLOTS) % 3, None]  # [S, d]
    kv, kv_scale = fp8_rows(rows)
    both = {"kv_scale": kv_scale}
    if E:
        entries = torch.randn(SLOTS, d, generator=gen)  # [S', d]
        entry_kv, entry_scale = fp8_rows(entries)
        both.update(entry_kv=entry_kv, entry_indices=key_lists(T, E, gen, 0.5),
                    entry_scale=entry_scale)
    out = check((q, kv, indices, sink, scale), dtype, both)
    plain = {"entry_kv": entries.to(DEVICE, dtype), "entry_indices": both["entry_indices"]} if (
        E) else {}
    exact = sparse_mqa_attention_ref(q, rows.to(DEVICE, dtype), indices, sink, scale, **plain)
    # e4m3 keeps 3 mantissa bits (a value's rounding up to 1/16): measured 0.036 to 0.043
    err = (out.float() - exact.float()).abs().max() / exact.float().abs().max()
    assert err < 0.06


def test_fp8_pool_needs_its_scales():
    q, kv, indices, sink, scale = make_inputs(2, 4, 64, 8, torch.float32)
    codes, row_scale = fp8_rows(kv)
    with pytest.raises(AssertionError, match=r"e4m3 kv view needs its scales float32 \[131\]"):
        sparse_mqa_attention(q, codes, indices, sink, scale)
    with pytest.raises(AssertionError, match="or e4m3 with scales"):
        sparse_mqa_attention(q, kv, indices, sink, scale, kv_scale=row_scale)


def test_pool_wider_than_q():
    # a float32 pool read by fp16 queries: rows rounded to fp16 in both
    check(make_inputs(5, 4, 64, 30, torch.float16, torch.float32, seed=4), torch.float16)


def test_sink_weight():
    q, kv, indices, _, scale = make_inputs(3, 2, 64, 24, torch.float32, seed=5)
    no_sink = sparse_mqa_attention(q, kv, indices, torch.full((2,), -1e4, device=DEVICE), scale)
    dense = sparse_mqa_attention_ref(q, kv, indices, torch.full((2,), -1e4, device=DEVICE), scale)
    torch.testing.assert_close(no_sink, dense, atol=1e-5, rtol=1e-5)
    # a sink of log(Z) (Z the keys' own softmax sum) halves every output
    rows = kv[indices.clamp(min=0).long()]  # [T, K, d]
    scores = torch.einsum("thd,tkd->thk", q, rows) * scale
    z = scores.masked_fill(indices[:, None, :] < 0, float("-inf")).logsumexp(-1)  # [T, H]
    half = sparse_mqa_attention(q[:1], kv, indices[:1], z[0], scale)
    torch.testing.assert_close(half, no_sink[:1] / 2, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "config", [SparseMqaConfig(block_h=32, block_k=16), SparseMqaConfig(block_k=128)], ids=str
)
def test_launch_configs(config):
    check(make_inputs(4, 19, 64, 45, torch.float32, seed=6), torch.float32, config=config)


def test_strided_q_int64_indices_and_out_buffer():
    q, kv, indices, sink, scale = make_inputs(5, 4, 64, 33, torch.float32, seed=7)
    wide = torch.zeros(5, 4, 80, device=DEVICE)
    wide[..., :64] = q
    out = torch.full((5, 4, 64), float("nan"), device=DEVICE)
    got = sparse_mqa_attention(wide[..., :64], kv, indices.long(), sink, scale, out=out)
    assert got.data_ptr() == out.data_ptr()
    tol = ATTN_TOL[torch.float32]
    torch.testing.assert_close(out, sparse_mqa_attention_ref(q, kv, indices, sink, scale),
                               atol=tol, rtol=tol)


def test_no_tokens():
    q, kv, indices, sink, scale = make_inputs(0, 4, 64, 8, torch.float32)
    assert sparse_mqa_attention(q, kv, indices, sink, scale).shape == (0, 4, 64)


def test_rejects_bad_inputs():
    q, kv, indices, sink, scale = make_inputs(2, 4, 64, 8, torch.float32)
    with pytest.raises(AssertionError, match="kv indices must be int32/int64"):
        sparse_mqa_attention(q, kv, indices.float(), sink, scale)
    with pytest.raises(AssertionError, match=r"kv view must be \[slots, 64\]"):
        sparse_mqa_attention(q, kv[:, :32], indices, sink, scale)
    with pytest.raises(AssertionError, match="come together"):
        sparse_mqa_attention(q, kv, indices, sink, scale, entry_kv=kv)
    with pytest.raises(AssertionError, match=r"sink must be a float \[4\]"):
        sparse_mqa_attention(q, kv, indices, sink[:3], scale)
