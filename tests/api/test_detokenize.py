"""IncrementalDetokenizer against the real SmolLM2 tokenizer (byte-level BPE)."""

from __future__ import annotations

import random

import pytest

from runtime.api.detokenize import IncrementalDetokenizer, stream_backend

TEXTS = [
    "Hello, world! The quick brown fox.",
    "emoji 😀😃😄 flags 🇫🇷🇯🇵 family 👨‍👩‍👧 done",
    "中文测试：你好，世界！日本語のテキスト。한국어 텍스트.",
    "mixed ∑∫√ ≠ ≤ — “quotes” ‘single’ … and tabs\tand\nnewlines\n\n",
    "  leading spaces and trailing   ",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
]


class PythonWindows:
    """The tokenizer's decode without its Rust backend: the detokenizer decodes windows in
    Python. With `backend`, a stand-in backend that `DecodeStream` cannot use."""

    def __init__(self, tok, backend=None) -> None:
        self.tok = tok
        if backend is not None:
            self.backend_tokenizer = backend
            self.clean_up_tokenization_spaces = False

    def decode(self, ids, skip_special_tokens=True):
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)


def stream(tok, prompt_ids, ids, *, stop=(), skip=True, split=None):
    """Feed `ids` in groups (sizes from `split`), return (deltas, detokenizer)."""
    d = IncrementalDetokenizer(tok, prompt_ids, skip, stop)
    deltas, i = [], 0
    sizes = split or [1] * len(ids)
    for n in sizes:
        deltas.append(d.add(ids[i:i + n]))
        i += n
    deltas.append(d.flush())
    return deltas, d


def random_split(rng, n):
    sizes = []
    while n > 0:
        sizes.append(min(n, rng.randint(1, 4)))
        n -= sizes[-1]
    return sizes


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("skip", [True, False])
def test_deltas_concatenate_to_full_decode(tok, text, skip):
    prompt = tok.encode("Write something:")
    ids = tok.encode(text)
    deltas, d = stream(tok, prompt, ids, skip=skip)
    full = tok.decode(ids, skip_special_tokens=skip)
    assert "".join(deltas) == full
    assert d.token_ids == ids
    if "\ufffd" not in full:
        assert not any("\ufffd" in x for x in deltas)


def test_random_sequences(tok):
    """Random token ids (often invalid UTF-8 mid-stream) and random unicode text."""
    rng = random.Random(0)
    alphabet = "ab ,.é中文字😀🎉🇫🇷ñ한\n" + "".join(chr(c) for c in range(0x4E00, 0x4E40))
    for trial in range(60):
        if trial % 2:
            ids = [rng.randrange(len(tok)) for _ in range(rng.randint(1, 40))]
        else:
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60)))
            ids = tok.encode(text)
        prompt = [rng.randrange(len(tok)) for _ in range(rng.randint(1, 8))]
        deltas, _ = stream(tok, prompt, ids, split=random_split(rng, len(ids)))
        full = tok.decode(ids, skip_special_tokens=True)
        assert "".join(deltas) == full, (prompt, ids)
        if "\ufffd" not in full:
            assert not any("\ufffd" in x for x in deltas)


