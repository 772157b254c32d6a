"""Programs against `sluice serve` over HTTP and RPC: a batch of few-shot programs hits
the radix cache (measured by /metrics), both transports agree, `/generate` takes `regex`
and `logprob_start_len`, an invalid regex is a 400, and the README's programs run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

import frontend as sl
from tests.e2e.server import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
DATE = r"\d{4}-\d{2}-\d{2}"
FEW_SHOT = (
    "Answer each question with one word.\n"
    "Q: What colour is the sky on a clear day?\nA: Blue\n"
    "Q: What do bees make?\nA: Honey\n"
    "Q: What is frozen water called?\nA: Ice\n"
    "Q: Which animal says moo?\nA: Cow\n"
    "Q: What is the opposite of day?\nA: Night\n"
    "Q: How many legs does a spider have?\nA: Eight\n"
    "Q: What is the largest planet?\nA: Jupiter\n"
)


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server):
    backend = sl.RuntimeEndpoint(server.http_url)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def rpc(server):
    backend = sl.RuntimeEndpoint(server.rpc_addr)
    yield backend
    backend.close()


@sl.function
def few_shot(s, question):
    s += FEW_SHOT
    s += "Q: " + question + "\nA:"
    s += sl.gen("answer", max_tokens=6, temperature=0.0, stop="\n")


def test_run_batch_of_32_few_shot_programs_hits_the_prefix_cache(http):
    questions = [f"What is {i} plus {i}?" for i in range(16)] + [
        f"Name a word that rhymes with number {i}." for i in range(16)]
    states = few_shot.run_batch([{"question": q} for q in questions], backend=http,
                                progress_bar=True)
    assert len(states) == 32
    for q, s in zip(questions, states):
        assert s.text().startswith(FEW_SHOT + "Q: " + q + "\nA:")
        assert s.get_meta_info("answer")["cached_tokens"] > 100  # the few-shot prefix
    assert states.prefix_hit_rate > 0.5, (states.prefix_hit_tokens, states.prefix_query_tokens)


@sl.function
def quiz(s, topic):
    s += sl.system("You answer quizzes.")
    s += sl.user(f"Is {topic} a fruit or a vegetable? Then give a date.")
    s += sl.assistant("It is a " + sl.select("kind", choices=["fruit", "vegetable"])
                      + ". Date: " + sl.gen("date", max_tokens=12, temperature=0.0,
                                            regex=DATE))


def test_http_and_rpc_backends_run_programs_alike_streamed_or_not(http, rpc):
    runs = {}
    for name, backend in (("http", http), ("rpc", rpc)):
        whole = quiz.run(topic="an apple", backend=backend)
        streamed = quiz.run(topic="an apple", backend=backend, stream=True)
        pieces = list(streamed.text_iter())
        assert len(pieces) > 3 and "".join(pieces) == whole.text() == streamed.text()
        assert re.fullmatch(DATE, whole["date"])
        runs[name] = (whole.text(), whole["kind"])
    assert runs["http"] == runs["rpc"]


def test_generate_takes_regex_and_input_logprobs_and_refuses_a_bad_regex(server):
    url = server.http_url
    body = {"text": "Today's date is ", "logprob_start_len": 2,
            "sampling_params": {"max_tokens": 16, "temperature": 1.0, "regex": DATE}}
    out = httpx.post(f"{url}/generate", json=body, timeout=60).json()
    assert re.fullmatch(DATE, out["text"]) and out["finish_reason"] == "stop"
    n = out["usage"]["prompt_tokens"]
    assert len(out["input_logprobs"]) == len(out["input_token_ids"]) == n - 2
    assert all(lp <= 0 for lp in out["input_logprobs"])
    bad = httpx.post(f"{url}/generate", timeout=60,
                     json={"text": "x", "sampling_params": {"regex": "[a-"}})
    assert bad.status_code == 400 and "invalid regex" in bad.json()["error"]["message"]
    info = httpx.get(f"{url}/get_model_info", timeout=60).json()
    assert info["chat_roles"]["assistant"]["prefix"] == "<|im_start|>assistant\n"


def readme_examples() -> list[str]:
    """The DSL programs of the README and of its frontend page (docs/frontend.md)."""
    text = (ROOT / "README.md").read_text() + (ROOT / "docs" / "frontend.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    return [b for b in blocks if "RuntimeEndpoint(" in b]


def test_readme_examples_run_as_written(server):
    examples = readme_examples()
    assert len(examples) == 4
    for code in examples:
        code = code.replace("http://127.0.0.1:30000", server.http_url)
        code = code.replace("tcp://127.0.0.1:30001", server.rpc_addr)
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                              text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.strip(), code
