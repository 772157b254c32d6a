import pytest
import torch

from kernels.kv.rope_store import rope_store_kv, rope_store_kv_ref
from kernels.norm_rope.rope import rope_cos_sin_cache
from tests.kernels.cases import DEVICE, DTYPES, ELEMENTWISE_TOL, randn
from tests.kernels.test_store_kv import assert_cast_close, assert_quantized_close

# (T, Hq, Hkv, D): one head, odd GQA, odd MHA, a head_dim that is not a power of two
SHAPES = [(1, 1, 1, 16), (5, 9, 3, 48), (6, 7, 7, 32)]
MAX_POS = 700
QUANT_POOLS = [
    pytest.param(torch.int8, id="int8"),
    # the interpreter rounds fp32 -> e4m3 without carrying into the exponent (test_store_kv)
    pytest.param(torch.float8_e4m3fn, id="fp8", marks=pytest.mark.gpu),
]


def make_inputs(shape, dtype, pool_dtype, norm, seed=0):
    """q, k, v as strided views of one fused QKV output, a pool (with scales if quantized),
    distinct slots and positions well past a short prompt; plus the keyword arguments."""
    gen = torch.Generator().manual_seed(seed)
    T, Hq, Hkv, D = shape
    qkv = randn(T, Hq + 2 * Hkv, D, dtype=dtype, gen=gen) * 2  # [T, Hq + 2 Hkv, D]
    q, k, v = qkv[:, :Hq], qkv[:, Hq : Hq + Hkv], qkv[:, Hq + Hkv :]
    num_slots = 3 * T + 4
    slots = (torch.randperm(num_slots - 1, generator=gen)[:T] + 1).to(DEVICE)  # [T], no dups
    positions = torch.randint(300, MAX_POS, (T,), generator=gen).to(DEVICE)  # [T]
    pool = torch.zeros(num_slots, Hkv, D, device=DEVICE).to(pool_dtype)  # [S, Hkv, D]
    kw = {}
    if pool_dtype in (torch.int8, torch.float8_e4m3fn):
        kw = {n: torch.zeros(num_slots, Hkv, device=DEVICE) for n in ("k_scale", "v_scale")}
    if norm:
        kw["q_norm"] = (randn(D, gen=gen) * 0.3 + 1).to(dtype)  # [D]
        kw["k_norm"] = (randn(D, gen=gen) * 0.3 + 1).to(dtype)
        kw["eps"] = 1e-6
    cache = rope_cos_sin_cache(D, MAX_POS, 10000.0, None, DEVICE)  # [max_pos, D]
    return [q, k, v, pool, pool.clone(), slots, positions, cache], kw


def run_both(args, kw, kv_out):
    """The fused kernel and its reference on separate copies of the pool."""
    ref_args = [*args[:3], args[3].clone(), args[4].clone(), *args[5:]]
    ref_kw = {n: x.clone() if n.endswith("scale") else x for n, x in kw.items()}
    got = rope_store_kv(*args, **kw, kv_out=kv_out)
    want = rope_store_kv_ref(*ref_args, **ref_kw, kv_out=kv_out)
    return got, want, ref_args, ref_kw


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("norm", [False, True], ids=["plain", "qk_norm"])
@pytest.mark.parametrize("kv_out", [False, True], ids=["decode", "extend"])
def test_plain_pool_matches_unfused(dtype, shape, norm, kv_out):
    args, kw = make_inputs(shape, dtype, dtype, norm)
    qkv_before = [x.clone() for x in args[:3]]
    (q, k_new, v_new), (q_ref, k_ref, v_ref), ref_args, _ = run_both(args, kw, kv_out)
    tol = ELEMENTWISE_TOL[dtype]
    assert q.is_contiguous() and q.shape == args[0].shape
    torch.testing.assert_close(q, q_ref, atol=tol, rtol=tol)
    torch.testing.assert_close(args[3], ref_args[3], atol=tol, rtol=tol)  # rotated k in the pool
    assert torch.equal(args[4], ref_args[4])  # v copied as is
    if kv_out:
        torch.testing.assert_close(k_new, k_ref, atol=tol, rtol=tol)
        assert torch.equal(v_new, v_ref) and k_new.is_contiguous() and v_new.is_contiguous()
    else:
        assert k_new is None and v_new is None
    assert all(torch.equal(x, y) for x, y in zip(args[:3], qkv_before))  # inputs untouched
    untouched = torch.ones(args[3].shape[0], dtype=torch.bool, device=DEVICE)
    untouched[args[5]] = False
    assert (args[3][untouched] == 0).all() and (args[4][untouched] == 0).all()


@pytest.mark.parametrize("pool_dtype", QUANT_POOLS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("norm", [False, True], ids=["plain", "qk_norm"])
@pytest.mark.parametrize(
    "dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)], ids=str
)
def test_quantized_pool_matches_unfused(pool_dtype, shape, norm, dtype):
    args, kw = make_inputs(shape, dtype, pool_dtype, norm, seed=1)
    (q, _, _), (q_ref, _, _), ref_args, ref_kw = run_both(args, kw, kv_out=False)
    tol = ELEMENTWISE_TOL[dtype]
    torch.testing.assert_close(q, q_ref, atol=tol, rtol=tol)
    for i, name in ((3, "k_scale"), (4, "v_scale")):
        scale, ref_scale = kw[name], ref_kw[name]
        if i == 3:  # k went through norm and rotation: equal up to the float error
            torch.testing.assert_close(scale, ref_scale, rtol=1e-5, atol=0)
            ref_scale = scale
        assert_quantized_close(args[i], scale, ref_args[i], ref_scale, pool_dtype)


@pytest.mark.parametrize("norm", [False, True], ids=["plain", "qk_norm"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_unscaled_fp8_pool_matches_unfused(norm, dtype):
    args, kw = make_inputs(SHAPES[-1], dtype, torch.float8_e4m3fn, norm, seed=2)
    kw = {n: x for n, x in kw.items() if not n.endswith("scale")}  # no scales: codes = values
    (q, _, _), (q_ref, _, _), ref_args, _ = run_both(args, kw, kv_out=False)
    tol = ELEMENTWISE_TOL[dtype]
    torch.testing.assert_close(q, q_ref, atol=tol, rtol=tol)
    assert_cast_close(args[4], ref_args[4])  # v cast as is
    # k went through norm and rotation: equal up to the float error, then cast
    k_codes, k_ref_codes = args[3].float(), ref_args[3].float()
    assert (k_codes == k_ref_codes).float().mean() > 0.95
    assert ((k_codes - k_ref_codes).abs() <= k_ref_codes.abs() / 2 + 2**-9).all()


def test_empty_and_bad_inputs():
    args, kw = make_inputs((3, 4, 2, 16), torch.float32, torch.int8, norm=False)
    empty = [x[:0] for x in args[:3]] + args[3:5] + [x[:0] for x in args[5:7]] + args[7:]
    q, _, _ = rope_store_kv(*empty, **kw)
    assert q.shape == (0, 4, 16) and (args[3] == 0).all()
    with pytest.raises(AssertionError, match="k_scale"):
        rope_store_kv(*args)
    with pytest.raises(AssertionError, match="together"):
        rope_store_kv(*args, **kw, q_norm=torch.ones(16, device=DEVICE))
