"""How a model's projection weights are stored: in 16 bits, in fp8 quantized at load from a
16-bit checkpoint (`--quantization fp8`), or in fp8 as the checkpoint ships them (a
`quantization_config` in its config.json).

Checkpoint formats read (e4m3 `weight` `[out, in]`, dequantized as w = q * scale):
- `quant_method: "fp8"` with `weight_block_size` [bn, bk] (the Qwen3-*-FP8 and DeepSeek-V3
  layout): float32 `weight_scale_inv` `[ceil(out / bn), ceil(in / bk)]`, one per block;
  with `scale_fmt: "ue8m0"` (DeepSeek-V4) the scales are powers of two stored as
  float8_e8m0fnu. `expert_dtype: "fp4"` (DeepSeek-V4's routed experts) ships those weights
  as packed e2m1 pairs (`runtime.worker.quant.dequantize.dequantize_fp4`).
- `quant_method: "fp8"` without a block size: one scale per tensor (`weight_scale` or
  `weight_scale_inv`), and `input_scale`s with `activation_scheme: "static"`.
- `quant_method: "compressed-tensors"`, `format` float-quantized or naive-quantized, one
  config group of 8-bit float weights: strategy `channel` (`weight_scale` `[out, 1]`),
  `tensor` (one scale) or `block` (`block_structure`, scales laid out as above).
Per-tensor scales are expanded to one per output channel (exact), so they run as the
per-channel layout. Static `input_scale`s are read and not used: activations are quantized as
they arrive, per token (per token and 128-column group with block scales), which is never
coarser than one calibrated scale. Modules named by `modules_to_not_convert` /
`ignored_layers` / `ignore` stay in 16 bits, and so do the parameters a model keeps in 16 bits
(routed experts among them): their fp8 or fp4 weights are dequantized at load.

A checkpoint's scheme applies whatever `--quantization` says: with `none` the fp8 weights are
served as shipped, and `fp8` asks for what they already are. Another `quant_method`, other
bit widths or types, or a KV-cache scheme are refused at start-up (`UnsupportedQuantization`,
naming the field).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

FLAGS = ("none", "fp8")  # --quantization
WEIGHTS = ("none", "fp8", "fp8_block")
EXPERT_DTYPES = ("fp8", "fp4")  # quantization_config.expert_dtype
QC = "quantization_config"
MIN_BLOCK_K = 16  # the block GEMM's K tile is one scale block: a power of two, at least this


class UnsupportedQuantization(NotImplementedError):
    """A checkpoint's `quantization_config` names a scheme the runtime cannot serve."""


@dataclass(frozen=True)
class QuantScheme:
    """The storage of the projections' weights. `weights`: "none" (16-bit), "fp8" (one scale
    per output channel) or "fp8_block" (one per `block` of (rows, cols)); `shipped`: the
    checkpoint holds the fp8 weights and their scales, under one of `scale_names` (else 16-bit
    weights are quantized at load); `ignored`: modules kept in 16 bits (names, dotted
    suffixes or prefixes, or `re:` patterns); `fp4_weights`: the checkpoint may hold packed
    fp4 weights (int8, two e2m1 values a byte, one e8m0 scale per 32 columns of a row), all
    bound for 16-bit parameters."""

    weights: str = "none"
    shipped: bool = False
    block: tuple[int, int] | None = None
    scale_names: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    fp4_weights: bool = False

    def __post_init__(self) -> None:
        if self.weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {WEIGHTS}, got {self.weights!r}")
        if (self.weights == "fp8_block") != (self.block is not None):
            raise ValueError("a block size goes with fp8_block weights, and only with them")

    @property
    def name(self) -> str:
        """The weights' dtype as /get_model_info reports it: "none" or "fp8"."""
        return "none" if self.weights == "none" else "fp8"

    @classmethod
    def of(cls, quantization: QuantScheme | str) -> QuantScheme:
        """A scheme as given, or the one a `--quantization` value asks of a 16-bit checkpoint."""
        if isinstance(quantization, QuantScheme):
            return quantization
        if quantization not in FLAGS:
            raise ValueError(f"quantization must be one of {FLAGS}, got {quantization!r}")
        return cls(weights=quantization)

    @classmethod
    def from_config(cls, config, quantization: str = "none") -> QuantScheme:
        """The scheme of a transformers config (its `quantization_config`, if any), else the
        one `--quantization` asks for. Raises UnsupportedQuantization naming the field."""
        qc = getattr(config, "quantization_config", None)
        if qc is None:
            return cls.of(quantization)
        qc = qc if isinstance(qc, dict) else qc.to_dict()
        method = str(qc.get("quant_method", "")).lower()
        if method == "fp8":
            return _fp8_method(qc)
        if method == "compressed-tensors":
            return _compressed_tensors(qc)
        raise UnsupportedQuantization(
            f"{QC}.quant_method {qc.get('quant_method')!r} is not supported; "
            "supported: 'fp8', 'compressed-tensors' (fp8 weights)")

    def quantized(self, modules: Sequence[str]) -> str:
        """The storage ("none", "fp8" or "fp8_block") of the layer that holds checkpoint
        `modules` (several when fused, e.g. q/k/v). Raises UnsupportedQuantization when some
        of them are ignored and others not: one layer has one storage."""
        if self.weights == "none":
            return "none"
        kept = [m for m in modules if any(_matches(p, m) for p in self.ignored)]
        if kept and len(kept) != len(modules):
            raise UnsupportedQuantization(
                f"{QC} keeps {kept} in 16 bits but not {sorted(set(modules) - set(kept))}, "
                "which are fused into one layer")
        return "none" if kept else self.weights


