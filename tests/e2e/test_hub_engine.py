"""Serving a model by its Hub id (offline, from a Hub cache on disk) and with `--tokenizer`:
the Engine as a user runs it, scheduler and worker processes included."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from runtime import Engine, InvalidRequest, SamplingParams
from runtime.model_config import resolve_model
from runtime.model_errors import TokenizerError
from tests.hub_cache import (
    TOKENIZER_FILES,
    tiny_llama_with_tokenizer,
    use_hub_cache,
    write_snapshot,
)

REPO = "tiny-org/tiny-llama"
PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,"]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
OPTIONS = dict(torch_threads=2, kv_slots=512)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama_with_tokenizer(folder)
    return folder


def greedy_ids(eng: Engine) -> list[list[int]]:
    return [out.token_ids for out in eng.generate(PROMPTS, GREEDY)]


def test_engine_serves_a_hub_id_offline_as_it_serves_the_same_folder(tmp_path, monkeypatch,
                                                                      model_folder):
    cache = tmp_path / "hub"
    use_hub_cache(monkeypatch, cache)  # the server processes inherit it
    write_snapshot(cache, REPO, "c" * 40, {p.name: p for p in model_folder.iterdir()})
    with Engine(model=REPO, **OPTIONS) as eng:
        by_id = greedy_ids(eng)
        assert eng.model_info().model == REPO
    with Engine(model=str(model_folder), **OPTIONS) as eng:
        assert greedy_ids(eng) == by_id
    assert all(len(ids) == GREEDY.max_tokens for ids in by_id)


def test_tokenizer_flag_gives_text_prompts_to_a_folder_without_one(tmp_path, model_folder):
    bare = tmp_path / "weights-only"
    shutil.copytree(model_folder, bare,
                    ignore=lambda _, names: [n for n in names if n in TOKENIZER_FILES])
    with Engine(model=str(bare), **OPTIONS) as eng:
        with pytest.raises(InvalidRequest, match="no tokenizer.*--tokenizer"):
            eng.generate("Hello", GREEDY)
        ids_only = eng.generate([[1, 2, 3]], GREEDY)[0].token_ids
    with Engine(model=str(bare), tokenizer=str(model_folder), **OPTIONS) as eng:
        out = eng.generate("Hello", GREEDY)[0]
        assert eng.generate([[1, 2, 3]], GREEDY)[0].token_ids == ids_only
    assert len(out.token_ids) == GREEDY.max_tokens and out.text


def tiny_tokenizer(folder: Path) -> Path:
    """A byte-level BPE tokenizer of a few hundred ids (dummy:tiny embeds 1024)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["The quick brown fox jumps over the lazy dog."] * 10, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(folder)
    return folder


def test_tokenizer_flag_gives_a_dummy_preset_text_prompts(tmp_path):
    tokenizer = tiny_tokenizer(tmp_path / "tokenizer")
    with Engine(model="dummy:tiny", tokenizer=str(tokenizer), **OPTIONS) as eng:
        out = eng.generate("The lazy fox", GREEDY)[0]
        assert eng.tokenizer is not None and len(eng.tokenizer) <= 400
    assert len(out.token_ids) == GREEDY.max_tokens
    assert out.text == eng.tokenizer.decode(out.token_ids, skip_special_tokens=True)


def test_a_tokenizer_past_the_vocabulary_is_refused_before_anything_starts():
    threads = threading.active_count()
    with pytest.raises(TokenizerError, match=r"49152 ids, the model \(dummy:tiny\) embeds "
                                             r"only 1024"):
        Engine(model="dummy:tiny", tokenizer=resolve_model("smollm2").path, **OPTIONS)
    assert threading.active_count() == threads
