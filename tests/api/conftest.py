"""Fixtures for the api tests: the SmolLM2 tokenizer, a fresh config per test."""

from __future__ import annotations

import shutil

import pytest

from runtime.config.server import ServerConfig
from runtime.model_config import ModelSpec, resolve_model

SCRIPT_TEXT = (" Hello 😀 world, 世界! Ünïcödé — naïve café. 🎉🚀 Answer: 42. "
               "こんにちは END of the story.")


@pytest.fixture(scope="session")
def spec() -> ModelSpec:
    return resolve_model("smollm2")


@pytest.fixture(scope="session")
def tok(spec):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(spec.tokenizer_path)


@pytest.fixture(scope="session")
def script_ids(tok) -> list[int]:
    """The fake scheduler's output: a unicode-heavy text that splits characters over tokens."""
    return tok.encode(SCRIPT_TEXT)


@pytest.fixture
def cfg():
    cfg = ServerConfig(port=0, rpc_port=0, log_level="warning")  # fronts bind free ports
    yield cfg
    shutil.rmtree(cfg.ipc_dir, ignore_errors=True)
