"""Build a model on the meta device, then give it weights: from a Hugging Face folder
(safetensors, one file or sharded with `model.safetensors.index.json`) or random (`dummy:`).

Nothing is materialized twice: parameters are allocated once on the target device and dtype,
then filled in place, tensor by tensor. Under tensor parallelism every rank reads (or draws)
each whole checkpoint tensor and keeps its share, cut as `tp_split_dim` says, so a dummy
model's shards at `--tp N` are exactly the slices of its weights at `--tp 1`.

With `quantization="fp8"` the projections are allocated in fp8 and each 16-bit tensor is
quantized as it arrives (`Fp8Linear.load_rows`), after its TP cut: the model never exists in
16 bits on the device, one tensor at a time does.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from runtime.model_config import ModelSpec
from runtime.worker.models.causal_lm import CausalLM
from runtime.worker.models.registry import model_class
from runtime.worker.quant.fp8_linear import Fp8Linear
from runtime.worker.tp import TPGroup

DUMMY_STD = 0.02
# tensors some checkpoints carry that we recompute or do not use
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def build_model(config, tp: TPGroup | None, quantization: str) -> CausalLM:
    """The model class for a transformers config's `model_type`, on the current device."""
    return model_class(config).from_hf(config, tp, quantization)


class WeightLoadError(RuntimeError):
    """A checkpoint does not fit the model built from its config."""


def load_model(spec: ModelSpec, device: torch.device | str, dtype: torch.dtype,
               seed: int = 0, tp: TPGroup | None = None,
               quantization: str = "none") -> CausalLM:
    """The model for `spec` (this rank's shard of it) on `device` in `dtype`, with its
    weights (projections in fp8 with `quantization="fp8"`), in eval mode."""
    with torch.device("meta"):
        model = build_model(spec.hf_config(), tp, quantization)
    model.to(dtype=dtype)  # still meta: no memory touched
    for module in model.modules():
        if isinstance(module, Fp8Linear):
            module.restore_storage()
    model.to_empty(device=device)  # one uninitialized allocation per parameter
    model.requires_grad_(False)
    if spec.path is None:
        init_dummy(model, seed)
    else:
        load_hf_folder(model, Path(spec.path))
    model.init_buffers()
    return model.eval()


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
    """Copies whole checkpoint tensors, by their transformers names, into this rank's
    (possibly fused) parameters, quantizing those of fp8 layers, and tracks which are still
    missing."""

    def __init__(self, model: CausalLM) -> None:
        self.tp = model.tp
        self.targets = model.checkpoint_targets()
        self.params = dict(model.named_parameters())
        self.fp8 = {f"{name}.weight": m for name, m in model.named_modules()
                    if isinstance(m, Fp8Linear)}  # weight parameter name -> its layer
        self.pending = set(self.targets)
        self.split_dim = model.tp_split_dim

    def put(self, name: str, tensor: torch.Tensor) -> None:
        param_name, start, rows = self.targets[name]
        dest = self.params[param_name].narrow(0, start, rows)
        dim = self.split_dim(name) if self.tp.size > 1 else None
        if dim is not None and tensor.shape[dim] % self.tp.size == 0:
            tensor = tensor.chunk(self.tp.size, dim)[self.tp.rank]  # this rank's share
        if tensor.shape != dest.shape:
            raise WeightLoadError(f"{name}: checkpoint shape {tuple(tensor.shape)}, "
                                  f"model expects {tuple(dest.shape)}")
        if param_name in self.fp8:
            self.fp8[param_name].load_rows(start, tensor)
        else:
            dest.copy_(tensor)  # converts dtype, moves to the device
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
        return [folder / name for name in sorted(set(weight_map.values()))]
    single = folder / "model.safetensors"
    if single.exists():
        return [single]
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        raise WeightLoadError(f"no .safetensors files in {folder}")
    return found


def load_hf_folder(model: CausalLM, folder: Path) -> None:
    """Copy every checkpoint tensor into its (possibly fused) parameter, converting dtype.

    Raises WeightLoadError for a missing tensor, an unknown one, or a shape mismatch. With
    tied embeddings an `lm_head.weight` in the file is ignored (the head reads embed_tokens).
    """
    loader = ShardLoader(model)
    for path in checkpoint_files(folder):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                if name.endswith(IGNORED_SUFFIXES) or (
                        name == "lm_head.weight" and model.arch.tie_word_embeddings):
                    continue
                if name not in loader.targets:
                    raise WeightLoadError(f"{path.name}: unexpected tensor {name}")
                loader.put(name, f.get_tensor(name))
    loader.check_complete(str(folder))
