"""The Gluon fp8 stage 1 (`kernels.decode_attention_gluon`) against the reference: MHA and
GQA groups up to 16, token and paged layouts, splits, partial and empty tiles; and V's codes
coming back exactly (the register-level operand build). GPU only: Gluon has no interpreter."""

import pytest
import torch

from kernels.decode_attention import DecodeConfig, decode_attention
from kernels.store_kv import dequantize_ref
from tests.kernels.test_decode_attention import check, make_inputs

pytestmark = pytest.mark.gpu
GLUON = DecodeConfig(gluon=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads", [(32, 32, 128), (32, 8, 128), (16, 1, 128), (6, 2, 128)],
                         ids=str)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_matches_reference(dtype, heads, page_size, num_splits):
    args, scales = make_inputs([1, 37, 150, 700, 0], heads, page_size, dtype,
                               torch.float8_e4m3fn, seed=sum(heads))
    check(args, scales, dtype, config=GLUON, num_splits=num_splits)


def test_every_code_widens_exactly():
    codes = torch.arange(256, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0  # the two NaNs
    v_buf = torch.zeros(3, 1, 128, dtype=torch.uint8)
    v_buf[1:, 0] = codes.view(2, 128)
    v_buf = v_buf.view(torch.float8_e4m3fn).cuda()
    scale = torch.full((3, 1), 0.375, device="cuda")
    q = torch.randn(2, 2, 128, device="cuda").half()
    indptr = torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda")
    indices = torch.tensor([1, 2], dtype=torch.int32, device="cuda")
    lens = torch.ones(2, dtype=torch.int32, device="cuda")
    out = decode_attention(q, v_buf, v_buf, indptr, indices, lens, 1, 128**-0.5,
                           k_scale=scale, v_scale=scale, config=GLUON)
    want = dequantize_ref(v_buf[1:], scale[1:]).expand(2, 2, 128).half()
    torch.testing.assert_close(out, want, atol=0, rtol=0)
