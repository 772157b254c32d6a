"""Admission and retraction policy: which prefill chunks join a step, who is retracted first."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from runtime.scheduler.req import Req, ReqStatus

if TYPE_CHECKING:
    from runtime.scheduler.kv_manager import KVManager
    from runtime.scheduler.lora_slots import LoraSlots

RESERVE_CLIP = 4096  # the most future tokens one request reserves KV for


def admission_order(req: Req) -> tuple:
    """Higher priority first, then first come first served."""
    return (-req.params.priority, req.arrival)


def retract_order(req: Req) -> tuple:
    """Lowest priority first; among equals the least progress, then the longest prompt."""
    return (req.params.priority, len(req.output_ids), -len(req.prompt_ids))


def preempt_order(req: Req) -> tuple:
    """Lowest priority first, then the latest arrival: the last admitted under FCFS."""
    return (req.params.priority, -req.arrival)


class PrefillAdder:
    """Chooses prefill chunks under a token budget and a KV reservation for running requests.

    Running requests will still grow; we reserve `new_token_ratio` x the KV their remaining
    max_tokens need (`KVManager.can_admit` turns tokens into the layout's space) so
    admission does not immediately force retraction. The ratio starts conservative, decays
    every step as requests tend to stop early, and resets on a retraction.
    """

    def __init__(
        self, init_ratio: float = 0.7, min_ratio: float = 0.1, decay_steps: int = 600
    ) -> None:
        self.init_ratio = init_ratio
        self.min_ratio = min_ratio
        self.decay = (init_ratio - min_ratio) / decay_steps
        self.ratio = init_ratio

    def on_retract(self) -> None:
        self.ratio = self.init_ratio

    @staticmethod
    def _growth(reqs: list[Req]) -> list[tuple[Req, int]]:
        """What `reqs` may still grow by: an open-ended max_tokens (e.g. "the rest of the
        context") counts as at most RESERVE_CLIP."""
        return [(r, min(r.remaining_tokens, RESERVE_CLIP)) for r in reqs]

    def fill(self, budget: int, *, running: list[Req], waiting: list[Req], max_running: int,
             kv: KVManager, loras: LoraSlots) -> Iterator[tuple[Req, int]]:
        """Yield (request, new tokens) pairs: chunks of the `running` requests still in
        prefill, then `waiting` requests admitted (moved to `running`) while fewer than
        `max_running` run. A waiting request whose LoRA adapter finds no free slot is
        passed over."""
        self.ratio = max(self.min_ratio, self.ratio - self.decay)
        chunked = [r for r in running if r.in_prefill]
        for req in chunked:
            if budget <= 0:
                return
            n = min(budget, req.known_len - req.kv_len, kv.room(req) - 1)
            if n <= 0:
                return
            budget -= n
            yield req, n
        if budget <= 0 or len(running) >= max_running:
            return  # no admission this step: leave the queue unsorted (it may be long)
        waiting.sort(key=admission_order)
        i = 0  # requests before it wait for a LoRA slot
        while budget > 0 and i < len(waiting) and len(running) < max_running:
            req = waiting[i]
            if not loras.acquire(req):  # every slot pinned by other adapters
                i += 1
                continue
            if not kv.admit(req):
                loras.release(req)
                return
            # a prefix hit's replayed tokens are computed in its first step too
            n = min(budget - req.replay, req.known_len - req.kv_len)
            others = [r for r in running if not r.finished]
            if n <= 0 or not kv.can_admit(req, n, self._growth(others + [req]) if others else (),
                                          self.ratio):
                kv.release(req, cache=False)
                loras.release(req)
                req.unadmit()
                return
            waiting.pop(i)
            req.status = ReqStatus.RUNNING
            running.append(req)
            budget -= n + req.replay
            yield req, n
