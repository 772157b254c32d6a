"""EAGLE heads shipped as PyTorch `.bin` files (`pytorch_model.bin`, or shards listed by
`pytorch_model.bin.index.json`), as released EAGLE-LLaMA3 and EAGLE-3 heads are: the same
head drafts as its safetensors copy, so greedy outputs stay plain decoding's; safetensors
win in a folder that has both; a `.bin` that is not a plain state dict of tensors is
refused at start-up, the file named, without running anything it holds."""

from __future__ import annotations

import re

import pytest
import torch

from runtime.model_config import resolve_model
from runtime.worker.model_check import prepare_model
from runtime.worker.speculative.eagle_head import EagleHead
from runtime.worker.speculative.eagle_layout import EagleHeadMismatch, read_layout
from runtime.worker.worker import Worker
from tests.speculative.eagle_heads import write_bin_head, write_head
from tests.speculative.serve import refused_at_start_up, serve, step_drafts
from tests.speculative.test_eagle import (  # noqa: F401 (target_fixture: the fixture)
    config,
    prompts_and_params,
    target_fixture,
)

HEADS = {  # name: (EAGLE-3, write_head options): the released layouts
    "eagle": (False, {"input_norm": False}),  # fc with a bias, embed_tokens carried
    "eagle3": (True, {}),
}
TRIPPED = []  # what a refused file's pickled object would have run


def _trip() -> None:
    TRIPPED.append(True)


class Tripwire:
    """An object whose unpickling runs `_trip`: a `.bin` holding one must be refused."""

    def __reduce__(self):
        return _trip, ()


@pytest.fixture(scope="module", name="plain")
def plain_fixture(target):
    """Plain decoding's greedy outputs of `prompts_and_params()`."""
    prompts, params = prompts_and_params()
    return serve(config(target, max_running=2), prompts, params)[0]


def drafts(cfg) -> list[tuple[list[int], list[int]]]:
    """Every verify step's (tokens so far, drafts) serving the first three requests."""
    prompts, params = prompts_and_params()
    return list(step_drafts(cfg, Worker(cfg, resolve_model(cfg.model)), prompts[:3],
                            params[:3]))


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("name", list(HEADS))
def test_a_bin_head_drafts_as_its_safetensors_copy(target, plain, tmp_path, name, shards):
    eagle3, opts = HEADS[name]
    w = write_head(tmp_path / "st", eagle3, **opts)
    write_bin_head(tmp_path / "bin", tmp_path / "st", w, shards)
    assert not list((tmp_path / "bin").glob("*.safetensors"))
    cfg = config(target, tmp_path / "bin", max_running=2)
    prepare_model(cfg)
    want = drafts(config(target, tmp_path / "st", max_running=2))
    assert len(want) >= 10
    assert drafts(cfg) == want
    prompts, params = prompts_and_params()
    outs, sched, _ = serve(cfg, prompts, params)
    assert outs == plain
    assert sched.spec.verify_steps > 0


def test_safetensors_win_over_bin_files(target, tmp_path):
    """A folder with both loads its safetensors; its `.bin` file is never opened."""
    folder = tmp_path / "head"
    w = write_head(folder, True)
    torch.save({"fc.weight": Tripwire()}, folder / "pytorch_model.bin")
    prepare_model(config(target, folder))
    head = EagleHead.load(read_layout(folder, resolve_model(str(target[0])).hf_config()),
                          torch.device("cpu"), torch.float32)
    assert torch.equal(head.fc.weight, w["fc.weight"])
    assert torch.equal(head.lm_head.weight, w["lm_head.weight"])
    assert not TRIPPED


BAD_FILES = {  # name: (what pytorch_model.bin holds, what the error says after the file)
    "an object": ({"fc.weight": Tripwire()}, "not a plain state dict of tensors: it holds "
                  r"other objects, which are not loaded \(Unsupported global: GLOBAL "
                  r"tests.speculative.test_eagle_bin._trip"),
    "a number": ({"fc.weight": torch.zeros(64, 128), "step": 3},
                 "entry 'step' is a int, not a tensor"),
    "a bare tensor": (torch.zeros(64, 128), "holds a Tensor, not a state dict of tensors"),
    "other bytes": (b"PK not a zip", "truncated, or not a PyTorch zip checkpoint"),
}


@pytest.mark.parametrize("bad", list(BAD_FILES))
def test_a_bin_that_is_not_a_state_dict_of_tensors_is_refused_naming_it(target, tmp_path,
                                                                         bad):
    folder = tmp_path / "head"
    write_head(folder, False)
    (folder / "model.safetensors").unlink()
    held, says = BAD_FILES[bad]
    if isinstance(held, bytes):
        (folder / "pytorch_model.bin").write_bytes(held)
    else:
        torch.save(held, folder / "pytorch_model.bin")
    named = re.escape(f"{folder / 'pytorch_model.bin'}: ") + says
    refused_at_start_up(config(target, folder), EagleHeadMismatch, named)
    assert not TRIPPED


def test_a_shard_the_index_lists_must_be_there(target, tmp_path):
    w = write_head(tmp_path / "st", False)
    write_bin_head(tmp_path / "bin", tmp_path / "st", w, shards=2)
    (tmp_path / "bin" / "pytorch_model-00002-of-00002.bin").unlink()
    refused_at_start_up(config(target, tmp_path / "bin"), EagleHeadMismatch,
                        "pytorch_model.bin.index.json: lists 1 missing file.*00002-of-00002")
