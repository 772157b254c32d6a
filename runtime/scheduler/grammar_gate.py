"""`GrammarGate`: a request waits here until every worker holds its grammar compiled.

A grammar (a regex or a JSON schema) is named by its key, `SamplingParams.grammar`.
Binding a row to a grammar the worker has not compiled would make that step wait for the
compile, and with it every other row of the batch. So a request whose grammar is not
ready is held apart from the waiting queue; the gate asks the workers to compile it
(`GrammarCacheUpdate`, to every TP rank) and releases the request to the waiting queue
once every rank has answered `GrammarCompiled`, or fails it with the compiler's message.

The gate also bounds the workers' compiled cache: it mirrors the cache's contents in
LRU order (a use is a request arriving, or coming back after a retraction, with that
grammar) and evicts the least recently used entry when a new grammar needs room. The
workers only ever compile and evict what the gate says, so its view is exact. An entry
still compiling, or needed by a request in the waiting queue, is never evicted, so a
released request stays admissible; when every entry is so pinned, a new grammar waits
for room. A running row keeps its own matcher whatever happens to the cache.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from runtime.scheduler.req import Req
from runtime.wire.worker_channel import GrammarCacheUpdate, GrammarCompiled


@dataclass
class _Entry:
    """One grammar of the workers' cache."""

    compiling: int  # ranks yet to report it; 0: every rank holds it
    error: str | None = None  # the first failure a rank reported


class GrammarGate:
    """Holds requests whose grammar is not compiled yet; the LRU of the workers' cache."""

    def __init__(self, capacity: int = 64, ranks: int = 1) -> None:
        if capacity < 1:
            raise ValueError(f"the grammar cache needs room for one entry, got {capacity}")
        self.capacity = capacity
        self.ranks = ranks
        self.cache: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self.held: list[Req] = []  # in arrival order
        self._compile: list[str] = []  # not sent to the workers yet
        self._evict: list[str] = []

    def admissible(self, req: Req) -> bool:
        """Whether `req` may join the waiting queue now (no grammar, or one every worker
        holds compiled: a use, for the LRU order); if not, the gate holds it."""
        key = req.params.grammar
        if key is None:
            return True
        entry = self.cache.get(key)
        if entry is not None and entry.compiling == 0:
            self.cache.move_to_end(key)
            return True
        self.held.append(req)
        return False

    def release(self, req: Req) -> bool:
        """Let go of a held request (aborted); False if the gate does not hold it."""
        if req not in self.held:
            return False
        self.held.remove(req)
        return True

    def on_compiled(self, msg: GrammarCompiled) -> tuple[list[Req], str | None]:
        """Count one rank's report. Once every rank has reported `msg.key`: the held
        requests it releases and the error that fails them (None: they may run)."""
        entry = self.cache.get(msg.key)
        if entry is None or entry.compiling == 0:
            return [], None  # no compile of ours is waiting for this report
        entry.compiling -= 1
        entry.error = entry.error or msg.error
        if entry.compiling:
            return [], None
        if entry.error is not None:  # let a later request try again
            del self.cache[msg.key]
            self._evict.append(msg.key)
        released = [r for r in self.held if r.params.grammar == msg.key]
        self.held = [r for r in self.held if r.params.grammar != msg.key]
        return released, entry.error

    def take_update(self, waiting: list[Req]) -> GrammarCacheUpdate | None:
        """Start compiling the grammars of held requests not in the cache yet, as far as
        there is room (`waiting` pins the grammars its requests need); the changes the
        workers must make, or None when there are none."""
        missing = dict.fromkeys(
            r.params.grammar for r in self.held if r.params.grammar not in self.cache
        )
        if missing:
            pinned = {r.params.grammar for r in waiting}
            for key in missing:
                if not self._make_room(pinned):
                    break
                self.cache[key] = _Entry(compiling=self.ranks)
                self._compile.append(key)
        if not self._compile and not self._evict:
            return None
        update = GrammarCacheUpdate(compile=self._compile, evict=self._evict)
        self._compile, self._evict = [], []
        return update

    def _make_room(self, pinned: set[str | None]) -> bool:
        """Evict least recently used entries until one more fits; False if none may go."""
        while len(self.cache) >= self.capacity:
            victim = next(
                (
                    key
                    for key, entry in self.cache.items()
                    if entry.compiling == 0 and key not in pinned
                ),
                None,
            )
            if victim is None:
                return False
            del self.cache[victim]
            self._evict.append(victim)
        return True
