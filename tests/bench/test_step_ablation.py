"""The step ablation takes kernel groups out of the forward by replacing what the forward
looks up at call time (the ops' methods, module globals): each cut must replace it, keep the
shapes the model expects, and leave everything as it was afterwards."""

import sys

import pytest
import torch

from bench.offline import step_ablation as ablation
from kernels.attention.decode import decode_attention, decode_attention_ref
from runtime.worker import attention_triton
from runtime.worker.ops import TritonOps
from tests.kernels.test_decode_attention import make_inputs


def _state():
    merge = sys.modules["kernels.attention.decode"]._decode_attention_merge_kernel
    return (dict(TritonOps.__dict__), attention_triton.rope_store_kv, merge,
            attention_triton.TritonAttention.__dict__["forward_rotary"])


@pytest.mark.parametrize("group", ablation.GROUPS)
def test_every_cut_is_undone(group):
    before = _state()
    with ablation.without(group):
        assert _state() != before
    assert _state() == before


def test_merge_cut_leaves_the_split_outputs_unmerged():
    args, _ = make_inputs([65, 9], (4, 2, 32), 16, torch.float32, seed=3)
    sentinel = torch.full_like(args[0], 7.0)  # [B, Hq, D]
    with ablation.without("merge"):
        out = decode_attention(*args, num_splits=3, out=sentinel.clone())
    assert (out == 7.0).all()
    torch.testing.assert_close(decode_attention(*args, num_splits=3),
                               decode_attention_ref(*args), atol=1e-5, rtol=1e-5)


def test_stand_ins_keep_the_shapes_the_model_expects():
    x, res, w = torch.randn(3, 8), torch.randn(3, 8), torch.ones(8)
    with ablation.without("small"):
        assert TritonOps.rmsnorm(x, w, 1e-6) is x
        assert TritonOps.add_rmsnorm(x, res, w, 1e-6) == (x, res)
        assert TritonOps.silu_mul(x).shape == (3, 4)
        q = torch.randn(2, 4, 16)
        assert attention_triton.rope_store_kv(q, None, None)[0] is q


def test_report_takes_medians_over_captures_and_counts_launches():
    v = {name: [4.3, 4.31, 4.29] for name in ("base", *ablation.GROUPS)}
    v["merge"] = [4.27, 4.25, 4.40]  # one slow capture: the median ignores it
    res = {"variants": v, "layers": 32, "splits": 32, "model": "m", "quantization": "none",
           "context": 576, "command": "c", "device": "d", "date": "t", "copy_tb_s": 4.2,
           "floor_ms": 3.5, "as_built_ms": 4.2, "act_launched": True}
    md = ablation.markdown(res)
    assert "| merge | 4.2700 | 4.2500-4.4000 | 30.0 | 32 | 0.94 |" in md
    assert "| rmsnorm | 4.3000 | 4.2900-4.3100 | 0.0 | 65 |" in md
    assert "| small | 4.3000 | 4.2900-4.3100 | 0.0 | 161 |" in md
    res["splits"] = 1  # no merge launched: nothing to divide by
    assert "| merge | 4.2700 | 4.2500-4.4000 | 30.0 | 0 | - |" in ablation.markdown(res)


def test_one_split_has_no_merge_and_a_fused_activation_no_launch_to_count():
    assert ablation.launches("merge", 32, merges=False, act=True) == 0
    assert ablation.launches("attention", 32, merges=False, act=True) == 64
    assert ablation.launches("small", 32, merges=True, act=True) == 161
    assert ablation.launches("silu_mul", 32, merges=True, act=False) == 0
    assert ablation.launches("small", 32, merges=True, act=False) == 129
