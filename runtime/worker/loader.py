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
16 bits on the device, one tensor at a time does. An fp8 checkpoint (`QuantScheme` from its
config.json) is copied as it is: fp8 weights raw, their scales into the fp8 layers' scale
buffers, each cut for TP like its weight; fp8 weights the model keeps in 16 bits are
dequantized once their scales are in (`ShardLoader`), packed fp4 ones too (a scheme with
`fp4_weights`). Scales (tiny) and those dequantized weights (a few per layer at most) are read
whole and cut after. A family whose releases name tensors otherwise reads them through its
`checkpoint_name`; the tensors it does not use are skipped, with one log line.
"""

from __future__ import annotations

import logging
from contextlib import closing
from pathlib import Path

import torch
from torch import nn

from runtime.model_config import ModelSpec
from runtime.worker.models.causal_lm import CausalLM
from runtime.worker.models.registry import model_class
from runtime.worker.quant.fp8_linear import (
    Fp8Weights,
    check_fp8_support,
)
from runtime.worker.safetensors_reader import (
    checkpoint_files,
    read_slices,
)
from runtime.worker.shard_loader import ShardLoader
from runtime.worker.tp import TPGroup

log = logging.getLogger("sluice.worker")

DUMMY_STD = 0.02
# tensors some checkpoints carry that we recompute or do not use
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def build_model(config, tp: TPGroup | None, quantization: str) -> CausalLM:
    """The model class for a transformers config's `model_type`, on the current device, its
    weights stored as the config's `quantization_config` says, else as `quantization` asks."""
    return model_class(config).from_hf(config, tp, quantization)


def load_model(spec: ModelSpec, device: torch.device | str, dtype: torch.dtype,
               seed: int = 0, tp: TPGroup | None = None,
               quantization: str = "none") -> CausalLM:
    """The model for `spec` (this rank's shard of it) on `device` in `dtype`, with its
    weights (projections in fp8 with `quantization="fp8"` or from an fp8 checkpoint), in
    eval mode."""
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
    (fp8 weights in fp8 with float32 scales, the rest in `dtype`) and not initialized.
    Raises QuantizationError for an fp8 checkpoint on a device without fp8 matmul."""
    with torch.device("meta"):
        model = build_model(config, tp, quantization)
    if model.quant.shipped:
        check_fp8_support(torch.device(device), what="an fp8 checkpoint",
                          instead="serve a 16-bit checkpoint of the model")
    return materialize(model, device, dtype)


def materialize(module: nn.Module, device: torch.device | str,
                dtype: torch.dtype) -> nn.Module:
    """`module`, built on the meta device, with its parameters allocated on `device` (fp8
    weights in fp8 with float32 scales, the rest in `dtype`) and not initialized."""
    module.to(dtype=dtype)  # still meta: no memory touched
    for m in module.modules():
        if isinstance(m, Fp8Weights):
            m.restore_storage()
    module.to_empty(device=device)  # one uninitialized allocation per parameter
    return module.requires_grad_(False)


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


def load_hf_folder(model: CausalLM, folder: Path) -> None:
    """Copy every checkpoint tensor (this rank's part of it) into its (possibly fused)
    parameter, converting dtype, reading each file once in file order.

    Raises WeightLoadError, naming the file and tensor, for a truncated or unreadable file,
    a missing tensor, an unknown one, or a shape mismatch. With tied embeddings an
    `lm_head.weight` in the file is ignored (the head reads embed_tokens). Tensors are read
    under their `model.checkpoint_name`; those it maps to None are skipped and counted in one
    log line.
    """
    loader = ShardLoader(model)
    unused: list[str] = []

    def wanted(name: str) -> bool:
        if model.checkpoint_name(name) is None:
            unused.append(name)
            return False
        return not (name.endswith(IGNORED_SUFFIXES) or (
            name == "lm_head.weight" and model.arch.tie_word_embeddings))

    for path in checkpoint_files(folder):
        with closing(read_slices(path, wanted)) as slices:
            for name, sl in slices:
                loader.read(path, model.checkpoint_name(name), sl)
    loader.check_complete(str(folder))
    if unused:
        log.info("%s: skipped %d checkpoint tensors the model does not use (%s, ...)",
                 folder, len(unused), unused[0])
