"""One source for the request limits: a Mistral-shaped model whose sliding window (256)
caps the context below its 512 positions. The api must advertise and enforce the capped
limit, and a chat request without max_tokens gets the rest of the context (as vLLM does),
not a 500 from the scheduler."""

from __future__ import annotations

import shutil

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, MistralConfig

from runtime import Engine, InvalidRequest, SamplingParams
from runtime.model_config import resolve_model
from tests.e2e.server import ServerProcess
from tests.worker.checkpoints import BASE

WINDOW = 256
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@pytest.fixture(scope="module")
def mistral_window(tmp_path_factory) -> str:
    """A tiny random Mistral checkpoint (512 positions, a 256-token sliding window) with
    SmolLM2's tokenizer and chat template (so its vocabulary is SmolLM2's)."""
    folder = tmp_path_factory.mktemp("mistral-window")
    smollm2 = resolve_model("smollm2").path
    for name in TOKENIZER_FILES:
        shutil.copy(f"{smollm2}/{name}", folder / name)
    config = MistralConfig(**{**BASE, "vocab_size": 49152, "sliding_window": WINDOW,
                              "bos_token_id": 1, "eos_token_id": 2})
    assert config.max_position_embeddings > WINDOW
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def server(mistral_window):
    srv = ServerProcess("--model", mistral_window, "--chunk-size", "128")
    yield srv
    srv.stop()


def chat(server, mistral_window, content: str, **extra) -> httpx.Response:
    body = {"model": mistral_window, "messages": [{"role": "user", "content": content}],
            "temperature": 0, "ignore_eos": True, **extra}
    return httpx.post(f"{server.http_url}/v1/chat/completions", json=body, timeout=120)


def test_models_and_model_info_advertise_the_capped_context(server, mistral_window):
    card = httpx.get(f"{server.http_url}/v1/models", timeout=30).json()["data"][0]
    assert card["id"] == mistral_window and card["max_model_len"] == WINDOW
    info = httpx.get(f"{server.http_url}/get_model_info", timeout=30).json()
    assert info["max_model_len"] == WINDOW


def test_chat_without_max_tokens_fills_the_capped_context(server, mistral_window):
    r = chat(server, mistral_window, "Hello there!")
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["total_tokens"] == WINDOW


def test_too_long_for_the_capped_context_is_a_400(server, mistral_window):
    r = chat(server, mistral_window, "Hello there!", max_tokens=WINDOW)
    assert r.status_code == 400, r.text
    assert f"exceeds the context length of {WINDOW} tokens" in r.json()["error"]["message"]
    r = chat(server, mistral_window, "word " * (2 * WINDOW))  # no max_tokens: the prompt
    assert r.status_code == 400, r.text
    assert f"at most {WINDOW - 1} prompt tokens" in r.json()["error"]["message"]
    assert chat(server, mistral_window, "Still serving?", max_tokens=4).status_code == 200


def test_engine_gets_the_capped_limits_too(mistral_window):
    with Engine(model=mistral_window, chunk_size=128, torch_threads=2) as eng:
        assert eng.model_info().max_model_len == WINDOW
        with pytest.raises(InvalidRequest, match=f"at most {WINDOW - 1} prompt tokens"):
            eng.generate([5] * WINDOW, SamplingParams(max_tokens=1))
        out = eng.generate([5] * (WINDOW - 4), SamplingParams(max_tokens=4, ignore_eos=True))
        assert len(out[0].token_ids) == 4
