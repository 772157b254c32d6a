"""SGLang's own frontend (`import sglang as sgl`, `sgl.RuntimeEndpoint`) against `sluice
serve` (SmolLM2 on the CPU): gen with stop, select, fork, regex, run_batch, streaming,
and the endpoints the frontend calls besides `/generate`.

Needs the `sglang` package (CI installs it without its GPU dependencies: see `.ci/run`
and the README's "Using SGLang's tools with Sluice"); skipped when it is missing.
"""

from __future__ import annotations

import re

import pytest

from tests.e2e.server import ServerProcess

sgl = pytest.importorskip("sglang", reason="the sglang package is not installed "
                                           "(see the README: Using SGLang's tools with Sluice)")

YEAR = r"\d{4}"


@pytest.fixture(scope="module")
def backend():
    srv = ServerProcess()
    try:
        # SmolLM2 speaks ChatML; SGLang does not guess that from the name "smollm2"
        endpoint = sgl.RuntimeEndpoint(srv.http_url, chat_template_name="chatml")
        sgl.set_default_backend(endpoint)
        yield endpoint
    finally:
        srv.stop()


@sgl.function
def qa(s, question):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=8, stop="\n", temperature=0))


@sgl.function
def profile(s, name):
    s += sgl.user(f"Who is {name}?")
    s += sgl.assistant("A " + sgl.select("kind", choices=["person", "place", "thing"])
                       + ". Born in " + sgl.gen("year", max_tokens=8, regex=YEAR))


@sgl.function
def two_tips(s, topic):
    s += f"Two tips about {topic}:\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"{i + 1}. " + sgl.gen("tip", max_tokens=4, stop="\n", temperature=0)
    forks.join()
    s += "Tip 1: " + forks[0]["tip"]


def test_model_info_names_the_model(backend):
    assert backend.get_model_name() == "smollm2"
    info = backend.get_server_info()
    assert info["model_path"] == "smollm2" and len(info["internal_states"]) == 1
    backend.flush_cache()  # the server is idle: a 200


def test_gen_with_stop_and_streaming_agree(backend):
    state = qa.run(question="Name a colour.")
    assert state.error() is None
    answer = state["answer"]
    assert answer and "\n" not in answer
    assert state.get_meta_info("answer")["finish_reason"]["type"] in ("stop", "length")
    streamed = qa.run(question="Name a colour.", stream=True)
    assert "".join(streamed.text_iter("answer")) == answer
    backend.flush_cache()  # right after a request: done once its last batch completed
    assert backend.get_server_info()["internal_states"][0]["kv_cached"] == 0


def test_select_and_regex(backend):
    state = profile.run(name="Ada Lovelace")
    assert state.error() is None
    assert state["kind"] in ("person", "place", "thing")
    assert re.fullmatch(YEAR, state["year"]), state["year"]


def test_fork_and_run_batch(backend):
    states = two_tips.run_batch([{"topic": "sleep"}, {"topic": "tea"}], num_threads=2)
    for state in states:
        assert state.error() is None
        assert state.text().startswith("Two tips about")
        assert "Tip 1: " in state.text()
        assert all("\n" not in tip for tip in state["tip"])
