"""Build a model on the meta device, then give it weights: from a Hugging Face folder
(safetensors, one file or sharded with `model.safetensors.index.json`) or random (`dummy:`).

Nothing is materialized twice: parameters are allocated once on the target device and dtype,
then filled in place, tensor by tensor. Checkpoint files are memory-mapped and each tensor is
copied from the mapped pages straight into its parameter (`safetensors_reader`): no copy of
the model is ever made in host memory, and under tensor parallelism each rank reads only its
share of each tensor, cut as `tp_split_dim` says. Random weights are drawn whole and cut the
same way, so a dummy model's shards at `--tp N` are exactly the slices of its weights at
`--tp 1`.

With `quantization="fp8"` the projections are allocated in fp8 and each 16-bit tensor is
quantized as it arrives (`Fp8Linear.load_rows`), after its TP cut: the model never exists in
16 bits on the device, one tensor at a time does.
"""

from __future__ import annotations

import json
from contextlib import closing
from pathlib import Path

import torch

from runtime.model_config import ModelSpec
from runtime.worker.models.deepseek import DeepseekForCausalLM
from runtime.worker.models.deepseek import tp_split_dim as deepseek_split_dim
from runtime.worker.models.deepseek_arch import SUPPORTED_TYPES as DEEPSEEK_TYPES
from runtime.worker.models.deepseek_arch import DeepseekArch
from runtime.worker.models.llama import LlamaArch, LlamaForCausalLM, tp_split_dim
from runtime.worker.quant.fp8_linear import Fp8Linear
from runtime.worker.safetensors_reader import WeightLoadError, rank_part, read_slices
from runtime.worker.tp import TPGroup

DUMMY_STD = 0.02
# tensors some checkpoints carry that we recompute or do not use
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
CausalLM = LlamaForCausalLM | DeepseekForCausalLM


def build_model(config, tp: TPGroup | None, quantization: str) -> CausalLM:
    """The model class for a transformers config's `model_type`, on the current device."""
    if getattr(config, "model_type", "llama") in DEEPSEEK_TYPES:
        return DeepseekForCausalLM(DeepseekArch.from_hf(config), tp, quantization)
    return LlamaForCausalLM(LlamaArch.from_hf(config), tp, quantization)


def load_model(spec: ModelSpec, device: torch.device | str, dtype: torch.dtype,
               seed: int = 0, tp: TPGroup | None = None,
               quantization: str = "none") -> CausalLM:
    """The model for `spec` (this rank's shard of it) on `device` in `dtype`, with its
    weights (projections in fp8 with `quantization="fp8"`), in eval mode."""
    model = empty_model(spec.hf_config(), device, dtype, tp, quantization)
    if spec.path is None:
        init_dummy(model, seed)
    else:
        load_hf_folder(model, Path(spec.path))
    model.init_buffers()
    return model.eval()


def empty_model(config, device: torch.device | str, dtype: torch.dtype,
                tp: TPGroup | None = None, quantization: str = "none") -> CausalLM:
    """The model for a transformers `config` with its parameters allocated on `device`
    (fp8 projections in fp8, the rest in `dtype`) and not initialized."""
    with torch.device("meta"):
        model = build_model(config, tp, quantization)
    model.to(dtype=dtype)  # still meta: no memory touched
    for module in model.modules():
        if isinstance(module, Fp8Linear):
            module.restore_storage()
    model.to_empty(device=device)  # one uninitialized allocation per parameter
    return model.requires_grad_(False)


def init_dummy(model: CausalLM, seed: int) -> None:
    """Random weights: matrices ~ N(0, 0.02), norms ones, biases zeros.

    Each whole (unsharded) parameter is drawn in turn on the model's device from a generator
    seeded with `seed`, so a 7B model fills in well under a second on a GPU (the same seed
    gives the same weights on the same device type; CPU and CUDA generators differ), then
    goes through the checkpoint path, which keeps this rank's share.
    """
    first = model.model.embed_tokens.weight  # the model's dtype, whatever its projections'
    gen = torch.Generator(device=first.device).manual_seed(seed)
    with torch.device("meta"):
        whole = type(model)(model.arch)  # the --tp 1 shapes
    pieces: dict[str, list[tuple[str, int, int]]] = {}
    for hf_name, (param_name, start, rows) in whole.checkpoint_targets().items():
        pieces.setdefault(param_name, []).append((hf_name, start, rows))
    loader = ShardLoader(model)
    for name, param in whole.named_parameters():
        t = torch.empty(param.shape, dtype=first.dtype, device=first.device)
        if name.endswith("norm.weight"):
            t.fill_(1.0)
        elif name.endswith(".bias"):
            t.zero_()
        else:
            t.normal_(0.0, DUMMY_STD, generator=gen)
        for hf_name, start, rows in pieces[name]:
            loader.put(hf_name, t.narrow(0, start, rows))
    loader.check_complete("dummy weights")


