"""Multi-LoRA through the Engine's processes: requests of two adapters and of the base
model, in one generate, give `peft`'s merged models' greedy tokens, whole and split over two
tensor-parallel workers (gloo); a truncated adapter stops the start-up naming the file."""

from __future__ import annotations

import re
import shutil

import pytest
import torch

from runtime import Engine, InvalidRequest, SamplingParams
from runtime.launch.process_group import StartupError
from tests.e2e.test_engine_api import assert_idle
from tests.worker.checkpoints import BASE, tiny_checkpoint
from tests.worker.lora_adapters import hf_greedy, tiny_adapters

MAX_TOKENS = 10


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Llama 3 checkpoint (no tokenizer: prompts are token ids), its adapters and
    their merged models."""
    tmp = tmp_path_factory.mktemp("lora-e2e")
    base = tiny_checkpoint("llama3-rope", tmp / "base")
    folders, merged = tiny_adapters(tmp / "base", tmp)
    return str(tmp / "base"), folders, {None: base, **merged}


def prompts(n: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(0, BASE["vocab_size"], (k,), generator=gen).tolist()
            for k in torch.randint(4, 40, (n,), generator=gen).tolist()]


@pytest.mark.parametrize("tp", [1, 2])
def test_concurrent_adapters_match_merged_models(checkpoint, tp):
    base, folders, refs = checkpoint
    paths = tuple(f"{n}={p}" for n, p in folders.items())
    batch = prompts(9)
    adapters = [list(refs)[i % len(refs)] for i in range(len(batch))]  # None, all, qv, ...
    with Engine(model=base, lora_paths=paths, max_loras=2, tp=tp, chunk_size=32,
                torch_threads=1) as eng:
        outs = eng.generate(batch, [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0,
                                                   ignore_eos=True, lora=a) for a in adapters])
        with pytest.raises(InvalidRequest, match="lora: unknown LoRA adapter 'other'"):
            eng.generate(batch[0], SamplingParams(lora="other"))
        with pytest.raises(InvalidRequest, match="2 SamplingParams for 1 prompts"):
            eng.generate(batch[0], [SamplingParams(), SamplingParams()])
        assert_idle(eng)
    for prompt, lora, out in zip(batch, adapters, outs):
        assert out.token_ids == hf_greedy(refs[lora], prompt, MAX_TOKENS), f"adapter {lora}"


def test_a_truncated_adapter_stops_the_start_up_naming_it(checkpoint, tmp_path):
    base, folders, _ = checkpoint
    cut = tmp_path / "cut"
    shutil.copytree(folders["all"], cut)
    weights = cut / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:999])
    with pytest.raises(StartupError, match=re.escape(str(weights))):
        Engine(model=base, lora_paths=(f"cut={cut}",), torch_threads=1)
