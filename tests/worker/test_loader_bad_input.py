"""A checkpoint that cannot be loaded is refused with one line naming the file, the tensor
and what is wrong: truncated files, a shard the index lists but the folder lacks, a tensor
of the wrong shape, a tensor the model has no place for."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from runtime.model_config import resolve_model
from runtime.worker.loader import load_model
from runtime.worker.safetensors_reader import WeightLoadError, tensor_spans
from runtime.worker.tp import TPGroup
from tests.worker.checkpoints import tiny_checkpoint


def refusal(folder) -> str:
    """The message `load_model` refuses `folder` with (one line)."""
    with pytest.raises(WeightLoadError) as info:
        load_model(resolve_model(str(folder)), "cpu", torch.float32)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.fixture
def folder(tmp_path):
    tiny_checkpoint("llama", tmp_path)
    return tmp_path


def test_truncated_tensor_data_names_the_last_tensor_cut(folder):
    path = folder / "model.safetensors"
    spans = tensor_spans(path)
    last = list(spans)[-1]  # in file order
    os.truncate(path, spans[last][1] - 1)
    message = refusal(folder)
    assert str(path) in message and "truncated" in message and last in message


def test_truncated_header(folder):
    path = folder / "model.safetensors"
    os.truncate(path, 100)  # the JSON header of a 2-layer model is longer than this
    message = refusal(folder)
    assert str(path) in message and "truncated: its header needs" in message


def test_a_file_too_short_for_a_header(folder):
    os.truncate(folder / "model.safetensors", 3)
    assert "too short for a safetensors header" in refusal(folder)


def test_a_shard_the_index_lists_is_missing(folder):
    state = load_file(folder / "model.safetensors")
    names = sorted(state)
    halves = {"model-00001-of-00002.safetensors": names[:10],
              "model-00002-of-00002.safetensors": names[10:]}
    for file, part in halves.items():
        save_file({n: state[n] for n in part}, folder / file)
    (folder / "model.safetensors").unlink()
    index = {"weight_map": {n: file for file, part in halves.items() for n in part}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "model-00002-of-00002.safetensors").unlink()
    message = refusal(folder)
    assert "model.safetensors.index.json" in message
    assert "missing" in message and "model-00002-of-00002.safetensors" in message


@pytest.mark.parametrize("name, shape", [
    ("model.norm.weight", (3,)),  # replicated
    ("model.layers.0.self_attn.k_proj.weight", (60, 64)),  # column-parallel
    ("model.layers.1.mlp.down_proj.weight", (64, 129)),  # row-parallel
    ("model.layers.0.self_attn.q_proj.weight", (64,)),  # rank
])
@pytest.mark.parametrize("tp", [1, 2])
def test_a_tensor_of_the_wrong_shape(folder, name, shape, tp):
    path = folder / "model.safetensors"
    state = load_file(path)
    expected = tuple(state[name].shape)
    state[name] = torch.zeros(shape)
    save_file(state, path)
    spec = resolve_model(str(folder))
    for rank in range(tp):
        with pytest.raises(WeightLoadError) as info:
            load_model(spec, "cpu", torch.float32, tp=TPGroup(rank, tp))
        assert str(info.value) == (f"{path}: tensor {name} has shape {shape}, "
                                   f"the model expects {expected}")


def test_an_unexpected_tensor(folder):
    path = folder / "model.safetensors"
    state = load_file(path)
    state["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(2, 2)
    save_file(state, path)
    assert refusal(folder) == f"{path}: unexpected tensor model.layers.0.mlp.extra_proj.weight"


def test_not_a_safetensors_file(folder):
    (folder / "model.safetensors").write_bytes((2**40).to_bytes(8, "little") + b"{}")
    assert "not a safetensors file" in refusal(folder)


def test_a_garbled_header(folder):
    body = b'{"a": {"dtype": "F32", "shape": [1]}}'  # no data_offsets
    (folder / "model.safetensors").write_bytes(len(body).to_bytes(8, "little") + body)
    assert "unreadable safetensors header" in refusal(folder)
