"""Loader edge cases: sharded checkpoints, bad checkpoints, and full-size shapes on meta."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from runtime.model_config import resolve_model
from runtime.worker.loader import checkpoint_files, load_model
from runtime.worker.models.llama import LlamaArch, LlamaForCausalLM
from runtime.worker.safetensors_reader import WeightLoadError
from tests.worker.batching import assert_prefill_matches_hf
from tests.worker.checkpoints import tiny_checkpoint


def test_sharded_checkpoint(tmp_path):
    hf = tiny_checkpoint("qwen3", tmp_path)
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    files = checkpoint_files(tmp_path / "sharded")
    assert len(files) > 1 and (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    spec = resolve_model(str(tmp_path / "sharded"))
    model = load_model(spec, "cpu", torch.float32)
    single = load_model(resolve_model(str(tmp_path)), "cpu", torch.float32)
    for (name, a), (_, b) in zip(model.named_parameters(), single.named_parameters()):
        assert torch.equal(a, b), name
    assert_prefill_matches_hf(spec, hf, list(range(3, 14)))


@pytest.mark.parametrize("edit, message", [
    (lambda state: state.pop("model.norm.weight"), "missing"),
    (lambda state: state.update({"model.extra.weight": torch.zeros(2)}), "unexpected"),
    (lambda state: state.update({"model.norm.weight": torch.ones(3)}), "shape"),
])
def test_bad_checkpoint_is_refused(tmp_path, edit, message):
    tiny_checkpoint("llama", tmp_path)
    path = tmp_path / "model.safetensors"
    state = load_file(path)
    edit(state)
    save_file(state, path)
    with pytest.raises(WeightLoadError, match=message):
        load_model(resolve_model(str(tmp_path)), "cpu", torch.float32)


@pytest.mark.parametrize("preset, params, layers, tied", [
    ("llama-7b", 6_738_415_616, 32, False),
    ("llama3-8b", 8_030_261_248, 32, False),
    ("llama3-1b", 1_235_814_400, 16, True),  # Llama-3.2-1B's count: the head is the embedding
])
def test_full_size_presets_on_meta(preset, params, layers, tied):
    arch = LlamaArch.from_hf(resolve_model(f"dummy:{preset}").hf_config())
    assert arch.tie_word_embeddings == tied
    with torch.device("meta"):
        model = LlamaForCausalLM(arch)
    assert sum(p.numel() for p in model.parameters()) == params
    targets = model.checkpoint_targets()
    assert f"model.layers.{layers - 1}.self_attn.k_proj.weight" in targets
    assert ("lm_head.weight" in targets) == (not tied)
    assert len(targets) == 2 + layers * 9 + (not tied)  # embed, norm, 9 per layer, lm_head
