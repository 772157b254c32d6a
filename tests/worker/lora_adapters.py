"""Test helper: tiny random PEFT LoRA adapters of a tiny checkpoint, and the merged models
(W + scaling * B A, by `peft`) that are their reference."""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# two adapters unlike each other: every projection at rank 8, or q/v alone at rank 4 with
# rsLoRA scaling
ADAPTERS = {
    "all": dict(r=8, lora_alpha=16, target_modules=ALL_TARGETS),
    "qv": dict(r=4, lora_alpha=6, target_modules=["q_proj", "v_proj"], use_rslora=True),
}


def tiny_adapter(base_folder, folder, seed: int, **lora) -> torch.nn.Module:
    """Save a LoRA adapter of the checkpoint in `base_folder` with random A and B (PEFT
    starts B at zero) to `folder`; return the merged model (fp32, eval)."""
    model = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(**lora))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(0.15 * torch.randn(param.shape, generator=gen))
    peft_model.save_pretrained(folder)
    return peft_model.merge_and_unload().eval()


def tiny_adapters(base_folder, tmp_path) -> tuple[dict[str, str], dict[str, torch.nn.Module]]:
    """The `ADAPTERS`, saved under `tmp_path`: (name -> folder, name -> merged model)."""
    folders, merged = {}, {}
    for i, (name, lora) in enumerate(ADAPTERS.items()):
        folders[name] = str(tmp_path / f"lora-{name}")
        merged[name] = tiny_adapter(base_folder, folders[name], seed=10 + i, **lora)
    return folders, merged


@torch.inference_mode()
def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation of `prompt` by a transformers model (no EOS stop)."""
    ids = torch.tensor([prompt])
    for _ in range(max_new_tokens):
        nxt = model(ids).logits[0, -1].argmax()
        ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return ids[0, len(prompt):].tolist()
