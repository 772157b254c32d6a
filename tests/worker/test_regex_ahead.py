"""A new regex no longer stalls the other streams: SmolLM2's worker and the scheduler in
one process, driven as `scheduler/loop.py` drives them across processes.

The issue: a request with a new regex was bound to a row at once, so the first step
holding it waited for the compile (up to seconds) and every in-flight stream with it.
Now the scheduler holds the request until the worker reports the regex compiled, and
the worker counts every step that had to wait for a compile (`compile_waits`).
"""

from __future__ import annotations

import queue
import re
from collections import deque

import pytest
import torch
from transformers import AutoTokenizer

from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.scheduler.loop import build_scheduler
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import GenerateReq
from runtime.wire.worker_channel import GrammarCompiled
from runtime.worker.worker import Worker

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SLOW = r"[A-Za-z ]{1,24}[.]"  # a few hundred ms to compile on SmolLM2's vocabulary


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    cfg = ServerConfig(
        model="smollm2",
        device=DEVICE,
        kv_slots=2048,
        max_running=8,
        chunk_size=64,
        log_level="warning",
        ipc_dir=str(tmp_path_factory.mktemp("ipc")),
    )
    spec = resolve_model(cfg.model)
    worker = Worker(cfg, spec)
    yield cfg, spec, worker
    worker.grammar.close()


class Loop:
    """The scheduler process's loop, in process: grammar cache updates go to the worker
    before the plans, its compile reports come back from the compile thread."""

    def __init__(self, cfg, spec, worker):
        self.worker = worker
        self.sched = build_scheduler(cfg, worker.ready_message(), spec.max_context)
        self.reports: queue.SimpleQueue = queue.SimpleQueue()
        self.outs: dict[str, list[int]] = {}
        self.reasons: dict[str, str] = {}
        self.bound: dict[str, int] = {}  # regex -> the step that first bound a row to it
        self.reported: dict[str, int] = {}  # regex -> the step its report came after
        self.steps = 0
        self.launched: deque = deque()

    def add(self, rid: str, prompt: list[int], params: SamplingParams, stop_ids: list[int]):
        self.sched.add(GenerateReq(rid, prompt, params, stop_ids))
        self.outs[rid] = []

    def send_update(self) -> None:
        if update := self.sched.take_grammar_update():
            self.worker.grammar.evict(update.evict)
            self.worker.grammar.prepare(update.compile, self.compiled)

    def compiled(self, key: str, error: str | None) -> None:
        """Called on the worker's compile thread, as its sender thread queues the report."""
        self.reports.put(GrammarCompiled(key, 0, error))

    def turn(self) -> None:
        """One loop turn: updates, plans, one result (or, idle, a compile report)."""
        self.send_update()
        while self.sched.can_plan() and (plan := self.sched.plan()) is not None:
            for init in plan.inits:
                if init.params.regex is not None:
                    self.bound.setdefault(init.params.regex, self.steps)
            self.launched.append(self.worker.launch(plan))
        self.send_update()
        if self.launched:
            self.sched.on_result(self.launched.popleft().result())
            self.steps += 1
        else:  # nothing to run: wait for a compile, as the loop's poll does
            self.on_report(self.reports.get(timeout=300))
        while not self.reports.empty():
            self.on_report(self.reports.get())
        for out in self.sched.take_outputs():
            assert out.error is None, out.error
            self.outs[out.rid] += out.token_ids
            if out.finish_reason is not None:
                self.reasons[out.rid] = out.finish_reason

    def on_report(self, report: GrammarCompiled) -> None:
        self.reported.setdefault(report.key.removeprefix("regex:"), self.steps)
        self.sched.on_grammar_compiled(report)

    @property
    def busy(self) -> bool:
        return bool(self.sched.has_work or self.launched or self.sched.grammars.held)


def test_a_new_regex_compiles_while_a_stream_goes_on_and_no_step_waits(smollm2):
    cfg, spec, worker = smollm2
    tokenizer = AutoTokenizer.from_pretrained(spec.tokenizer_path)
    eos = list(spec.eos_token_ids)
    loop = Loop(cfg, spec, worker)
    stream = tokenizer.encode("Here is a long story about a cat named Tom.")
    loop.add("stream", stream, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True), [])
    for _ in range(3):
        loop.turn()
    added = loop.steps
    prompt = tokenizer.encode("Describe the sea in a few words: ")
    # at most 24 letters and a period: 25 tokens and EOS always complete the match
    loop.add("regex", prompt, SamplingParams(max_tokens=26, temperature=0.0, regex=SLOW), eos)
    while loop.busy:
        loop.turn()
    assert worker.grammar.compile_waits == 0  # no step ever waited for the compile
    # the stream went on while the regex compiled (its report came after at least one
    # more step), and the constrained row was bound only after the report
    assert loop.reported[SLOW] > added and loop.bound[SLOW] >= loop.reported[SLOW]
    assert len(loop.outs["stream"]) == 16 and loop.reasons["stream"] == "length"
    ids = loop.outs["regex"]
    assert loop.reasons["regex"] == "stop" and ids[-1] in eos
    text = tokenizer.decode(ids[:-1])
    assert re.fullmatch(SLOW, text), text
