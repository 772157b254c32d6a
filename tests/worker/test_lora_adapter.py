"""Bad LoRA adapters fail at start-up with an `AdapterError` naming the file at fault:
a rank above --max-lora-rank, targets or shapes that do not fit the base model, a
truncated weights file, options that change what LoRA computes."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from runtime.model_config import resolve_model
from runtime.worker.lora.adapter import AdapterError, load_adapter
from runtime.worker.lora.manager import LoraOptions
from runtime.worker.model_runner import ModelRunner
from tests.worker.checkpoints import tiny_checkpoint
from tests.worker.lora_adapters import ALL_TARGETS, tiny_adapter


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("base")
    tiny_checkpoint("llama", folder)
    return folder


@pytest.fixture(scope="module")
def good(base, tmp_path_factory):
    folder = tmp_path_factory.mktemp("good")
    tiny_adapter(base, folder, seed=1, r=8, lora_alpha=16, target_modules=ALL_TARGETS)
    return folder


def start(base, adapters: dict, max_rank: int = 64) -> ModelRunner:
    return ModelRunner(resolve_model(str(base)), "cpu", torch.float32, kv_slots=64, max_rows=2,
                       lora=LoraOptions({k: str(v) for k, v in adapters.items()}, 2, max_rank))


def copy_with_config(src, dst, **changes):
    shutil.copytree(src, dst)
    config = json.loads((dst / "adapter_config.json").read_text())
    (dst / "adapter_config.json").write_text(json.dumps({**config, **changes}))
    return dst


def test_a_good_adapter_loads_with_its_scaling(good):
    adapter = load_adapter("good", good, max_rank=8)
    assert adapter.rank == 8 and adapter.scaling == 2.0
    assert len(adapter.weights) == 2 * 7  # 2 layers x 7 projections


def test_rank_above_max_lora_rank(base, good):
    with pytest.raises(AdapterError, match=re.escape(f"{good}/adapter_config.json") +
                       r".*rank 8 is above --max-lora-rank 4"):
        start(base, {"good": good}, max_rank=4)


def test_adapter_of_another_shape(base, tmp_path):
    """An adapter of a model with wider heads (qwen3: head_dim 32) does not fit."""
    other = tmp_path / "other"
    tiny_checkpoint("qwen3", other)
    tiny_adapter(other, tmp_path / "a", seed=2, r=4, target_modules=["q_proj"])
    with pytest.raises(AdapterError, match=re.escape(f"{tmp_path / 'a'}/adapter_model."
                                                     "safetensors") + r".*q_proj.*do not fit"):
        start(base, {"a": tmp_path / "a"})


def test_adapter_of_a_deeper_model(base, tmp_path):
    deeper = tmp_path / "deeper"
    tiny_checkpoint("llama", deeper)
    config = json.loads((deeper / "config.json").read_text())
    (deeper / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    tiny_adapter(deeper, tmp_path / "a", seed=3, r=4, target_modules=["v_proj"])
    with pytest.raises(AdapterError, match=r"targets model\.layers\.2\.self_attn\.v_proj, "
                                           "which the base model does not have"):
        start(base, {"a": tmp_path / "a"})


def test_truncated_weights_file(base, good, tmp_path):
    bad = copy_with_config(good, tmp_path / "bad")
    weights = bad / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(AdapterError, match=re.escape(str(weights)) + r"\): cannot be read"):
        start(base, {"good": good, "bad": bad})


@pytest.mark.parametrize("change, message", [
    (dict(target_modules=["q_proj", "embed_tokens"]), r"target_modules \['embed_tokens'\]"),
    (dict(use_dora=True), "use_dora=True is not supported"),
    (dict(modules_to_save=["lm_head"]), "modules_to_save"),
    (dict(r=0), "r must be a positive int"),
    (dict(peft_type="IA3"), "peft_type 'IA3' is not LORA"),
])
def test_unsupported_config(base, good, tmp_path, change, message):
    bad = copy_with_config(good, tmp_path / "bad", **change)
    with pytest.raises(AdapterError, match=re.escape(f"{bad}/adapter_config.json") + ".*"
                       + message):
        start(base, {"bad": bad})


def test_missing_folder(base, tmp_path):
    with pytest.raises(AdapterError, match="adapter_config.json\\): missing"):
        start(base, {"gone": tmp_path / "gone"})
