"""Test helper: a tiny DeepSeek-V4 checkpoint rewritten in the layout DeepSeek releases V4
in, beside a transformers-layout checkpoint of exactly its weights (dequantized where the
release quantizes them): the reference a correct loader of the release must match.

The released layout: no `model.` prefix, `embed` / `norm` / `hc_head_fn` at the top,
`attn.kv_norm`, an MTP layer under `mtp.0.*`, shards listed by `model.safetensors.index.json`.
Quantized (`quant="fp8"`), the projections the release ships in fp8 are float8_e4m3fn with
one float8_e8m0fnu scale per 128x128 block under `<module>.scale`, and the config carries the
release's `quantization_config`; with `quant="fp4"` the routed experts are packed fp4 (two
e2m1 values a byte, low nibble first, one e8m0 scale per 32 columns of a row) and the config
says `expert_dtype: "fp4"` at its top level, as the release does. Everything here is written
independently of the runtime's code.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.worker.fp8_checkpoints import dequantize, quantize

TO_RELEASED = {
    "model.embed_tokens.weight": "embed.weight",
    "model.norm.weight": "norm.weight",
    "model.hc_head.hc_fn": "hc_head_fn",
    "model.hc_head.hc_base": "hc_head_base",
    "model.hc_head.hc_scale": "hc_head_scale",
}
# the modules the release stores in fp8 (the compressors, the indexer's weights_proj, the
# router, the embedding and the head stay 16-bit)
FP8_MODULES = re.compile(r".*\.(attn\.(wq_a|wq_b|wkv|wo_a|wo_b|indexer\.wq_b)"
                         r"|ffn\.(shared_experts|experts\.\d+)\.w[123])$")
EXPERT = re.compile(r".*\.ffn\.experts\.\d+\.w[123]$")
RELEASE_QC = dict(quant_method="fp8", fmt="e4m3", activation_scheme="dynamic",
                  scale_fmt="ue8m0", weight_block_size=[128, 128])
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # codes 0..7; bit 3: sign
FP4_GROUP = 32


def released_name(name: str) -> str:
    """The released layout's name of a transformers-layout tensor name."""
    if name in TO_RELEASED:
        return TO_RELEASED[name]
    return name.removeprefix("model.").replace(".attn.norm.", ".attn.kv_norm.")


def quantize_fp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w `[out, in]` -> (packed int8 `[out, in / 2]`, e8m0 scale `[out, in / 32]`): each
    group of 32 columns scaled by a power of two that fits its largest value under 6, then
    each value rounded to the nearest e2m1."""
    out, cols = w.shape
    groups = w.float().view(out, cols // FP4_GROUP, FP4_GROUP)
    amax = groups.abs().amax(dim=-1, keepdim=True)  # [out, in / 32, 1]
    scale = torch.exp2(torch.ceil(torch.log2(torch.where(amax > 0, amax / 6, 1.0))))
    v = (groups / scale).view(out, cols)
    code = (v.abs()[..., None] - E2M1).abs().argmin(-1) | torch.where(v < 0, 8, 0)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
    return packed, scale[..., 0].to(torch.float8_e8m0fnu)


def dequantize_fp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 `[out, in]` that `quantize_fp4`'s pair stands for."""
    code = packed.view(torch.uint8).long()
    pairs = torch.stack([code & 15, code >> 4], dim=-1).flatten(1)  # [out, in]
    values = E2M1[pairs & 7] * torch.where(pairs >= 8, -1.0, 1.0)
    return values * scale.float().repeat_interleave(FP4_GROUP, dim=1)


def _quantized(name: str, w: torch.Tensor, quant: str) -> tuple[dict, torch.Tensor]:
    """The released tensors of weight `name` (the weight and its `.scale`) and the float32
    weight they stand for."""
    module = released_name(name.removesuffix(".weight"))
    if quant == "fp4" and EXPERT.match(module):
        packed, scale = quantize_fp4(w)
        return {f"{module}.weight": packed, f"{module}.scale": scale}, dequantize_fp4(packed,
                                                                                      scale)
    q, scale = quantize(w, "block", e8m0=True)
    released = {f"{module}.weight": q, f"{module}.scale": scale.to(torch.float8_e8m0fnu)}
    return released, dequantize(q, scale, "block")


def write_released(hf_model, root: Path, quant: str = "none") -> tuple[Path, Path]:
    """Save `hf_model` into `root/released` in the released layout (two shards and an index,
    an MTP layer's tensors included) quantized as `quant` says ("none", "fp8", or "fp4":
    fp8 with packed fp4 routed experts), and its weights as the release stores them
    (dequantized) into `root/reference` in the transformers layout. Returns both folders."""
    src, out, ref = root / "src", root / "released", root / "reference"
    hf_model.save_pretrained(src)
    state = load_file(str(src / "model.safetensors"))
    released, reference = {}, {}
    for name, w in state.items():
        if quant != "none" and FP8_MODULES.match(name.removesuffix(".weight")):
            tensors, reference[name] = _quantized(name, w, quant)
            released.update(tensors)
        else:
            released[released_name(name)], reference[name] = w, w
    # the MTP layer, which a decoder-only server does not read
    for name in [n for n in released if n.startswith("layers.0.")]:
        released[name.replace("layers.0.", "mtp.0.", 1)] = released[name].clone()
    released["mtp.0.hc_head_fn"] = released["hc_head_fn"].clone()
    shutil.copytree(src, ref)
    save_file({k: v.contiguous() for k, v in reference.items()}, str(ref / "model.safetensors"))
    shutil.copytree(src, out)
    (out / "model.safetensors").unlink()
    names = sorted(released)
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in shards.items():
        save_file({n: released[n].contiguous() for n in part}, str(out / file))
    weight_map = {n: file for file, part in shards.items() for n in part}
    index = {"metadata": {}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    if quant != "none":
        config = json.loads((out / "config.json").read_text())
        config["quantization_config"] = RELEASE_QC
        if quant == "fp4":
            config["expert_dtype"] = "fp4"
        (out / "config.json").write_text(json.dumps(config, indent=2))
    return out, ref
