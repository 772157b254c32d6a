"""An fp8 or int8 pool decoded by the Gluon stage 1 serves the model output the Triton stage 1
serves:
a head_dim-128 variant of dummy:tiny in fp16 on CUDA (decode through CUDA graphs), the bench's
3 random prompts, 256 tokens, each stage 1 in its own runner. GPU only."""

import sys

import pytest
import torch

from bench.offline.kv_quant import compare, make_prompts
from kernels.attention import decode_config
from runtime.model_config import resolve_model
from runtime.model_presets import DUMMY_PRESETS
from runtime.worker.model_runner import ModelRunner
from tests.worker.batching import greedy
from tests.worker.test_kv_quant import NEW_TOKENS, ROWS, slots_for

DECODE = sys.modules["kernels.attention.decode"]  # the package re-exports the function


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", ["fp8", "fp8_e4m3", "int8"])
def test_gluon_and_triton_stage1_serve_the_same_output(monkeypatch, kv_dtype):
    monkeypatch.setitem(DUMMY_PRESETS, "tiny-d128", dict(
        DUMMY_PRESETS["tiny"], hidden_size=512, num_attention_heads=4, num_key_value_heads=2))
    spec = resolve_model("dummy:tiny-d128")
    prompts = make_prompts(spec, spec.hf_config().vocab_size)
    n = len(prompts)

    def runner():
        return ModelRunner(spec, "cuda", torch.float16, kv_slots=slots_for(prompts),
                           max_rows=ROWS, kv_dtype=kv_dtype)

    with monkeypatch.context() as m:
        # no GPU is recent enough: default_quant_config picks the Triton stage 1
        m.setattr(decode_config, "GLUON_CAPABILITY",
                  dict.fromkeys(decode_config.GLUON_CAPABILITY, (99, 0)))
        tokens, logits = greedy(runner(), prompts + prompts, NEW_TOKENS)
    picked = []
    default = DECODE.default_quant_config
    monkeypatch.setattr(DECODE, "default_quant_config",
                        lambda *a: picked.append(default(*a)) or picked[-1])
    gluon = runner()
    assert gluon.graphs is not None, "CUDA graphs were not captured"
    got = compare(gluon, prompts, tokens[:n], logits[:n], NEW_TOKENS)
    assert picked and all(c.gluon for c in picked), picked
    assert got["rel_logit_err"] <= 0.01, got
    assert got["top1_agreement"] >= 0.95, got
