"""DeepSeek-V4 checkpoints in the layout DeepSeek releases them in (`tests.worker.dsv4_released`:
its names, its MTP layer, its shards; block fp8 projections with e8m0 scales; packed fp4
routed experts) against a transformers-layout checkpoint of the same weights dequantized:
the same logits, fp32 on the CPU. transformers' own loader reads the helper's folders as
those weights, so the layout tested is the one transformers reads as the release."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, FineGrainedFP8Config

from runtime.model_config import resolve_model
from runtime.worker.model_check import UnsupportedModel, check_model
from runtime.worker.model_runner import ModelRunner
from runtime.worker.quant.block_fp8_linear import BlockFp8Linear
from tests.worker.batching import Chunk, Driver, greedy
from tests.worker.dsv4_checkpoints import tiny_v4
from tests.worker.dsv4_released import write_released
from tests.worker.test_deepseek import LAYOUTS, run

FP8 = torch.float8_e4m3fn
# the tiny shape with 128-row blocks to cut: two blocks along the hidden size and the query
# heads, and whole-block groups of the grouped output projection
FP8_SHAPE = dict(hidden_size=256, num_attention_heads=8, o_groups=2, o_lora_rank=128)
SCHEDULE = [[9, 3, 1, 1], [5, 7, 1, 1]]  # at most 16 rows a step: weight-only fp8 products


def runner(folder) -> ModelRunner:
    return ModelRunner(resolve_model(str(folder)), "cpu", torch.float32, kv_slots=256,
                       max_rows=4)


def prompts(*lengths: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(2)
    return [torch.randint(0, 256, (n,), generator=gen).tolist() for n in lengths]


def test_released_names_load_as_the_transformers_layout(tmp_path, caplog):
    """Released names (`embed`, `layers.N.attn.kv_norm`, `hc_head_fn`, ...) give the model
    the transformers checkpoint's weights: identical logits in every KV layout; the MTP
    layer's tensors are skipped, in one log line."""
    released, reference = write_released(tiny_v4(), tmp_path)
    with caplog.at_level(logging.INFO, logger="sluice.worker"):
        ours = runner(released)
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 1 and "mtp.0." in skipped[0], skipped
    ref = runner(reference)
    seqs = prompts(*map(sum, SCHEDULE))
    for name, page_size, per_slot in LAYOUTS:
        got = run(ours, seqs, page_size, per_slot, SCHEDULE)
        want = run(ref, seqs, page_size, per_slot, SCHEDULE)
        for g, w in zip(got, want):
            assert torch.equal(g, w), name


