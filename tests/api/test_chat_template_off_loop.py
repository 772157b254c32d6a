"""A long chat conversation is rendered with the chat template off the api's event loop:
`/health` answers while the template is still rendering it."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.api.fake_scheduler import FakeScheduler
from tests.api.http.test_health import http_front

WAIT_S = 10.0  # every wait is bounded: a template stuck on the loop fails, never hangs


@pytest.fixture
def held_template(tok, monkeypatch):
    """The tokenizer class's chat template, held open (for a long conversation) until
    `release` is set; `rendering` is set while it is held."""
    real = type(tok).apply_chat_template
    rendering, release = threading.Event(), threading.Event()

    def apply_chat_template(self, conversation, *args, **kwargs):
        if sum(len(turn["content"]) for turn in conversation) > 10_000:
            rendering.set()
            release.wait(WAIT_S)
            rendering.clear()
        return real(self, conversation, *args, **kwargs)

    monkeypatch.setattr(type(tok), "apply_chat_template", apply_chat_template)
    yield rendering, release
    release.set()


def test_health_answers_while_a_long_conversation_is_templated(cfg, spec, script_ids,
                                                                 held_template):
    rendering, release = held_template
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 100}
                for i in range(41)]
    body = {"model": cfg.model, "messages": messages, "max_tokens": 3}
    replies: list[httpx.Response] = []
    with FakeScheduler(cfg, lambda r: script_ids), http_front(cfg, spec) as url:
        chat = threading.Thread(target=lambda: replies.append(
            httpx.post(f"{url}/v1/chat/completions", json=body, timeout=2 * WAIT_S)))
        chat.start()
        try:
            assert rendering.wait(WAIT_S), "the chat request never reached its template"
            health = httpx.get(f"{url}/health", timeout=WAIT_S / 2)
            still_rendering = rendering.is_set()
        finally:
            release.set()
            chat.join(2 * WAIT_S)
    assert health.status_code in (200, 503) and "status" in health.json()
    assert still_rendering, "/health answered only after the template finished"
    assert replies and replies[0].status_code == 200
    assert replies[0].json()["usage"]["completion_tokens"] == 3
