"""Under tensor parallelism each rank reads only its part of each checkpoint tensor
(`rank_part`), and ends up with the weights it would get by cutting the whole tensors: 16-bit
and fp8 checkpoints alike (an fp8 checkpoint's scales are read whole and cut by its layers)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from runtime.model_config import resolve_model
from runtime.worker.loader import checkpoint_files, empty_model, load_model
from runtime.worker.safetensors_reader import rank_part
from runtime.worker.shard_loader import ShardLoader
from runtime.worker.tp import TPGroup
from tests.worker.checkpoints import tiny_checkpoint
from tests.worker.fp8_checkpoints import write_fp8_pair
from tests.worker.test_deepseek import tiny_deepseek
from tests.worker.test_fp8_checkpoints import tiny_hf

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


def whole_tensors_put(folder, tp: TPGroup, quantization: str = "none"
                      ) -> dict[str, torch.Tensor]:
    """This rank's parameters and buffers (fp8 scales) from whole checkpoint tensors, cut by
    `ShardLoader.put`."""
    config = resolve_model(str(folder)).hf_config()
    model = empty_model(config, "cpu", torch.float32, tp, quantization)
    loader = ShardLoader(model)
    for path in checkpoint_files(folder):
        for name, t in load_file(path).items():
            if name in loader.targets:
                loader.put(name, t)
    loader.check_complete(str(folder))
    model.init_buffers()  # as load_model does (DeepSeek permutes its rope rows here)
    return model.state_dict()


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
        shard = load_model(spec, "cpu", torch.float32, tp=tp,
                           quantization=quantization).state_dict()
        ref = whole_tensors_put(tmp_path, tp, quantization)
        assert shard.keys() == ref.keys()
        for name, t in shard.items():
            assert torch.equal(t.float(), ref[name].float()), (name, rank)


def split_weights_from_scales(folder) -> None:
    """Reshard `folder`'s checkpoint: every weight in the first file, every scale in the
    second, so each fp8 weight arrives a file before its scale (the dequantized ones are held
    across the files)."""
    state = load_file(folder / "model.safetensors")
    files = {"model-00001-of-00002.safetensors": {}, "model-00002-of-00002.safetensors": {}}
    for name, t in state.items():
        files[sorted(files)[name.endswith(("_scale", "_scale_inv"))]][name] = t
    for file, part in files.items():
        save_file(part, folder / file)
    (folder / "model.safetensors").unlink()
    index = {"weight_map": {n: file for file, part in files.items() for n in part}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("model, layout", [
    ("llama", "block"),  # fused Q/K/V and gate/up, whole 128x128 scale blocks per rank
    ("deepseek-v2", "block"),  # routed experts and kv_b_proj dequantized, then cut
    ("qwen2", "ct-channel"),  # per-channel [out, 1] scales, cut with column-parallel rows
    ("llama", "fp8-tensor"),  # per-tensor scales and static input scales, never cut
])
def test_fp8_checkpoint_sliced_reading_equals_cutting_whole_tensors(tmp_path, model, layout):
    """An fp8 checkpoint at TP 2: each rank reads its part of every fp8 weight and the whole
    scales; the weights, the scale buffers and the dequantized 16-bit parameters equal those
    from whole tensors cut by `ShardLoader.put`."""
    fp8_dir, _ = write_fp8_pair(tiny_hf(model, num_key_value_heads=2), layout, tmp_path)
    split_weights_from_scales(fp8_dir)
    spec = resolve_model(str(fp8_dir))
    for rank in range(2):
        tp = TPGroup(rank, 2)
        shard = load_model(spec, "cpu", torch.float32, tp=tp).state_dict()
        ref = whole_tensors_put(fp8_dir, tp)
        assert shard.keys() == ref.keys()
        assert any(t.dtype == torch.float8_e4m3fn for t in shard.values())
        for name, t in shard.items():
            assert t.dtype == ref[name].dtype and torch.equal(t.float(), ref[name].float()), (
                name, rank)
