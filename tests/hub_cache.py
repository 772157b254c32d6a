"""Test helper: a Hugging Face Hub cache on disk, laid out as huggingface_hub writes it
(`models--org--name/blobs/<hash>`, `snapshots/<commit>/<file>` symlinks to the blobs,
`refs/<branch>` holding the commit), and the settings that make it the only one used."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from huggingface_hub import constants

from runtime.model_config import resolve_model
from tests.worker.checkpoints import tiny_checkpoint

SMOLLM2_VOCAB = 49152  # the SmolLM2 tokenizer's ids: the tiny model embeds them all
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def use_hub_cache(monkeypatch: pytest.MonkeyPatch, cache: Path, offline: bool = True) -> None:
    """Make `cache` the Hub cache, offline, for this process (huggingface_hub read the
    environment at import) and for the server processes it starts (they read it)."""
    monkeypatch.setenv("HF_HOME", str(cache.parent / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def write_snapshot(cache: Path, repo_id: str, commit: str, files: dict[str, Path],
                   refs: tuple[str, ...] = ("main",)) -> Path:
    """Cache `files` (name in the repo -> a file to copy) as `repo_id` at `commit`, which
    each of `refs` points at; return the snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for name, source in files.items():
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        blob = repo / "blobs" / digest
        if not blob.exists():
            shutil.copyfile(source, blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / name)
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot


def tiny_llama_with_tokenizer(folder: Path) -> dict[str, Path]:
    """A tiny random Llama checkpoint sized for the SmolLM2 tokenizer, and that tokenizer,
    written to `folder`; its files by name."""
    tiny_checkpoint("llama", folder, vocab_size=SMOLLM2_VOCAB)
    smollm2 = Path(resolve_model("smollm2").path)
    for name in TOKENIZER_FILES:
        shutil.copyfile(smollm2 / name, folder / name)
    return {p.name: p for p in folder.iterdir()}