class ShardLoader:
    """Copies checkpoint tensors, by their transformers names, into this rank's (possibly
    fused) parameters, quantizing those of fp8 layers, and tracks which are still missing.
    A tensor comes whole (cut here to this rank's share) or already cut (`rank_part`)."""

    def __init__(self, model: CausalLM) -> None:
        self.tp = model.tp
        self.targets = model.checkpoint_targets()
        self.params = dict(model.named_parameters())
        self.fp8 = {f"{name}.weight": m for name, m in model.named_modules()
                    if isinstance(m, Fp8Linear)}  # weight parameter name -> its layer
        self.pending = set(self.targets)
        self.split_dim = (deepseek_split_dim if isinstance(model, DeepseekForCausalLM)
                          else tp_split_dim)

    def _dest(self, name: str) -> torch.Tensor:
        param_name, start, rows = self.targets[name]
        return self.params[param_name].narrow(0, start, rows)

    def whole_shape(self, name: str) -> tuple[int, ...]:
        """The shape checkpoint tensor `name` must have: its destination's, times the TP
        size along the dim it is split on."""
        shape = list(self._dest(name).shape)
        dim = self.split_dim(name) if self.tp.size > 1 else None
        if dim is not None:
            shape[dim] *= self.tp.size
        return tuple(shape)

    def put(self, name: str, tensor: torch.Tensor) -> None:
        """Place checkpoint tensor `name`, whole or this rank's part, in its parameter."""
        param_name, start, _ = self.targets[name]
        dest = self._dest(name)
        dim = self.split_dim(name) if self.tp.size > 1 else None
        if dim is not None and tensor.dim() > dim and tensor.shape[dim] != dest.shape[dim]:
            tensor = tensor.chunk(self.tp.size, dim)[self.tp.rank]  # whole: this rank's share
        if tensor.shape != dest.shape:
            raise WeightLoadError(f"{name}: checkpoint shape {tuple(tensor.shape)}, "
                                  f"model expects {tuple(dest.shape)}")
        if param_name in self.fp8:
            self.fp8[param_name].load_rows(start, tensor)
        else:
            # converts dtype, moves to the device; a host tensor is staged by the copy itself
            dest.copy_(tensor, non_blocking=True)
        self.pending.discard(name)

    def check_complete(self, source: str) -> None:
        if self.pending:
            shown = ", ".join(sorted(self.pending)[:5])
            raise WeightLoadError(f"{source}: {len(self.pending)} tensors missing, e.g. {shown}")


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of a HF folder, sharded (via the index) or single."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise WeightLoadError(f"{index}: lists {len(missing)} missing file(s): "
                                  f"{', '.join(missing[:3])}")
        return files
    single = folder / "model.safetensors"
    if single.exists():
        return [single]
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        raise WeightLoadError(f"no .safetensors files in {folder}")
    return found


def load_hf_folder(model: CausalLM, folder: Path) -> None:
    """Copy every checkpoint tensor (this rank's part of it) into its (possibly fused)
    parameter, converting dtype, reading each file once in file order.

    Raises WeightLoadError, naming the file and tensor, for a truncated or unreadable file,
    a missing tensor, an unknown one, or a shape mismatch. With tied embeddings an
    `lm_head.weight` in the file is ignored (the head reads embed_tokens).
    """
    loader = ShardLoader(model)

    def wanted(name: str) -> bool:
        return not (name.endswith(IGNORED_SUFFIXES) or (
            name == "lm_head.weight" and model.arch.tie_word_embeddings))

    for path in checkpoint_files(folder):
        with closing(read_slices(path, wanted)) as slices:
            for name, sl in slices:
                if name not in loader.targets:
                    raise WeightLoadError(f"{path}: unexpected tensor {name}")
                shape, expected = tuple(sl.get_shape()), loader.whole_shape(name)
                if shape != expected:
                    raise WeightLoadError(f"{path}: tensor {name} has shape {shape}, "
                                          f"the model expects {expected}")
                loader.put(name, rank_part(sl, name, loader.tp, loader.split_dim))
    loader.check_complete(str(folder))
