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

from kernels.gemm.fp8_quant import FP8
from runtime.model_config import ModelSpec
from runtime.worker.models.causal_lm import CausalLM
from runtime.worker.models.registry import model_class
from runtime.worker.quant.block_fp8_linear import BlockFp8Linear
from runtime.worker.quant.dequantize import FP4_PACKED, dequantize_fp4, dequantize_fp8
from runtime.worker.quant.fp8_linear import (
    Fp8Weights,
    QuantizationError,
    check_fp8_support,
    tp_share,
)
from runtime.worker.quant.scheme import QuantScheme
from runtime.worker.safetensors_reader import (
    FP4_DTYPE,
    FP8_DTYPE,
    WeightLoadError,
    checkpoint_files,
    rank_part,
    read_slices,
)
from runtime.worker.tp import TPGroup

log = logging.getLogger("sluice.worker")

DUMMY_STD = 0.02
# tensors some checkpoints carry that we recompute or do not use
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
SCALE_LEAVES = (".weight_scale", ".weight_scale_inv", ".input_scale")  # fp8 checkpoints'


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


class ShardLoader:
    """Copies checkpoint tensors, by their transformers names, into this rank's (possibly
    fused) parameters, and tracks which are still missing. A tensor comes whole (cut here to
    this rank's share) or already cut (`read`, through `rank_part`).

    fp8 layers take 16-bit tensors quantized (`--quantization fp8`), or an fp8 checkpoint's
    weights raw with their scales (`<module>.weight_scale_inv` / `.weight_scale`, each cut for
    TP like its weight; static `<module>.input_scale`s are read and dropped). An fp8 (or
    packed fp4) weight bound for a 16-bit parameter is held until its scale is in, then
    dequantized. Block-scaled
    layers are checked at construction: fused parts and TP shares must be whole blocks.
    `model` is a `CausalLM`, or a module with its checkpoint interface (`tp`, `quant`,
    `checkpoint_targets`, `tp_split_dim`; for `load_hf_folder` also `checkpoint_name` and
    `arch.tie_word_embeddings`): a part of a checkpoint loaded on its own (`MtpHead`)."""

    def __init__(self, model: CausalLM) -> None:
        self.tp = model.tp
        self.quant: QuantScheme = model.quant
        self.targets = model.checkpoint_targets()
        self.params = dict(model.named_parameters())
        self.fp8 = {f"{name}.weight": m for name, m in model.named_modules()
                    if isinstance(m, Fp8Weights)}  # weight parameter name -> its layer
        self.pending = set(self.targets)
        self.split_dim = model.tp_split_dim
        self.scale_of: dict[str, str] = {}  # scale tensor name -> its weight's name
        self.held: dict[str, tuple[torch.Tensor | None, torch.Tensor | None]] = {}
        if self.quant.shipped:
            self._expect_scales()

    def _dim(self, name: str) -> int | None:
        return self.split_dim(name) if self.tp.size > 1 else None

    def _expect_scales(self) -> None:
        """Accept each weight's scale tensors, required where the layer is fp8."""
        for name, (param_name, start, rows) in list(self.targets.items()):
            if not name.endswith(".weight"):
                continue
            layer, base = self.fp8.get(param_name), name.removesuffix("weight")
            if isinstance(layer, BlockFp8Linear):
                try:
                    layer.check_part(start, rows, self._dim(name), self.tp)
                except QuantizationError as exc:
                    raise QuantizationError(f"{name}: {exc}") from None
            for scale in (*self.quant.scale_names, "input_scale"):
                self.scale_of[base + scale] = name
                self.targets[base + scale] = self.targets[name]
            if layer is not None:
                self.pending.add(base + self.quant.scale_names[0])  # any of the names does

    def _dest(self, name: str) -> torch.Tensor:
        param_name, start, rows = self.targets[name]
        return self.params[param_name].narrow(0, start, rows)

    def whole_shape(self, name: str) -> tuple[int, ...]:
        """The shape checkpoint weight `name` (not a scale) must have: its destination's,
        times the TP size along the dim it is split on."""
        shape = list(self._dest(name).shape)
        dim = self._dim(name)
        if dim is not None:
            shape[dim] *= self.tp.size
        return tuple(shape)

    def read(self, path: Path, name: str, sl) -> None:
        """Place checkpoint tensor `name` of file `path` from its safetensors slice `sl`: this
        rank's part read straight from the mapped file, except scales and fp8 weights bound
        for 16-bit parameters, which are read whole and cut once dequantized (`put`)."""
        if name not in self.targets:
            if name.endswith(SCALE_LEAVES) and not self.quant.shipped:
                raise WeightLoadError(f"{path}: {name} is a quantization scale but config.json "
                                      "has no quantization_config saying how to use it")
            raise WeightLoadError(f"{path}: unexpected tensor {name}")
        if name in self.scale_of:
            self.put(name, sl[...])
            return
        shape, expected = tuple(sl.get_shape()), self.whole_shape(name)
        packed = sl.get_dtype() == FP4_DTYPE and self.quant.fp4_weights
        if packed:  # two fp4 values a byte
            expected = (*expected[:-1], expected[-1] // 2)
        if shape != expected:
            raise WeightLoadError(f"{path}: tensor {name} has shape {shape}, "
                                  f"the model expects {expected}")
        if packed or (sl.get_dtype() == FP8_DTYPE and self.targets[name][0] not in self.fp8):
            self.put(name, sl[...])
        else:
            self.put(name, rank_part(sl, name, self.tp, self.split_dim), whole=False)

    def put(self, name: str, tensor: torch.Tensor, whole: bool = True) -> None:
        """Place checkpoint tensor `name` in its parameter: the whole tensor, or with
        `whole=False` this rank's part of it (never a scale, nor an fp8 weight bound for a
        16-bit parameter: those are cut after dequantizing)."""
        if tensor.dtype == FP8 and not self.quant.shipped:
            raise WeightLoadError(f"{name} is {tensor.dtype} but config.json has no "
                                  "quantization_config saying how to scale it")
        quantized = tensor.dtype == FP8 or (tensor.dtype == FP4_PACKED and self.quant.fp4_weights)
        if name in self.scale_of:
            self._put_scale(name, tensor)
            return
        param_name, start, _ = self.targets[name]
        layer = self.fp8.get(param_name)
        if quantized and layer is None:
            tensor = self._dequantized(name, weight=tensor)
            if tensor is None:
                return  # until its scale is in
        if whole:
            tensor = tp_share(tensor, self._dim(name), self.tp)  # this rank's share
        dest = self._dest(name)
        if tensor.shape != dest.shape:
            raise WeightLoadError(f"{name}: checkpoint shape {tuple(tensor.shape)}, "
                                  f"model expects {tuple(dest.shape)}")
        if layer is None:
            # converts dtype (on the device), moves there; a host tensor is staged by the copy
            dest.copy_(tensor, non_blocking=True)
        elif tensor.dtype == FP8:
            layer.load_fp8_rows(start, tensor)
        elif quantized:
            raise WeightLoadError(f"{name} is packed fp4, which only 16-bit parameters take")
        elif self.quant.shipped:
            raise WeightLoadError(f"{name} is {tensor.dtype}, but config.json's "
                                  "quantization_config says it is fp8")
        else:
            layer.load_rows(start, tensor)
        self.pending.discard(name)

    def _put_scale(self, name: str, scale: torch.Tensor) -> None:
        weight = self.scale_of[name]
        if name.endswith(".input_scale"):
            return  # activations are quantized per token as they arrive
        param_name, start, rows = self.targets[weight]
        self.pending.discard(weight.removesuffix("weight") + self.quant.scale_names[0])
        layer = self.fp8.get(param_name)
        if layer is None:  # the weight is dequantized for a 16-bit parameter
            tensor = self._dequantized(weight, scale=scale)
            if tensor is not None:
                self.put(weight, tensor)
            return
        try:
            layer.load_scale(start, rows, scale, self._dim(weight), self.tp)
        except ValueError as exc:
            raise WeightLoadError(f"{name}: {exc}") from None

    def _dequantized(self, name: str, weight: torch.Tensor | None = None,
                     scale: torch.Tensor | None = None) -> torch.Tensor | None:
        """fp8 weight `name` dequantized to float32 once both it and its scale are in (the
        first to arrive waits in `held`), else None."""
        held_w, held_s = self.held.pop(name, (None, None))
        weight = weight if weight is not None else held_w
        scale = scale if scale is not None else held_s
        if weight is None or scale is None:
            self.held[name] = (weight, scale)
            return None
        try:
            if weight.dtype == FP4_PACKED:
                return dequantize_fp4(weight, scale)
            return dequantize_fp8(weight, scale, self.quant.block)
        except ValueError as exc:
            raise WeightLoadError(f"{name}: {exc}") from None

    def check_complete(self, source: str) -> None:
        if self.held:
            name, (weight, _) = next(iter(self.held.items()))
            what = "is fp8 but its scale is missing" if weight is not None else (
                "has a scale but is not an fp8 tensor")
            raise WeightLoadError(f"{source}: {name} {what}")
        if self.pending:
            shown = ", ".join(sorted(self.pending)[:5])
            raise WeightLoadError(f"{source}: {len(self.pending)} tensors missing, e.g. {shown}")


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