def _matches(pattern: str, module: str) -> bool:
    """Whether an ignore-list entry names `module`: `re:` + a regex matched from the start,
    else the name itself, a dotted suffix of it ("lm_head") or a dotted prefix."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], module) is not None
    return module == pattern or module.endswith("." + pattern) or module.startswith(pattern + ".")


def _block(value, field: str) -> tuple[int, int]:
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(isinstance(v, int) and v > 0 for v in value)):
        raise UnsupportedQuantization(f"{QC}.{field} {value!r}: expected [rows, cols]")
    bn, bk = value
    if bk < MIN_BLOCK_K or bk & (bk - 1):
        raise UnsupportedQuantization(
            f"{QC}.{field} {list(value)}: the column block must be a power of two >= "
            f"{MIN_BLOCK_K} (checkpoints use [128, 128])")
    return bn, bk


def _fp8_method(qc: dict) -> QuantScheme:
    fmt = qc.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise UnsupportedQuantization(f"{QC}.fmt {fmt!r}: only e4m3 fp8 weights are supported")
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise UnsupportedQuantization(f"{QC}.activation_scheme {scheme!r}: dynamic or static")
    if qc.get("scale_fmt", "float") not in ("float", "ue8m0"):
        raise UnsupportedQuantization(f"{QC}.scale_fmt {qc['scale_fmt']!r}: float or ue8m0")
    experts = qc.get("expert_dtype") or "fp8"
    if experts not in EXPERT_DTYPES:
        raise UnsupportedQuantization(
            f"{QC}.expert_dtype {experts!r}: supported {list(EXPERT_DTYPES)}")
    ignored = tuple(qc.get("modules_to_not_convert") or qc.get("ignored_layers") or ())
    fp4 = experts == "fp4"
    if qc.get("weight_block_size") is None:
        return QuantScheme("fp8", True, None, ("weight_scale", "weight_scale_inv"), ignored,
                           fp4)
    block = _block(qc["weight_block_size"], "weight_block_size")
    return QuantScheme("fp8_block", True, block, ("weight_scale_inv",), ignored, fp4)


def _fp8_args(args: dict, field: str) -> None:
    """Refuse anything but symmetric 8-bit floats in a compressed-tensors quantization."""
    bits, kind = args.get("num_bits"), args.get("type")
    if bits != 8 or kind != "float":
        raise UnsupportedQuantization(
            f"{QC}.{field}: num_bits {bits!r}, type {kind!r}; only num_bits 8, type 'float' "
            "(fp8 e4m3) is supported")
    if args.get("symmetric") is False:
        raise UnsupportedQuantization(f"{QC}.{field}.symmetric: only symmetric fp8 is supported")


def _compressed_tensors(qc: dict) -> QuantScheme:
    fmt = qc.get("format")
    if fmt not in ("float-quantized", "naive-quantized"):
        raise UnsupportedQuantization(
            f"{QC}.format {fmt!r}: supported float-quantized and naive-quantized (fp8)")
    if qc.get("kv_cache_scheme"):
        raise UnsupportedQuantization(
            f"{QC}.kv_cache_scheme: checkpoint KV-cache scales are not supported (the KV cache "
            "is quantized with --kv-dtype)")
    sparsity = qc.get("sparsity_config") or {}
    if sparsity.get("format", "dense") != "dense":
        raise UnsupportedQuantization(f"{QC}.sparsity_config {sparsity.get('format')!r}")
    groups = qc.get("config_groups") or {}
    if len(groups) != 1:
        raise UnsupportedQuantization(
            f"{QC}.config_groups: exactly one group is supported, got {len(groups)}")
    (name, group), = groups.items()
    field = f"config_groups.{name}"
    if group.get("targets") != ["Linear"]:
        raise UnsupportedQuantization(
            f"{QC}.{field}.targets {group.get('targets')!r}: only ['Linear'] is supported")
    if group.get("output_activations"):
        raise UnsupportedQuantization(f"{QC}.{field}.output_activations: not supported")
    weights = group.get("weights") or {}
    _fp8_args(weights, f"{field}.weights")
    if group.get("input_activations"):
        _fp8_args(group["input_activations"], f"{field}.input_activations")
    strategy = weights.get("strategy")
    ignored = tuple(qc.get("ignore") or ())
    if strategy in ("channel", "tensor"):
        return QuantScheme("fp8", True, None, ("weight_scale",), ignored)
    if strategy == "block":
        block = _block(weights.get("block_structure"), f"{field}.weights.block_structure")
        return QuantScheme("fp8_block", True, block, ("weight_scale",), ignored)
    raise UnsupportedQuantization(
        f"{QC}.{field}.weights.strategy {strategy!r}: supported channel, tensor, block")
