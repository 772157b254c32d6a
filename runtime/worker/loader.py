"""Build a model on the meta device, then give it weights: from a Hugging Face folder
(safetensors, one file or sharded with `model.safetensors.index.json`) or random (`dummy:`).

Nothing is materialized twice: parameters are allocated once on the target device and dtype,
then filled in place, tensor by tensor.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from runtime.model_config import ModelSpec
from runtime.worker.models.llama import LlamaArch, LlamaForCausalLM

DUMMY_STD = 0.02
# tensors some checkpoints carry that we recompute or do not use
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class WeightLoadError(RuntimeError):
    """A checkpoint does not fit the model built from its config."""


def load_model(spec: ModelSpec, device: torch.device | str, dtype: torch.dtype,
               seed: int = 0) -> LlamaForCausalLM:
    """The model for `spec` on `device` in `dtype`, with its weights, in eval mode."""
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaArch.from_hf(spec.hf_config()))
    model.to(dtype=dtype)  # still meta: no memory touched
    model.to_empty(device=device)  # one uninitialized allocation per parameter
    model.requires_grad_(False)
    if spec.path is None:
        init_dummy(model, seed)
    else:
        load_hf_folder(model, Path(spec.path))
    model.init_buffers()
    return model.eval()


def init_dummy(model: LlamaForCausalLM, seed: int) -> None:
    """Random weights in place: matrices ~ N(0, 0.02), norms ones, biases zeros.

    Drawn on the parameters' own device from a generator seeded with `seed`, so a 7B model
    fills in well under a second on a GPU (the same seed gives the same weights on the same
    device type; CPU and CUDA generators differ).
    """
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif name.endswith(".bias"):
            param.zero_()
        else:
            param.normal_(0.0, DUMMY_STD, generator=gen)


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


def load_hf_folder(model: LlamaForCausalLM, folder: Path) -> None:
    """Copy every checkpoint tensor into its (possibly fused) parameter, converting dtype.

    Raises WeightLoadError for a missing tensor, an unknown one, or a shape mismatch. With
    tied embeddings an `lm_head.weight` in the file is ignored (the head reads embed_tokens).
    """
    targets = model.checkpoint_targets()
    params = dict(model.named_parameters())
    pending = set(targets)
    for path in checkpoint_files(folder):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                if name.endswith(IGNORED_SUFFIXES) or (
                        name == "lm_head.weight" and model.arch.tie_word_embeddings):
                    continue
                if name not in targets:
                    raise WeightLoadError(f"{path.name}: unexpected tensor {name}")
                param_name, start, rows = targets[name]
                dest = params[param_name].narrow(0, start, rows)
                tensor = f.get_tensor(name)
                if tensor.shape != dest.shape:
                    raise WeightLoadError(f"{name}: checkpoint shape {tuple(tensor.shape)}, "
                                          f"model expects {tuple(dest.shape)}")
                dest.copy_(tensor)  # converts dtype, moves to the device
                pending.discard(name)
    if pending:
        shown = ", ".join(sorted(pending)[:5])
        raise WeightLoadError(f"{folder}: {len(pending)} tensors missing, e.g. {shown}")