def test_multi_token_characters_are_held_back(tok):
    ids = tok.encode("😀")
    assert len(ids) > 1  # the emoji spans several byte tokens
    d = IncrementalDetokenizer(tok, tok.encode("x"), True, [])
    assert [d.add([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert d.add(ids[-1:]) == "😀"


def test_stop_string_across_token_boundaries(tok):
    text = "The answer is 42. STOPWORD and more text after it."
    ids = tok.encode(text)
    for stop in (["STOPWORD"], ["OPWO"], ["42. ST", "never"], ["never", "and more"]):
        deltas, d = stream(tok, tok.encode("Q:"), ids, stop=stop)
        first = min(text.find(s) for s in stop if s in text)
        matched = [s for s in stop if text.find(s) == first][0]
        assert "".join(deltas) == text[:first]
        assert d.stop_str == matched and d.finished
        # ids end at the token that completed the match
        kept = d.token_ids
        assert matched in tok.decode(kept) and matched not in tok.decode(kept[:-1])
        assert kept == ids[:len(kept)]


def test_stop_string_inside_one_token_and_in_multibyte_text(tok):
    text = "世界和平世界和平 end"
    ids = tok.encode(text)
    deltas, d = stream(tok, [], ids, stop=["和平"])
    assert "".join(deltas) == "世界"
    assert d.stop_str == "和平"
    deltas, d = stream(tok, [], tok.encode("hello world"), stop=["o w"])
    assert "".join(deltas) == "hell"


def test_held_back_text_never_reveals_a_stop_prefix(tok):
    rng = random.Random(1)
    text = "abc STOP_HERE xyz " * 3
    ids = tok.encode(text)
    stop = ["STOP_HERE", "zzzzzz"]
    for _ in range(20):
        shown = ""
        d = IncrementalDetokenizer(tok, [], True, stop)
        i = 0
        for n in random_split(rng, len(ids)):
            shown += d.add(ids[i:i + n])
            i += n
            # everything shown is a prefix of the final output: no part of "STOP_HERE"
            assert "abc ".startswith(shown), shown
            if d.finished:
                break
        shown += d.flush()
        assert shown == "abc "


def test_flush_releases_held_text_and_finishes(tok):
    ids = tok.encode("wait for it")
    d = IncrementalDetokenizer(tok, [], True, ["xyz123"])
    streamed = d.add(ids)
    assert len(streamed) == len("wait for it") - 5  # max stop len - 1 held back
    assert streamed + d.flush() == "wait for it"
    assert d.finished and d.stop_str is None
    assert d.add(tok.encode(" more")) == ""


def test_unfinished_character_at_the_end_flushes_as_replacement(tok):
    ids = tok.encode("ok 😀")[:-1]  # cut inside the emoji
    deltas, _ = stream(tok, [], ids)
    assert "".join(deltas) == tok.decode(ids)
    assert "".join(deltas).endswith("\ufffd")


def random_case(tok, rng):
    """Prompt, output ids (random ids or unicode-heavy text), stop strings, skip flag."""
    if rng.random() < 0.5:
        ids = [rng.randrange(len(tok)) for _ in range(rng.randint(1, 40))]
    else:
        ids = tok.encode(rng.choice(TEXTS) + rng.choice(TEXTS))
    text = tok.decode(ids)
    stop = []
    if text and rng.random() < 0.3:
        at = rng.randrange(len(text))
        stop = [text[at:at + rng.randint(1, 4)]]
    prompt = [rng.randrange(len(tok)) for _ in range(rng.randint(0, 8))]
    return prompt, ids, stop, rng.random() < 0.5


def test_decode_stream_gives_the_python_windows_text(tok):
    """The Rust `DecodeStream` path and the Python windows give the same deltas, ids and
    stop, split however the ids arrive."""
    assert stream_backend(tok) is not None and stream_backend(PythonWindows(tok)) is None
    rng = random.Random(3)
    for _ in range(150):
        prompt, ids, stop, skip = random_case(tok, rng)
        split = random_split(rng, len(ids))
        rust, d = stream(tok, prompt, ids, stop=stop, skip=skip, split=split)
        windows, w = stream(PythonWindows(tok), prompt, ids, stop=stop, skip=skip, split=split)
        assert rust == windows, (prompt, ids, stop, skip)
        assert (d.token_ids, d.stop_str) == (w.token_ids, w.stop_str)


def test_a_refused_stream_step_falls_back_to_python_windows(tok):
    rng = random.Random(4)
    for _ in range(20):
        prompt, ids, stop, skip = random_case(tok, rng)
        refused, _ = stream(PythonWindows(tok, backend=object()), prompt, ids, stop=stop,
                            skip=skip)
        assert refused == stream(tok, prompt, ids, stop=stop, skip=skip)[0]