@pytest.mark.parametrize("quant,shape", [("fp8", FP8_SHAPE), ("fp4", FP8_SHAPE), ("fp8", {})])
def test_released_quantized_checkpoint_matches_its_dequantized_twin(quant, shape, tmp_path):
    """Block fp8 projections stay fp8 (e8m0 scales read as powers of two; the tiny shape's
    are partial blocks, and its output groups of 16 rows, not whole blocks, keep `wo_a` in
    16 bits), the compressors and the router stay 16-bit, the routed experts (fp8 or packed
    fp4) are dequantized at load: up to 16 rows a step the logits are those of the
    dequantized weights, greedy tokens included."""
    released, reference = write_released(tiny_v4(**shape), tmp_path, quant)
    ours, ref = runner(released), runner(reference)
    assert (ours.quantization, ref.quantization) == ("fp8", "none")
    layer = ours.model.model.layers[1]  # a CSA layer
    for proj in (layer.attn.wq_a, layer.attn.wq_b, layer.attn.wkv, layer.attn.wo_b,
                 layer.attn.indexer.wq_b, layer.ffn.shared_experts.w2):
        assert isinstance(proj, BlockFp8Linear) and proj.weight.dtype == FP8
    assert layer.attn.wq_a.weight_scale_inv.shape == ((1, 2) if shape else (1, 1))
    assert isinstance(layer.attn.wo_a, BlockFp8Linear) == bool(shape)
    w13, _ = layer.ffn.experts.stacked()
    assert layer.attn.compressor.wkv.weight.dtype == w13.dtype == torch.float32
    seqs = prompts(*map(sum, SCHEDULE))
    for g, w in zip(run(ours, seqs, 1, False, SCHEDULE), run(ref, seqs, 1, False, SCHEDULE)):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    tokens, want = greedy(ref, prompts(12, 9), 5)
    got_tokens, got = greedy(ours, prompts(12, 9), 5)
    assert got_tokens == tokens
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_long_steps_quantize_activations_and_stay_close(tmp_path):
    """A 40-token prefill runs the block fp8 products w8a8 (activations per token and
    128-column group) where the input is whole groups. Seven quantized products a layer in
    a chain, four layers, random weights, and discrete picks (the indexer's top-k, the
    routers') that a small change flips: the logits stay near the dequantized weights'
    (L2 error, each position: measured median 16%, max 50%; unrelated ones: ~141%)
    and most positions keep their argmax (measured 26 of 40)."""
    released, reference = write_released(tiny_v4(**FP8_SHAPE), tmp_path, "fp8")
    (prompt,) = prompts(40)
    want, got = (Driver(runner(d), 1).step([Chunk(0, prompt)], sample_all=True)
                 for d in (reference, released))  # [40, V] each
    err = (got - want).norm(dim=-1) / want.norm(dim=-1)
    assert err.min() > 1e-4  # the activations were quantized
    assert err.median() < 0.25 and err.max() < 0.8, err
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.5


@pytest.mark.parametrize("quant", ["fp8", "fp4"])
def test_transformers_reads_the_released_layout_as_the_reference(quant, tmp_path):
    """transformers' loader (dequantizing) reads the helper's released folder as exactly
    the reference weights: names, e8m0 block scales and fp4 packing as it reads the
    release."""
    released, reference = write_released(tiny_v4(**FP8_SHAPE), tmp_path, quant)
    theirs = AutoModelForCausalLM.from_pretrained(
        released, dtype=torch.float32, quantization_config=FineGrainedFP8Config(dequantize=True))
    want = AutoModelForCausalLM.from_pretrained(reference, dtype=torch.float32).state_dict()
    got = theirs.state_dict()
    assert got.keys() == want.keys()
    for name, t in want.items():
        assert torch.equal(got[name], t), name


@pytest.mark.parametrize("change,field", [
    (dict(expert_dtype="int4"), "quantization_config.expert_dtype"),
    (dict(weight_block_size=[128, 100]), "quantization_config.weight_block_size"),
])  # fmt: skip
def test_unsupported_release_quantization_is_refused_by_field(change, field, tmp_path):
    released, _ = write_released(tiny_v4(), tmp_path, "fp8")
    config = json.loads((released / "config.json").read_text())
    config["quantization_config"].update(change)
    (released / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModel, match=f"config.json: {field} "):
        check_model(resolve_model(str(released)))


# ---------------------------------------------------------------- on the GPU
@pytest.mark.gpu
def test_cuda_released_fp8_tracks_its_dequantized_twin(tmp_path):
    """The CUDA products (block fp8 GEMM, `wo_a` group by group) on the released fp8
    layout: a 40-token prefill (w8a8) then decode steps (weight-only), teacher-forced on
    the dequantized checkpoint's tokens, stay as near its logits as the CPU emulation of
    the same products does (`test_long_steps_quantize_activations_and_stay_close`)."""
    released, reference = write_released(tiny_v4(**FP8_SHAPE), tmp_path, "fp8")

    def make(folder) -> ModelRunner:
        return ModelRunner(resolve_model(str(folder)), "cuda", torch.float32, kv_slots=256,
                           max_rows=2)

    tokens, want = greedy(make(reference), prompts(40, 9), 6)
    _, got = greedy(make(released), prompts(40, 9), 6, forced=tokens)
    err = ((got - want).norm(dim=-1) / want.norm(dim=-1)).flatten()
    assert err.median() < 0.25 and err.max() < 0.8, err
