"""`ShardLoader`: puts checkpoint tensors into a built model's parameters, tensor by
tensor: each cut to this rank's share (`tp_split_dim`), fused parameters filled piece by
piece (`checkpoint_targets`), fp8 weights copied raw with their scales, fp8 / fp4 weights
the model keeps in 16 bits dequantized once their scales are in; `check_complete` names
what never came (`runtime.worker.loader` drives it over a folder or random weights)."""

from __future__ import annotations

from pathlib import Path

import torch

from kernels.gemm.fp8_quant import FP8
from runtime.worker.models.causal_lm import CausalLM
from runtime.worker.quant.block_fp8_linear import BlockFp8Linear
from runtime.worker.quant.dequantize import FP4_PACKED, dequantize_fp4, dequantize_fp8
from runtime.worker.quant.fp8_linear import Fp8Weights, QuantizationError, tp_share
from runtime.worker.quant.scheme import QuantScheme
from runtime.worker.safetensors_reader import FP4_DTYPE, FP8_DTYPE, WeightLoadError, rank_part

SCALE_LEAVES = (".weight_scale", ".weight_scale_inv", ".input_scale")  # fp8 checkpoints'


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
