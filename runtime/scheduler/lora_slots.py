"""`LoraSlots`: which LoRA adapter each of the worker's `max_loras` device slots holds.

A request with an adapter runs only while its adapter is resident: admission `acquire`s a
slot for it (pinning the slot while the request holds KV) and `release` unpins it when its
KV goes back. An adapter that is not resident takes a slot no one ever used, else the
least recently used slot that no running request pins; the worker is told to load it
(`take_loads`, sent with the next plan, before that plan's forward). When every slot is
pinned by other adapters, the request waits. Slots are unpinned only once no batch in
flight reads them (the scheduler releases KV at that point), and a load is ordered after
every step already sent, so a slot never changes under a step that uses it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from runtime.scheduler.req import Req


class LoraSlots:
    """The device slots of the adapters `names` (none: every request runs the base)."""

    def __init__(self, names: Iterable[str] = (), num_slots: int = 0) -> None:
        self.names = frozenset(names)
        self.holds: list[str | None] = [None] * num_slots  # adapter of each slot
        self.pins = [0] * num_slots  # running requests using each slot
        self.num_pinned = 0  # slots with a pin
        self.last_used = [0] * num_slots  # clock tick of the last acquire or release
        self.slot_of: dict[str, int] = {}  # resident adapter -> its slot
        self._loads: dict[int, str] = {}  # slot -> adapter to load before the next step
        self._clock = itertools.count(1)
        self.num_loads = 0  # adapters loaded so far

    def refusal(self, req: Req) -> str | None:
        """Why `req` cannot run here (an adapter this server does not have), else None."""
        if req.lora is not None and req.lora not in self.names:
            return f"unknown LoRA adapter {req.lora!r}"
        return None

    def acquire(self, req: Req) -> bool:
        """Pin the slot of `req`'s adapter, making it resident if needed (`req.lora_slot`);
        False when every slot is pinned by requests of other adapters. A request without
        an adapter always gets True."""
        if req.lora is None or req.lora_slot is not None:
            return True
        slot = self.slot_of.get(req.lora)
        if slot is None:
            slot = self._victim()
            if slot is None:
                return False
            if (old := self.holds[slot]) is not None:
                del self.slot_of[old]
            self.holds[slot] = req.lora
            self.slot_of[req.lora] = slot
            self._loads[slot] = req.lora
            self.num_loads += 1
        self.num_pinned += self.pins[slot] == 0
        self.pins[slot] += 1
        self.last_used[slot] = next(self._clock)
        req.lora_slot = slot
        return True

    def _victim(self) -> int | None:
        """A free slot, else the least recently used unpinned one, else None (at once:
        a long queue of waiting adapters costs little per step)."""
        if self.num_pinned == len(self.pins):
            return None
        unpinned = [s for s, n in enumerate(self.pins) if n == 0]
        return min(unpinned, key=lambda s: (self.holds[s] is not None, self.last_used[s]))

    def release(self, req: Req) -> None:
        """Unpin `req`'s slot (no-op without one)."""
        if req.lora_slot is None:
            return
        self.pins[req.lora_slot] -= 1
        self.num_pinned -= self.pins[req.lora_slot] == 0
        self.last_used[req.lora_slot] = next(self._clock)
        req.lora_slot = None

    def slots_of(self, reqs: list[Req]) -> list[int]:
        """`BatchPlan.lora_slots` of a step's requests: each one's slot (-1: none), or []
        when none has an adapter."""
        if not self.names:
            return []
        slots = [-1 if r.lora_slot is None else r.lora_slot for r in reqs]
        return slots if max(slots, default=-1) >= 0 else []

    def take_loads(self) -> list[tuple[int, str]]:
        """(slot, adapter) pairs the worker must load before the next step, once each."""
        loads, self._loads = sorted(self._loads.items()), {}
        return loads

    def check_invariants(self, live: Iterable[Req]) -> None:
        """Each slot's pins equal the live requests holding it, and the maps agree."""
        held = [0] * len(self.pins)
        for req in live:
            if req.lora_slot is not None:
                assert self.holds[req.lora_slot] == req.lora, (
                    f"{req.rid} runs adapter {req.lora!r} in slot {req.lora_slot}, which "
                    f"holds {self.holds[req.lora_slot]!r}")
                held[req.lora_slot] += 1
        assert held == self.pins, f"LoRA slot pins {self.pins}, live requests hold {held}"
        assert self.num_pinned == sum(n > 0 for n in held), "LoRA pinned-slot count is off"
        assert self.slot_of == {n: s for s, n in enumerate(self.holds) if n is not None}, (
            "LoRA slot maps disagree")
