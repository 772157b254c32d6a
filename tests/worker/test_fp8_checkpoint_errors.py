"""Bad fp8 checkpoints are refused at start-up with an error naming what is wrong: another
quantization method or number format (naming the config field), a layout the block GEMM
cannot hold (naming the tensor), a missing or misshapen scale, fp8 tensors without a
quantization_config, 16-bit tensors where the config says fp8."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from runtime.model_config import resolve_model
from runtime.worker.loader import load_model
from runtime.worker.quant.fp8_linear import QuantizationError
from runtime.worker.quant.scheme import QuantScheme, UnsupportedQuantization
from runtime.worker.safetensors_reader import WeightLoadError
from runtime.worker.tp import TPGroup
from tests.worker.fp8_checkpoints import (
    DYNAMIC_TOKEN,
    LAYOUTS,
    compressed_tensors,
    set_quantization_config,
    write_fp8_pair,
)
from tests.worker.test_fp8_checkpoints import tiny_hf

BLOCK_FP8 = LAYOUTS["block"][0]


def ct_with(**weights) -> dict:
    """A compressed-tensors config whose weights' arguments are overridden."""
    qc = compressed_tensors("channel", DYNAMIC_TOKEN)
    qc["config_groups"]["group_0"]["weights"].update(weights)
    return qc


REFUSED = [
    (dict(quant_method="awq", bits=4), r"quant_method 'awq' is not supported"),
    (dict(quant_method="gptq", bits=4), r"quant_method 'gptq'"),
    (dict(quant_method="bitsandbytes", load_in_4bit=True), r"quant_method 'bitsandbytes'"),
    (dict(BLOCK_FP8, fmt="e5m2"), r"quantization_config\.fmt 'e5m2'"),
    (dict(BLOCK_FP8, weight_block_size=[128, 96]), r"weight_block_size \[128, 96\]"),
    (dict(BLOCK_FP8, activation_scheme="per-head"), r"activation_scheme 'per-head'"),
    (ct_with(num_bits=4, type="int"),
     r"config_groups\.group_0\.weights: num_bits 4, type 'int'"),
    (ct_with(strategy="group", group_size=128), r"weights\.strategy 'group'"),
    (dict(compressed_tensors("channel", None), format="pack-quantized"),
     r"format 'pack-quantized'"),
    (dict(compressed_tensors("channel", None), kv_cache_scheme=dict(num_bits=8)),
     r"kv_cache_scheme"),
]


@pytest.mark.parametrize("qc,message", REFUSED, ids=[m for _, m in REFUSED])
def test_unsupported_quantization_configs_name_the_field(qc, message):
    with pytest.raises(UnsupportedQuantization, match=message):
        QuantScheme.from_config(SimpleNamespace(quantization_config=qc))


def test_supported_configs_parse():
    block = QuantScheme.from_config(SimpleNamespace(quantization_config=BLOCK_FP8), "none")
    assert (block.weights, block.block, block.scale_names) == (
        "fp8_block", (128, 128), ("weight_scale_inv",))
    qc = compressed_tensors("block", None, ignore=["lm_head"])
    ct = QuantScheme.from_config(SimpleNamespace(quantization_config=qc))
    assert (ct.weights, ct.block, ct.scale_names, ct.ignored) == (
        "fp8_block", (128, 128), ("weight_scale",), ("lm_head",))
    tensor = QuantScheme.from_config(SimpleNamespace(quantization_config=LAYOUTS["fp8-tensor"][0]))
    assert (tensor.weights, tensor.shipped) == ("fp8", True)
    assert QuantScheme.from_config(SimpleNamespace(), "fp8") == QuantScheme("fp8")


def test_an_unsupported_method_stops_start_up(tmp_path):
    fp8_dir, _ = write_fp8_pair(tiny_hf("llama"), "block", tmp_path)
    set_quantization_config(fp8_dir, dict(quant_method="awq", bits=4, group_size=128))
    with pytest.raises(UnsupportedQuantization, match="quant_method 'awq'"):
        load_model(resolve_model(str(fp8_dir)), "cpu", torch.float32)


def test_a_fused_layer_half_ignored_is_refused(tmp_path):
    fp8_dir, _ = write_fp8_pair(tiny_hf("llama"), "ct-channel", tmp_path)
    set_quantization_config(fp8_dir, compressed_tensors("channel", DYNAMIC_TOKEN,
                                                        ignore=["re:.*k_proj"]))
    with pytest.raises(UnsupportedQuantization, match=r"k_proj.*fused into one layer"):
        load_model(resolve_model(str(fp8_dir)), "cpu", torch.float32)


