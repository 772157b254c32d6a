"""`LoraManager`: a worker's LoRA adapters, every one in host memory, up to `max_loras` of
them in device slots, and the projections of the model that apply them.

At start-up every adapter of `--lora-paths` is read and checked against the model
(`AdapterError` names the file at fault), then laid out the way a slot holds it: per fused
projection, this TP rank's share of A `[n * R, in]` and B `[out, R]` (R: the largest rank
of any adapter, smaller ranks padded with zeros), in the model's dtype (pinned on a GPU).
The projections any adapter targets become `LoraLinear`s. The scheduler decides what each
slot holds; `load_slots` copies an adapter in, so a slot never reallocates and a CUDA
graph keeps reading the same buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from runtime.config.server import ServerConfig
from runtime.worker.lora.adapter import LORA_MODULES, AdapterError, LoraAdapter, load_adapter
from runtime.worker.lora.layer import LoraLinear, LoraStep
from runtime.worker.models.llama import LlamaForCausalLM

HostSlot = dict[str, tuple[torch.Tensor, torch.Tensor]]  # projection path -> (A, B)


@dataclass(frozen=True)
class LoraOptions:
    """The adapters to serve (name -> PEFT folder), the device slots, the largest rank."""

    adapters: dict[str, str]
    max_loras: int = 8
    max_rank: int = 64

    @classmethod
    def from_config(cls, cfg: ServerConfig) -> LoraOptions | None:
        """The options of `--lora-paths`, `--max-loras` and `--max-lora-rank`; None
        without adapters."""
        if not cfg.lora_paths:
            return None
        return cls(cfg.lora_adapters, cfg.max_loras, cfg.max_lora_rank)


@dataclass(frozen=True)
class _Sub:
    """One checkpoint projection (q_proj, ...) inside a fused one of the model."""

    target: str  # the fused projection's path, e.g. model.layers.0.self_attn.qkv_proj
    index: int  # its place among the fused projection's parts
    start: int  # its first output row there (this rank's)
    rows: int  # its output rows (this rank's)
    split_dim: int  # how TP cuts it: 0 rows (column-parallel), 1 columns (row-parallel)


class LoraManager:
    """The adapters of one worker and the slots of its model (see the module docstring)."""

    def __init__(self, model: nn.Module, options: LoraOptions, device: torch.device,
                 dtype: torch.dtype) -> None:
        if not isinstance(model, LlamaForCausalLM):
            raise AdapterError(f"LoRA adapters need a Llama-family model, not "
                               f"{type(model).__name__}")
        self.tp = model.tp
        self.num_slots = options.max_loras
        self.step = LoraStep()
        subs = _lora_subs(model)
        adapters = [load_adapter(name, path, options.max_rank)
                    for name, path in options.adapters.items()]
        for adapter in adapters:
            _check_fits(adapter, subs, model, self.tp.size)
        self.rank = max(a.rank for a in adapters)
        targets = sorted({subs[m].target for a in adapters for m in a.weights})
        self.layers: dict[str, LoraLinear] = {}
        for path in targets:
            parent, _, leaf = path.rpartition(".")
            base = model.get_submodule(path)
            parts = sorted((s for s in subs.values() if s.target == path), key=lambda s: s.index)
            layer = LoraLinear(base, tuple(s.rows for s in parts), self.rank, self.num_slots,
                               self.step, self.tp, parts[0].split_dim == 1, dtype)
            setattr(model.get_submodule(parent), leaf, layer)
            self.layers[path] = layer
        pin = device.type == "cuda"
        self.host = {a.name: self._lay_out(a, subs, dtype, pin) for a in adapters}
        self.resident: list[str | None] = [None] * self.num_slots  # adapter of each slot

    def _lay_out(self, adapter: LoraAdapter, subs: dict[str, _Sub], dtype: torch.dtype,
                 pin: bool) -> HostSlot:
        """This rank's share of `adapter`, per fused projection, as a slot holds it."""
        out: HostSlot = {}
        r, rank = adapter.rank, self.rank
        for module, (a, b) in adapter.weights.items():
            sub = subs[module]
            layer = self.layers[sub.target]
            if sub.target not in out:
                out[sub.target] = (torch.zeros(layer.a.shape[1:], dtype=dtype),
                                   torch.zeros(layer.b.shape[1:], dtype=dtype))
            if self.tp.size > 1:  # this rank's columns of A or rows of B
                if sub.split_dim == 1:
                    a = a.chunk(self.tp.size, 1)[self.tp.rank]
                else:
                    b = b.chunk(self.tp.size, 0)[self.tp.rank]
            host_a, host_b = out[sub.target]
            host_a[sub.index * rank:sub.index * rank + r].copy_(a)  # [r, in]
            host_b[sub.start:sub.start + sub.rows, :r].copy_(b)  # [rows, r]
        if pin:
            out = {k: (a.pin_memory(), b.pin_memory()) for k, (a, b) in out.items()}
        return out

    def load_slots(self, loads: list[tuple[int, str]]) -> None:
        """Copy each adapter `name` of `(slot, name)` into its slot, in order (a copy on
        the compute stream: steps already launched read the slot before it changes)."""
        for slot, name in loads:
            if not 0 <= slot < self.num_slots or name not in self.host:
                raise ValueError(f"cannot load LoRA adapter {name!r} into slot {slot}")
            weights = self.host[name]
            for path, layer in self.layers.items():
                layer.load(slot, *weights.get(path, (None, None)))
            self.resident[slot] = name


def _lora_subs(model: LlamaForCausalLM) -> dict[str, _Sub]:
    """Every projection an adapter may target, by its checkpoint path (e.g.
    `model.layers.0.self_attn.q_proj`), and where it sits in the model's fused ones."""
    found: dict[str, list[tuple[int, int, str, int]]] = {}
    for hf_name, (param, start, rows) in model.checkpoint_targets().items():
        module, _, leaf = hf_name.rpartition(".")
        if leaf == "weight" and module.rsplit(".", 1)[-1] in LORA_MODULES:
            found.setdefault(param.rpartition(".")[0], []).append(
                (start, rows, module, model.tp_split_dim(hf_name)))
    subs = {}
    for target, parts in found.items():
        for index, (start, rows, module, split) in enumerate(sorted(parts)):
            subs[module] = _Sub(target, index, start, rows, split)
    return subs


def _check_fits(adapter: LoraAdapter, subs: dict[str, _Sub], model: nn.Module,
                tp_size: int) -> None:
    """Raise `AdapterError` unless every module of `adapter` is a projection of `model`
    with A `[r, in]` and B `[out, r]` of its (whole, unsharded) shape."""
    for module, (a, b) in adapter.weights.items():
        sub = subs.get(module)
        if sub is None:
            raise adapter.error(f"targets {module}, which the base model does not have")
        in_features = model.get_submodule(sub.target).weight.shape[1]
        out_features = sub.rows
        if sub.split_dim == 1:
            in_features *= tp_size
        else:
            out_features *= tp_size
        if a.shape[1] != in_features or b.shape[0] != out_features:
            raise adapter.error(
                f"{module}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not fit "
                f"the base model's projection [{out_features}, {in_features}]")

