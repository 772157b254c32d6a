"""Multi-LoRA on the CPU, scheduler and worker in one process: greedy outputs equal those
of `peft`'s merged models, in batches that mix adapters and the base model, with slots
loaded on demand, and prefixes cached per adapter."""

from __future__ import annotations

from collections import deque

import pytest
import torch

from runtime.config import ServerConfig
from runtime.messages import GenerateReq, SamplingParams
from runtime.model_config import resolve_model
from runtime.scheduler.loop import build_scheduler
from runtime.worker.worker import Worker
from tests.worker.checkpoints import BASE, tiny_checkpoint
from tests.worker.lora_adapters import hf_greedy, tiny_adapters

MAX_TOKENS = 12


def checkpoint_with_adapters(name: str, tmp):
    """(base folder, adapter folders, reference models by adapter name, None the base)."""
    base = tiny_checkpoint(name, tmp / "base")
    folders, merged = tiny_adapters(tmp / "base", tmp)
    return str(tmp / "base"), folders, {None: base, **merged}


@pytest.fixture(scope="module", params=["llama", "qwen2-tied", "qwen3"])
def family(request, tmp_path_factory):
    """Each family's tiny checkpoint (biases, tied embeddings, q/k norms) and adapters."""
    return checkpoint_with_adapters(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return checkpoint_with_adapters("llama", tmp_path_factory.mktemp("llama"))


def config(base: str, folders: dict[str, str], **options) -> ServerConfig:
    return ServerConfig(model=base, device="cpu", dtype="float32", kv_slots=512,
                        max_running=8, chunk_size=48, log_level="warning",
                        lora_paths=tuple(f"{n}={p}" for n, p in folders.items()), **options)


class InProcess:
    """A scheduler and a worker stepped in one process, as the server steps them."""

    def __init__(self, cfg: ServerConfig) -> None:
        spec = resolve_model(cfg.model)
        self.worker = Worker(cfg, spec)
        self.sched = build_scheduler(cfg, self.worker.ready_message(), spec.max_context)
        self.count = 0

    def run(self, requests: list[tuple[list[int], str | None]]) -> list[tuple[list[int], int]]:
        """Submit every (prompt, adapter) at once and run them to the end: (output ids,
        cached prompt tokens) of each."""
        rids = []
        for prompt, lora in requests:
            rids.append(f"r{self.count}")
            self.count += 1
            params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, lora=lora)
            self.sched.add(GenerateReq(rids[-1], prompt, params))
        outs = {rid: [] for rid in rids}
        cached = dict.fromkeys(rids, 0)
        in_flight: deque = deque()
        sched = self.sched
        while sched.has_work or in_flight:
            while sched.can_plan() and (plan := sched.plan()) is not None:
                in_flight.append(self.worker.launch(plan))
            assert in_flight, "work left and nothing to run: the scheduler is stuck"
            sched.on_result(in_flight.popleft().result())
            if not sched.in_flight:
                sched.check_invariants()
            for out in sched.take_outputs():
                assert out.error is None, out.error
                outs[out.rid] += out.token_ids
                cached[out.rid] += out.cached_tokens
        return [(outs[r], cached[r]) for r in rids]


def prompts(n: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, BASE["vocab_size"], (k,), generator=gen).tolist()
            for k in torch.randint(5, 70, (n,), generator=gen).tolist()]


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
