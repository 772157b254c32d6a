"""Test helper: tiny fp8 checkpoints in the layouts releases ship, each beside a 16-bit
checkpoint of exactly its weights dequantized (the reference a correct loader must match).

A random transformers model is saved, then every projection weight (`*_proj*.weight`, and
Mixtral's experts' `w1` / `w2` / `w3`) is quantized here, independently of the runtime's
code: per 128x128 block (`weight_scale_inv`), per output channel or per tensor
(`weight_scale`), as the layout says.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FP8, FP8_MAX = torch.float8_e4m3fn, 448.0
BLOCK = [128, 128]
MIXTRAL_EXPERTS = ("w1", "w2", "w3")  # an expert's gate, down and up projections
_CT_WEIGHTS = dict(num_bits=8, type="float", symmetric=True, dynamic=False)


def compressed_tensors(strategy: str, activations: dict | None, ignore=()) -> dict:
    """A compressed-tensors `quantization_config` with one group of fp8 weights."""
    weights = dict(_CT_WEIGHTS, strategy=strategy)
    if strategy == "block":
        weights["block_structure"] = BLOCK
    group = dict(targets=["Linear"], weights=weights, input_activations=activations,
                 output_activations=None)
    return dict(quant_method="compressed-tensors", format="float-quantized",
                config_groups=dict(group_0=group), ignore=list(ignore), kv_cache_scheme=None,
                quantization_status="compressed")


DYNAMIC_TOKEN = dict(num_bits=8, type="float", symmetric=True, dynamic=True, strategy="token")
STATIC_TENSOR = dict(num_bits=8, type="float", symmetric=True, dynamic=False, strategy="tensor")
DYNAMIC_GROUP = dict(num_bits=8, type="float", symmetric=True, dynamic=True, strategy="group",
                     group_size=128)
# layout -> (quantization_config, weight scale granularity, scale name, static input scales)
LAYOUTS = {
    "block": (dict(quant_method="fp8", fmt="e4m3", activation_scheme="dynamic",
                   weight_block_size=BLOCK), "block", "weight_scale_inv", False),
    "fp8-tensor": (dict(quant_method="fp8", activation_scheme="static"), "tensor",
                   "weight_scale", True),
    "ct-channel": (compressed_tensors("channel", DYNAMIC_TOKEN), "channel", "weight_scale",
                   False),
    "ct-tensor": (compressed_tensors("tensor", STATIC_TENSOR), "tensor", "weight_scale", True),
    "ct-block": (compressed_tensors("block", DYNAMIC_GROUP), "block", "weight_scale", False),
}


def _scale(amax: torch.Tensor, e8m0: bool = False) -> torch.Tensor:
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return torch.exp2(torch.ceil(torch.log2(scale))) if e8m0 else scale  # up: no clipping


def quantize(w: torch.Tensor, granularity: str, e8m0: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """w `[out, in]` -> (fp8 q, scale) with w ~= q * scale: per 128x128 block (`[ceil(out/128),
    ceil(in/128)]`), per channel (`[out, 1]`) or per tensor (`[]`). `e8m0`: block scales
    rounded up to powers of two (as `scale_fmt: ue8m0` checkpoints store them), float32."""
    w = w.float()
    if granularity == "tensor":
        scale = _scale(w.abs().amax())
        return (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale
    if granularity == "channel":
        scale = _scale(w.abs().amax(dim=1, keepdim=True))  # [out, 1]
        return (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale
    out, k = w.shape
    bn, bk = BLOCK
    nb, kb = -(-out // bn), -(-k // bk)
    padded = torch.zeros(nb * bn, kb * bk)
    padded[:out, :k] = w
    scale = _scale(padded.view(nb, bn, kb, bk).abs().amax(dim=(1, 3)), e8m0)  # [nb, kb]
    full = scale[:, None, :, None].expand(nb, bn, kb, bk).reshape(nb * bn, kb * bk)[:out, :k]
    return (w / full).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, granularity: str) -> torch.Tensor:
    if granularity != "block":
        return q.float() * scale
    out, k = q.shape
    return q.float() * scale.repeat_interleave(BLOCK[0], 0).repeat_interleave(BLOCK[1], 1)[
        :out, :k]


def write_fp8_pair(hf_model, layout: str, root: Path, ignore=()) -> tuple[Path, Path]:
    """Save `hf_model`, quantize its projections as `layout` says (but the modules whose
    names end with one of `ignore`) into `root/fp8`, and the same weights dequantized into
    `root/bf16` (float32 in fact). Returns (fp8 folder, dequantized folder)."""
    config, granularity, scale_name, static = LAYOUTS[layout]
    src, fp8_dir, deq_dir = root / "src", root / "fp8", root / "bf16"
    hf_model.save_pretrained(src)
    state = load_file(str(src / "model.safetensors"))
    fp8_state, deq_state = {}, {}
    for name, w in state.items():
        module = name.removesuffix(".weight")
        leaf = module.rsplit(".", 1)[-1]
        if ("_proj" not in leaf and leaf not in MIXTRAL_EXPERTS) or module.endswith(tuple(ignore)):
            fp8_state[name] = deq_state[name] = w
            continue
        q, scale = quantize(w, granularity)
        if config["quant_method"] == "compressed-tensors" and granularity == "tensor":
            scale = scale.reshape(1)  # compressed-tensors stores one scale as [1]
        fp8_state[name], fp8_state[f"{module}.{scale_name}"] = q, scale
        if static:
            fp8_state[f"{module}.input_scale"] = torch.tensor(0.02)
        deq_state[name] = dequantize(q, scale, granularity)
    for folder, tensors in ((fp8_dir, fp8_state), (deq_dir, deq_state)):
        shutil.copytree(src, folder)
        save_file({k: v.contiguous() for k, v in tensors.items()},
                  str(folder / "model.safetensors"))
    set_quantization_config(fp8_dir, config)
    return fp8_dir, deq_dir


def set_quantization_config(folder: Path, quantization_config: dict | None) -> None:
    """Rewrite the `quantization_config` of the checkpoint in `folder` (None: remove it)."""
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = quantization_config
    if quantization_config is None:
        del cfg["quantization_config"]
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
