import pytest
import torch

from kernels.kv.store import dequantize_ref, quantize_ref, scale_pairs, store_kv, store_kv_ref
from tests.kernels.cases import DEVICE, DTYPES, randn

# (T, Hkv, D): odd head counts and a head_dim that is not a power of two
SHAPES = [(1, 1, 16), (7, 3, 48), (20, 8, 64)]


def make_inputs(shape, pool_dtype, dtype, seed=0, paired=False):
    gen = torch.Generator().manual_seed(seed)
    T, H, D = shape
    num_slots = 2 * T + 5
    slots = (torch.randperm(num_slots - 1, generator=gen)[:T] + 1).to(DEVICE)  # [T], no dups
    k = randn(T, H, D, dtype=dtype, gen=gen) * 3  # [T, H, D]
    v = randn(T, H, D, dtype=dtype, gen=gen)  # [T, H, D]
    k[0, 0] = 0  # an all-zero row exercises the zero-scale guard
    k_buf = torch.zeros(num_slots, H, D, device=DEVICE).to(pool_dtype)  # [S, H, D]
    v_buf = torch.zeros_like(k_buf)
    scales = {}
    if pool_dtype in (torch.int8, torch.float8_e4m3fn) and paired:  # the engine pool's layout
        pairs = scale_pairs(num_slots, H, DEVICE).zero_()  # [S, H, 2]
        scales = {"k_scale": pairs[..., 0], "v_scale": pairs[..., 1]}
    elif pool_dtype in (torch.int8, torch.float8_e4m3fn):
        scales = {n: torch.zeros(num_slots, H, device=DEVICE) for n in ("k_scale", "v_scale")}
    return (k, v, k_buf, v_buf, slots), scales


def run_both(args, scales):
    k, v, k_buf, v_buf, slots = args
    ref_bufs = (k_buf.clone(), v_buf.clone())
    ref_scales = {n: s.clone() for n, s in scales.items()}
    store_kv(*args, **scales)
    store_kv_ref(k, v, *ref_bufs, slots, **ref_scales)
    return ref_bufs, ref_scales


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_plain_pool(dtype, shape, slot_dtype):
    (k, v, k_buf, v_buf, slots), _ = make_inputs(shape, dtype, dtype)
    args = (k, v, k_buf, v_buf, slots.to(slot_dtype))
    (k_ref, v_ref), _ = run_both(args, {})
    assert torch.equal(k_buf, k_ref) and torch.equal(v_buf, v_ref)


def assert_quantized_close(buf, scale, ref_buf, ref_scale, pool_dtype):
    torch.testing.assert_close(scale, ref_scale, rtol=1e-6, atol=0)
    q, q_ref = buf.float(), ref_buf.float()
    if pool_dtype == torch.int8:
        ulp = torch.ones_like(q_ref)
    else:  # one e4m3 step at the reference's magnitude (3 mantissa bits, min normal 2^-6)
        ulp = torch.exp2(torch.floor(torch.log2(q_ref.abs().clamp(min=2**-6))) - 3)
    # The GPU divides approximately, so a value at a rounding tie may land one step over.
    assert ((q - q_ref).abs() <= ulp).all()
    assert (q == q_ref).float().mean() > 0.99


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize(
    "pool_dtype",
    [
        pytest.param(torch.int8, id="int8"),
        # The Triton interpreter rounds fp32 -> e4m3 without carrying into the exponent
        # (127.8 -> 64), so fp8 stores are checked on the GPU only.
        pytest.param(torch.float8_e4m3fn, id="fp8", marks=pytest.mark.gpu),
    ],
)
@pytest.mark.parametrize(
    "dtype", [torch.float32, pytest.param(torch.float16, marks=pytest.mark.gpu)], ids=str
)
@pytest.mark.parametrize("paired", [False, True], ids=["two-tensors", "pairs"])
def test_quantized_pool(shape, pool_dtype, dtype, paired):
    args, scales = make_inputs(shape, pool_dtype, dtype, seed=1, paired=paired)
    (k_ref, v_ref), ref_scales = run_both(args, scales)
    _, _, k_buf, v_buf, slots = args
    assert_quantized_close(k_buf, scales["k_scale"], k_ref, ref_scales["k_scale"], pool_dtype)
    assert_quantized_close(v_buf, scales["v_scale"], v_ref, ref_scales["v_scale"], pool_dtype)
    assert (scales["k_scale"][slots[0], 0] == 1.0).item()  # the zero row
    untouched = torch.ones(k_buf.shape[0], dtype=torch.bool, device=DEVICE)
    untouched[slots.long()] = False
    assert (k_buf[untouched].float() == 0).all() and (scales["v_scale"][untouched] == 0).all()


@pytest.mark.parametrize("pool_dtype", [torch.int8, torch.float8_e4m3fn], ids=str)
def test_quantize_roundtrip_ref(pool_dtype):
    x = torch.randn(50, 4, 64, generator=torch.Generator().manual_seed(2))
    q, scale = quantize_ref(x, pool_dtype)
    err = (dequantize_ref(q, scale) - x).abs()
    bound = 0.5 * scale[..., None] if pool_dtype == torch.int8 else x.abs() / 16 + scale[..., None]
    assert (err <= bound + 1e-7).all()


def test_empty_and_bad_inputs():
    (k, v, k_buf, v_buf, slots), scales = make_inputs((3, 2, 16), torch.int8, torch.float32)
    store_kv(k[:0], v[:0], k_buf, v_buf, slots[:0], **scales)
    assert (k_buf == 0).all()
    with pytest.raises(AssertionError, match="needs k_scale"):
        store_kv(k, v, k_buf, v_buf, slots)
    with pytest.raises(AssertionError, match="slots"):
        store_kv(k, v, k_buf, v_buf, slots[:2], **scales)


def assert_cast_close(buf, ref_buf):
    """An unscaled fp8 store against torch's cast: equal on the GPU. Triton's interpreter
    rounds some float32 -> e4m3 casts a binade down (7.9 -> 4, where the GPU gives 8), so on
    the CPU a few codes may land within a factor of 2 of torch's (or one subnormal step)."""
    q, q_ref = buf.float(), ref_buf.float()
    if DEVICE == "cuda":
        assert torch.equal(q, q_ref)
    else:
        assert (q == q_ref).float().mean() > 0.95
        assert ((q - q_ref).abs() <= q_ref.abs() / 2 + 2**-9).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_unscaled_fp8_pool(dtype, shape):
    # No scales: the values are cast to e4m3 as they are, saturating at +-448.
    (k, v, k_buf, v_buf, slots), _ = make_inputs(shape, torch.float8_e4m3fn, dtype)
    k[-1, -1, :2] = torch.tensor([1e4, -1e4], dtype=dtype)
    (k_ref, v_ref), _ = run_both((k, v, k_buf, v_buf, slots), {})
    assert_cast_close(k_buf, k_ref)
    assert_cast_close(v_buf, v_ref)
    assert k_buf[slots[-1], -1, :2].float().tolist() == [448.0, -448.0]
