"""Frontend programs on the in-process Engine: select against HF's log-probabilities,
chat templates, fork, and streaming."""

from __future__ import annotations

import asyncio

import pytest

import frontend as sl


@pytest.fixture(scope="module")
def backend(engine):
    b = sl.EngineBackend(engine)
    yield b
    b.close()


QUESTIONS = [
    ("The capital of France is", [" Paris", " London", " Berlin", " Rome"]),
    ("Water freezes at a temperature of zero degrees ", ["Celsius", "Fahrenheit", "Kelvin"]),
    ("2 + 2 =", [" 4", " 5", " four", " 22"]),
    ("The opposite of hot is ", ["cold", "warm", "blue"]),  # the space merges into the choice
]


@sl.function
def pick(s, text, choices):
    s += text
    s += sl.select("answer", choices=choices)


@pytest.mark.parametrize("text, choices", QUESTIONS)
def test_select_picks_the_highest_mean_logprob_by_hf(backend, hf, text, choices):
    state = pick.run(text=text, choices=choices, backend=backend)
    ref = hf.select_scores(text, choices)
    best = max(range(len(choices)), key=lambda i: ref[i])
    assert state["answer"] == choices[best]
    assert state.text() == text + choices[best]
    scores = state.get_meta_info("answer")["scores"]
    assert all(abs(a - b) < 1e-3 for a, b in zip(scores, ref)), (scores, ref)


@sl.function
def chat(s, question):
    s += sl.system("You are a terse assistant.")
    s += sl.user(question)
    s += sl.assistant(sl.gen("answer", max_tokens=12, temperature=0.0, stop="\n"))


@sl.function
def chat_no_system(s, question):
    s += sl.user(question)
    s += sl.assistant("Sure: " + sl.gen("answer", max_tokens=6, temperature=0.0))


def test_role_blocks_render_the_models_chat_template(backend, hf):
    for prog in (chat, chat_no_system):
        state = prog.run(question="Name a primary colour.", backend=backend)
        messages = state.messages()
        assert [m["role"] for m in messages][-2:] == ["user", "assistant"]
        assert messages[-1]["content"].endswith(state["answer"]) and state["answer"]
        assert state.text() == hf.tokenizer.apply_chat_template(messages, tokenize=False)


FRUITS = "Three different fruits, one per line:\n"


@pytest.mark.parametrize("mode", ["gather_variable", "concate_and_append"])
def test_fork_branches_share_the_prefix_and_differ_after_it(backend, hf, mode):
    kept = []

    @sl.function
    def fruits(s):
        s += FRUITS
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f"{i + 1}. " + sl.gen("fruit", max_tokens=4, temperature=0.0, stop="\n")
        kept.extend(forks)
        forks.join(mode)

    state = fruits.run(backend=backend)
    added = [b.text()[len(FRUITS):] for b in kept]
    assert all(b.text().startswith(FRUITS) for b in kept)
    assert len(set(added)) == 3  # the branches differ after the shared prefix
    for b in kept:  # the fork prefilled the prefix: every branch found it cached
        assert b.get_meta_info("fruit")["cached_tokens"] >= len(hf.encode(FRUITS)) - 1
    if mode == "gather_variable":
        assert state["fruit"] == [b["fruit"] for b in kept] and state.text() == FRUITS
    else:
        assert state.text() == FRUITS + "".join(added)


def test_streaming_yields_pieces_that_end_as_the_run_text(backend):
    whole = chat.run(question="What is the capital of Italy?", backend=backend)
    state = chat.run(question="What is the capital of Italy?", backend=backend, stream=True)
    pieces = list(state.text_iter())
    assert len(pieces) > 3  # incremental: markers, question, then token by token
    assert "".join(pieces) == state.text() == whole.text()
    assert list(whole.text_iter()) == [whole.text()]  # not streamed: all at once
    answer = chat.run(question="What is the capital of Italy?", backend=backend, stream=True)
    assert "".join(answer.text_iter("answer")) == whole["answer"]

    async def consume():
        s = chat.run(question="What is the capital of Italy?", backend=backend, stream=True)
        return [p async for p in s.text_async_iter()]

    assert "".join(asyncio.run(consume())) == whole.text()
