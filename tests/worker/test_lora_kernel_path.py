"""The model's LoRA projections through the Triton kernels (interpreted on the CPU) equal
the torch path, for a prefill mixing adapters and the base and for a decode step read
from static buffers as a CUDA graph reads them; on a GPU, graph replay equals eager steps
and `peft`'s merged models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runtime.model_config import resolve_model
from runtime.worker.lora.batch import LoraBatch, lora_segments
from runtime.worker.lora.manager import LoraOptions
from runtime.worker.model_runner import ModelRunner
from tests.worker.batching import Chunk, make_batch
from tests.worker.lora_adapters import hf_greedy
from tests.worker.lora_serving import InProcess, checkpoint_with_adapters, config, prompts

SLOTS = 2


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return checkpoint_with_adapters("llama", tmp_path_factory.mktemp("llama"))


def runner(base: str, folders: dict[str, str], device: str = "cpu", **options) -> ModelRunner:
    r = ModelRunner(resolve_model(base), device, torch.float32, kv_slots=256, max_rows=4,
                    lora=LoraOptions(folders, SLOTS), **options)
    r.lora.load_slots(list(enumerate(folders)))
    return r


def with_lora(fb, slots: list[int]):
    order, indptr, longest = lora_segments(slots, np.array(fb.extend_lens_cpu), SLOTS)
    fb.lora = LoraBatch(torch.from_numpy(order), torch.from_numpy(indptr), indptr.tolist(),
                        longest)
    return fb


def use_kernels(r: ModelRunner, on: bool) -> None:
    for layer in r.lora.layers.values():
        layer.use_kernels = on


def test_kernels_equal_the_torch_path_in_the_model(llama):
    base, folders, _ = llama
    r = runner(base, folders)
    gen = torch.Generator().manual_seed(4)
    ids = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (9, 17, 5)]
    slots = [1, -1, 0]
    logits = {}
    for on in (False, True):
        use_kernels(r, on)
        fb = with_lora(make_batch([Chunk(s, x) for s, x in enumerate(ids)], [0, 0, 0], 3,
                                  sample_all=True), slots)
        logits[on] = r.forward(fb)  # [T, V]
    torch.testing.assert_close(logits[True], logits[False], atol=1e-5, rtol=1e-5)


def test_a_decode_step_from_static_buffers_equals_the_eager_one(llama):
    """The graph path: the segments copied into buffers sized for 4 rows (`LoraBatch.static`,
    `fill`), no host copy of indptr, the grid as wide as the batch."""
    base, folders, _ = llama
    r = runner(base, folders)
    use_kernels(r, True)
    prompt = [[5, 9, 14], [7, 3, 3], [1, 2, 200]]
    r.forward(make_batch([Chunk(s, p) for s, p in enumerate(prompt)], [0, 0, 0], 3))
    step = [Chunk(s, [11 + s]) for s in range(3)]
    eager = r.forward(with_lora(make_batch(step, [3, 3, 3], 3), [0, 1, -1]))  # [3, V]
    static = LoraBatch.static(4, SLOTS, torch.device("cpu"))
    static.fill(with_lora(make_batch(step, [3, 3, 3], 3), [0, 1, -1]).lora)
    fb = make_batch(step, [3, 3, 3], 3)
    fb.lora = LoraBatch(static.order[:3], static.indptr, None, 3)
    torch.testing.assert_close(r.forward(fb), eager, atol=1e-6, rtol=1e-6)
    static.fill(None)  # a step without adapters: nothing read from the slots
    fb.lora = LoraBatch(static.order[:3], static.indptr, None, 3)
    plain = r.forward(make_batch(step, [3, 3, 3], 3))
    torch.testing.assert_close(r.forward(fb), plain, atol=0, rtol=0)


@pytest.mark.gpu
def test_graphs_and_eager_steps_match_merged_models_on_the_gpu(llama):
    base, folders, refs = llama
    adapters = [None, "all", "qv", "all", "qv", None]
    requests = list(zip(prompts(len(adapters), seed=8), adapters))
    outs = {}
    for graphs in (True, False):
        engine = InProcess(config(base, folders, device="cuda", cuda_graph=graphs))
        assert (engine.worker.runner.graphs is not None) == graphs
        outs[graphs] = [out for out, _ in engine.run(requests)]
    assert outs[True] == outs[False]
    for (prompt, lora), out in zip(requests, outs[True]):
        assert out == hf_greedy(refs[lora], prompt, len(out)), f"adapter {lora}"
