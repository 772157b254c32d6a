"""Under tensor parallelism each rank reads only its part of each checkpoint tensor
(`rank_part`), and ends up with the weights it would get by cutting the whole tensors."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from runtime.model_config import resolve_model
from runtime.worker.loader import ShardLoader, checkpoint_files, empty_model, load_model
from runtime.worker.safetensors_reader import rank_part
from runtime.worker.tp import TPGroup
from tests.worker.checkpoints import tiny_checkpoint
from tests.worker.test_deepseek import tiny_deepseek

SPLIT = {"rows": 0, "cols": 1, "bias": 0, "norm": None, "scalar": None}


@pytest.mark.parametrize("size", [1, 2, 4])
def test_rank_part_is_the_ranks_chunk(tmp_path, size):
    gen = torch.Generator().manual_seed(0)
    whole = {"rows": torch.randn(8, 12, generator=gen), "cols": torch.randn(6, 16, generator=gen),
             "bias": torch.randn(8, generator=gen), "norm": torch.randn(5, generator=gen),
             "scalar": torch.tensor(0.5)}
    path = tmp_path / "t.safetensors"
    save_file({k: v.to(torch.bfloat16) for k, v in whole.items()}, path)
    with safe_open(str(path), framework="pt") as f:
        for rank in range(size):
            for name, t in whole.items():
                part = rank_part(f.get_slice(name), name, TPGroup(rank, size), SPLIT.get)
                dim = SPLIT[name]
                expect = t if dim is None or size == 1 else t.chunk(size, dim)[rank]
                assert torch.equal(part, expect.to(torch.bfloat16)), (name, rank)


def whole_tensors_put(folder, tp: TPGroup, quantization: str) -> dict[str, torch.Tensor]:
    """This rank's parameters from whole checkpoint tensors, cut by `ShardLoader.put`."""
    config = resolve_model(str(folder)).hf_config()
    model = empty_model(config, "cpu", torch.float32, tp, quantization)
    loader = ShardLoader(model)
    for path in checkpoint_files(folder):
        for name, t in load_file(path).items():
            if name in loader.targets:
                loader.put(name, t)
    loader.check_complete(str(folder))
    model.init_buffers()  # as load_model does (DeepSeek permutes its rope rows here)
    return dict(model.named_parameters())


@pytest.mark.parametrize("family, quantization", [
    ("llama", "none"), ("qwen2-tied", "none"), ("llama", "fp8"), ("deepseek", "none"),
])
def test_sliced_reading_equals_cutting_whole_tensors(tmp_path, family, quantization):
    if family == "deepseek":
        tiny_deepseek("v2", tmp_path)
    else:
        tiny_checkpoint(family, tmp_path)
    spec = resolve_model(str(tmp_path))
    for rank in range(2):
        tp = TPGroup(rank, 2)
        shard = dict(load_model(spec, "cpu", torch.float32, tp=tp,
                                quantization=quantization).named_parameters())
        ref = whole_tensors_put(tmp_path, tp, quantization)
        assert shard.keys() == ref.keys()
        for name, t in shard.items():
            assert torch.equal(t.float(), ref[name].float()), (name, rank)
