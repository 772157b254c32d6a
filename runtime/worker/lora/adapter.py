"""`load_adapter`: one LoRA adapter read from a PEFT folder and checked before it is used.

A PEFT LoRA folder holds `adapter_config.json` (`r`, `lora_alpha`, `target_modules`,
`use_rslora`, ...) and `adapter_model.safetensors`, whose tensors are named like
`base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight` (A `[r, in]`) and
`....lora_B.weight` (B `[out, r]`). A projection W of the base model then computes
x W^T + scaling * (x A^T) B^T, scaling = lora_alpha / r (lora_alpha / sqrt(r) with
`use_rslora`). The scaling is folded into B here.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
LORA_MODULES = ATTENTION_MODULES + MLP_MODULES
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# PEFT's names; some savers keep the adapter's name ("lora_A.default.weight")
_TENSOR = re.compile(r"base_model\.model\.(model\.layers\.\d+\.(?:self_attn|mlp)\.(\w+))"
                     r"\.lora_([AB])(?:\.[\w-]+)?\.weight")
# options that change what the adapter computes, and the only value supported
_FIXED_OPTIONS = {"use_dora": False, "fan_in_fan_out": False, "bias": "none",
                  "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {}}


class AdapterError(ValueError):
    """A LoRA adapter cannot be served: unreadable, unsupported, or not fitting the model."""


@dataclass
class LoraAdapter:
    """One adapter in host memory: per target module (its path in the base model, e.g.
    `model.layers.0.self_attn.q_proj`), A `[r, in]` and B `[out, r]` float32, B already
    scaled."""

    name: str
    folder: Path
    rank: int
    scaling: float
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def error(self, message: str) -> AdapterError:
        """An `AdapterError` naming this adapter's weights file."""
        return AdapterError(f"LoRA adapter {self.name!r} ({self.folder / WEIGHTS_FILE}): "
                            f"{message}")


def load_adapter(name: str, folder: str | Path, max_rank: int) -> LoraAdapter:
    """Read the adapter `name` from a PEFT folder; raise `AdapterError` naming the file at
    fault for a missing, truncated or unsupported file, a rank above `max_rank`, or a
    target other than the q/k/v/o and gate/up/down projections."""
    folder = Path(folder)
    config = _read_config(name, folder / CONFIG_FILE, max_rank)
    rank = config["r"]
    alpha = config.get("lora_alpha", rank)
    scale = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
    adapter = LoraAdapter(name, folder, rank, scale)
    path = folder / WEIGHTS_FILE
    if not path.is_file():
        raise adapter.error("missing (only safetensors weights are supported)")
    parts: dict[str, dict[str, torch.Tensor]] = {}
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                match = _TENSOR.fullmatch(key)
                if match is None or match[2] not in LORA_MODULES:
                    raise adapter.error(f"unsupported tensor {key} (LoRA targets: "
                                        f"{', '.join(LORA_MODULES)})")
                parts.setdefault(match[1], {})[match[3]] = f.get_tensor(key).float()
    except AdapterError:
        raise
    except Exception as exc:  # a truncated or corrupt file: safetensors' own error
        raise adapter.error(f"cannot be read: {exc}") from None
    if not parts:
        raise adapter.error("holds no LoRA tensors")
    for module, ab in sorted(parts.items()):
        a, b = ab.get("A"), ab.get("B")
        if a is None or b is None:
            raise adapter.error(f"{module} has lora_{'B' if b is None else 'A'} but not "
                                f"lora_{'A' if b is None else 'B'}")
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != rank or b.shape[1] != rank:
            raise adapter.error(f"{module}: lora_A {tuple(a.shape)} and lora_B "
                                f"{tuple(b.shape)} are not [r, in] and [out, r] with r = {rank}")
        adapter.weights[module] = (a, b * scale)
    return adapter


def _read_config(name: str, path: Path, max_rank: int) -> dict:
    def fail(message: str) -> AdapterError:
        return AdapterError(f"LoRA adapter {name!r} ({path}): {message}")

    if not path.is_file():
        raise fail("missing: not a PEFT adapter folder")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise fail(f"cannot be read: {exc}") from None
    if not isinstance(config, dict):
        raise fail("is not a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise fail(f"peft_type {config['peft_type']!r} is not LORA")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise fail(f"r must be a positive int, got {rank!r}")
    if rank > max_rank:
        raise fail(f"rank {rank} is above --max-lora-rank {max_rank}")
    alpha = config.get("lora_alpha", rank)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise fail(f"lora_alpha must be a number, got {alpha!r}")
    for option, supported in _FIXED_OPTIONS.items():
        if (config.get(option) or supported) != supported:
            raise fail(f"{option}={config[option]!r} is not supported")
    targets = config.get("target_modules") or []
    if isinstance(targets, list):
        unsupported = sorted({str(t).rsplit(".", 1)[-1] for t in targets} - set(LORA_MODULES))
        if unsupported:
            raise fail(f"target_modules {unsupported} are not supported (LoRA targets: "
                       f"{', '.join(LORA_MODULES)})")
    return config
