"""A model folder without weights for the peer: a `dummy:` preset's config.json (bf16, with
its architecture named) and a word-level tokenizer of the model's vocabulary, so that a
server can tokenize the load generator's text. The peer draws random weights of that shape
(`load_format="dummy"`); Sluice serves the preset itself and reads the same tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

ARCHITECTURES = {"llama": "LlamaForCausalLM", "deepseek_v2": "DeepseekV2ForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM"}
MARKER = "peers-model.json"  # what the folder was written from, to reuse it


def config_dict(preset: str, dtype: str) -> dict:
    """The preset's transformers config as config.json holds it, with `architectures`."""
    from runtime.model_config import resolve_model

    cfg = resolve_model(f"dummy:{preset}").hf_config().to_dict()
    if cfg["model_type"] not in ARCHITECTURES:
        raise ValueError(f"dummy:{preset}: no architecture known for model_type "
                         f"{cfg['model_type']!r} (have {sorted(ARCHITECTURES)})")
    cfg["architectures"] = [ARCHITECTURES[cfg["model_type"]]]
    cfg["dtype"] = cfg["torch_dtype"] = dtype
    return cfg


def write_model_dir(root: Path, preset: str, dtype: str) -> Path:
    """`root/<preset>` holding config.json and the tokenizer; reused when it was written
    from the same config."""
    from bench.load.checkpoint import write_tokenizer

    folder = root / preset
    cfg = config_dict(preset, dtype)
    marker = folder / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == cfg:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_tokenizer(folder, cfg["vocab_size"])
    marker.write_text(json.dumps(cfg))
    return folder
