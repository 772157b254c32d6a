"""`Admission`: a request's arrival at the scheduler, and the load that caps arrivals.

`add` refuses what could never run (a duplicate id, an empty prompt, a LoRA adapter with
no slot, prompt + max_tokens over the context or the KV pool) with an error output, and
queues the rest: in `waiting`, or held by the grammar gate until its grammar is compiled.
Degraded mode (off while `degrade_waiting == 0`): from `degrade_waiting` requests
waiting, arrivals get max_tokens capped at `degrade_max_tokens`, and the running batch at
`degrade_max_running` (0: not capped); it ends as the queue drains.
"""

from __future__ import annotations

from collections.abc import Callable

from runtime.scheduler.grammar_gate import GrammarGate
from runtime.scheduler.kv_manager import KVManager
from runtime.scheduler.lora_slots import LoraSlots
from runtime.scheduler.req import Req
from runtime.scheduler.speculative.speculation import Speculation
from runtime.wire.scheduler_input import GenerateReq


class Admission:
    """The arrivals and load part of `Scheduler`, over the scheduler's queues."""

    # the scheduler's (`Scheduler.__init__`, `Outbox`)
    kv: KVManager
    waiting: list[Req]
    reqs: dict[str, Req]
    grammars: GrammarGate
    loras: LoraSlots
    spec: Speculation | None
    _emit_error: Callable[[Req, str], None]

    def __init__(self, *, max_running: int, max_context: int, degrade_waiting: int,
                 degrade_max_tokens: int, degrade_max_running: int) -> None:
        self.base_max_running = max_running
        self.max_context = max_context
        self.degrade_waiting = degrade_waiting
        self.degrade_max_tokens = degrade_max_tokens
        self.degrade_max_running = degrade_max_running

    def add(self, msg: GenerateReq) -> None:
        """Queue a new request, or answer it with an error if it could never run."""
        req = Req(msg)
        if msg.rid in self.reqs:
            self._emit_error(req, f"duplicate request id {msg.rid!r}")
            return
        refusal = "empty prompt" if not req.prompt_ids else self.loras.refusal(req)
        if refusal is not None:
            self._emit_error(req, refusal)
            return
        need = len(req.prompt_ids) + req.params.max_tokens
        if need > self.max_context or len(req.prompt_ids) + 1 > self.kv.total:
            self._emit_error(req, f"prompt ({len(req.prompt_ids)}) + max_tokens "
                                  f"({req.params.max_tokens}) exceeds the limit of "
                                  f"{min(self.max_context, self.kv.total)} tokens")
            return
        if self.degraded:
            req.params.max_tokens = min(req.params.max_tokens, self.degrade_max_tokens)
        if self.spec is not None:
            self.spec.attach(req)
        self.reqs[req.rid] = req
        if self.grammars.admissible(req):
            self.waiting.append(req)  # max_tokens == 0 too: prefill only (cache, input logprobs)

    @property
    def num_waiting(self) -> int:
        """Requests waiting for admission, their grammar's compile included."""
        return len(self.waiting) + len(self.grammars.held)

    @property
    def degraded(self) -> bool:
        """Overloaded: requests arriving now get max_tokens capped, the batch size is capped."""
        return 0 < self.degrade_waiting <= self.num_waiting

    @property
    def max_running(self) -> int:
        """The admission limit on running requests (lower while degraded)."""
        if self.degrade_max_running and self.degraded:
            return min(self.base_max_running, self.degrade_max_running)
        return self.base_max_running