def test_fused_parts_off_the_scale_blocks_are_refused(tmp_path):
    """Qwen3 with 64-dim heads: in the fused Q/K/V, K holds rows 128..192 and V starts inside
    the 128-row scale block K ends in."""
    hf = tiny_hf("qwen3", head_dim=64, num_key_value_heads=1)
    fp8_dir, _ = write_fp8_pair(hf, "block", tmp_path)
    with pytest.raises(QuantizationError, match=r"k_proj\.weight: rows 128\.\.192 .* 128-row"):
        load_model(resolve_model(str(fp8_dir)), "cpu", torch.float32)


def test_a_tp_share_that_cuts_a_scale_block_is_refused(tmp_path):
    """Intermediate size 384 at TP 2: each rank would hold 192 rows of gate and up."""
    hf = tiny_hf("llama", intermediate_size=384, num_key_value_heads=2)
    fp8_dir, _ = write_fp8_pair(hf, "block", tmp_path)
    spec = resolve_model(str(fp8_dir))
    load_model(spec, "cpu", torch.float32)  # whole blocks at TP 1
    with pytest.raises(QuantizationError, match=r"gate_proj\.weight: this rank's 192 rows"):
        load_model(spec, "cpu", torch.float32, tp=TPGroup(0, 2))


def rewrite(folder, edit) -> None:
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


SCALE = "model.layers.1.self_attn.o_proj.weight_scale_inv"
WEIGHT = "model.layers.1.self_attn.o_proj.weight"
EXPERT = "model.layers.1.mlp.experts.2.up_proj"
BROKEN = [
    ("block", lambda t: t.pop(SCALE), "1 tensors missing, e.g. " + SCALE),
    ("block", lambda t: t.update({SCALE: torch.ones(3, 2)}),
     SCALE + r": checkpoint shape \(3, 2\), model expects \(2, 2\)"),
    ("block", lambda t: t.update({WEIGHT: t[WEIGHT].float()}),
     WEIGHT + r" is torch.float32, but .* says it is fp8"),
    ("ct-channel", lambda t: t.update({SCALE.replace("_inv", ""): torch.ones(7, 1)}),
     r"o_proj\.weight_scale: checkpoint shape \(7,\), model expects \(256,\)"),
]


@pytest.mark.parametrize("layout,edit,message", BROKEN, ids=[m for *_, m in BROKEN])
def test_broken_scales_and_weights_are_refused(layout, edit, message, tmp_path):
    fp8_dir, _ = write_fp8_pair(tiny_hf("llama"), layout, tmp_path)
    rewrite(fp8_dir, edit)
    with pytest.raises(WeightLoadError, match=message):
        load_model(resolve_model(str(fp8_dir)), "cpu", torch.float32)


def test_a_dequantized_tensor_needs_its_scale(tmp_path):
    """DeepSeek's routed experts are dequantized at load: without a scale, refused."""
    fp8_dir, _ = write_fp8_pair(tiny_hf("deepseek-v3"), "block", tmp_path)
    rewrite(fp8_dir, lambda t: t.pop(f"{EXPERT}.weight_scale_inv"))
    with pytest.raises(WeightLoadError, match=rf"{EXPERT}\.weight is fp8 but its scale is missing"):
        load_model(resolve_model(str(fp8_dir)), "cpu", torch.float32)


@pytest.mark.parametrize("drop_scales, message", [
    (False, r"weight_scale is a quantization scale but config.json has no quantization_config"),
    (True, r"is torch.float8_e4m3fn but config.json has no quantization_config"),
])
def test_fp8_tensors_without_a_quantization_config_are_refused(tmp_path, drop_scales, message):
    """Refused by whichever the file holds first: a scale, or an fp8 weight."""
    fp8_dir, _ = write_fp8_pair(tiny_hf("llama"), "ct-channel", tmp_path)
    set_quantization_config(fp8_dir, None)
    if drop_scales:
        rewrite(fp8_dir, lambda t: [t.pop(n) for n in list(t) if n.endswith("_scale")])
    with pytest.raises(WeightLoadError, match=message):
        load_model(resolve_model(str(fp8_dir)), "cpu", torch.float32, quantization="fp8")
