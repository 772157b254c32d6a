"""Multi-LoRA on the CPU, scheduler and worker in one process: greedy outputs equal those
of `peft`'s merged models, in batches that mix adapters and the base model, with slots
loaded on demand, and prefixes cached per adapter."""

from __future__ import annotations

import pytest

from tests.worker.lora_adapters import hf_greedy
from tests.worker.lora_serving import (
    MAX_TOKENS,
    InProcess,
    checkpoint_with_adapters,
    config,
    prompts,
)


@pytest.fixture(scope="module", params=["llama", "qwen2-tied", "qwen3"])
def family(request, tmp_path_factory):
    """Each family's tiny checkpoint (biases, tied embeddings, q/k norms) and adapters."""
    return checkpoint_with_adapters(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return checkpoint_with_adapters("llama", tmp_path_factory.mktemp("llama"))


def test_mixed_batch_matches_peft_merged_models(family):
    base, folders, refs = family
    engine = InProcess(config(base, folders))
    adapters = [None, "all", "qv", "all", None, "qv", "qv", "all"]
    requests = list(zip(prompts(len(adapters), seed=1), adapters))
    for (prompt, lora), (out, _) in zip(requests, engine.run(requests)):
        assert out == hf_greedy(refs[lora], prompt, MAX_TOKENS), f"adapter {lora}"
    assert engine.sched.loras.num_loads == 2  # both fit: each loaded once


def test_prefixes_are_cached_per_adapter(llama):
    """The same prompt under each adapter and none: a request reuses only the KV its own
    adapter computed (k/v projections differ), and each output stays its model's."""
    base, folders, refs = llama
    engine = InProcess(config(base, folders))
    prompt = prompts(1, seed=2)[0]
    first = engine.run([(prompt, None)])
    assert first[0][0] == hf_greedy(refs[None], prompt, MAX_TOKENS)
    again = engine.run([(prompt, lora) for lora in (None, "all", "qv")])
    hits = [cached for _, cached in again]
    assert hits[0] == len(prompt) - 1 and hits[1:] == [0, 0]  # base hit only
    for (out, _), lora in zip(again, (None, "all", "qv")):
        assert out == hf_greedy(refs[lora], prompt, MAX_TOKENS), f"adapter {lora}"
    third = engine.run([(prompt, "qv")])
    assert third[0][1] == len(prompt) - 1  # now "qv" has its own cached prefix


@pytest.mark.parametrize("kv", ["token", "paged"])
def test_one_slot_serves_two_adapters_in_turn(llama, kv):
    """--max-loras 1: requests of two adapters take the one slot in turn (those of the
    adapter not resident wait while the other's run; the base's never wait), each adapter
    loaded into it on demand."""
    base, folders, refs = llama
    engine = InProcess(config(base, folders, max_loras=1, kv=kv))
    adapters = ["all", "qv", "all", None, "qv", "all"]
    requests = list(zip(prompts(len(adapters), seed=3), adapters))
    for (prompt, lora), (out, _) in zip(requests, engine.run(requests)):
        assert out == hf_greedy(refs[lora], prompt, MAX_TOKENS), f"adapter {lora}"
    assert engine.sched.loras.num_loads == 2  # "all" ran first, then "qv" took the slot
    assert engine.worker.runner.lora.resident == ["qv"]
    prompt = requests[0][0]
    assert engine.run([(prompt, "all")])[0][0] == hf_greedy(refs["all"], prompt, MAX_TOKENS)
    assert engine.sched.loras.num_loads == 3
    assert engine.worker.runner.lora.resident == ["all"]


def test_warm_up_leaves_the_slots_to_the_scheduler(llama):
    """The start-up warm-up runs an adapter through slot 0; the scheduler, which did not
    ask for it, loads every slot before it uses it."""
    base, folders, refs = llama
    engine = InProcess(config(base, folders))
    engine.worker.warm_up()
    requests = list(zip(prompts(3, seed=4), ["qv", None, "all"]))
    for (prompt, lora), (out, _) in zip(requests, engine.run(requests)):
        assert out == hf_greedy(refs[lora], prompt, MAX_TOKENS), f"adapter {lora}"


def test_retracted_requests_come_back_with_their_adapters(llama):
    """A pool too small for the batch retracts requests (their slots unpinned) and admits
    them again (pinned again, perhaps elsewhere): outputs stay each adapter's."""
    base, folders, refs = llama
    engine = InProcess(config(base, folders, kv_slots=200, max_loras=1,
                              schedule_conservativeness=0.0))
    adapters = ["all", "all", None, "all", "qv", None]
    requests = list(zip(prompts(len(adapters), seed=5), adapters))
    for (prompt, lora), (out, _) in zip(requests, engine.run(requests)):
        assert out == hf_greedy(refs[lora], prompt, MAX_TOKENS), f"adapter {lora}"
    assert engine.sched.num_retractions > 0
