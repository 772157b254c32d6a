"""`GrammarGate`: a request waits here until every worker holds its regex compiled.

Binding a row to a regex the worker has not compiled would make that step wait for the
compile, and with it every other row of the batch. So a request whose regex is not
ready is held apart from the waiting queue; the gate asks the workers to compile it
(`RegexCacheUpdate`, to every TP rank) and releases the request to the waiting queue
once every rank has answered `RegexCompiled`, or fails it with the compiler's message.

The gate also bounds the workers' compiled cache: it mirrors the cache's contents in
LRU order (a use is a request arriving, or coming back after a retraction, with that
regex) and evicts the least recently used entry when a new regex needs room. The
workers only ever compile and evict what the gate says, so its view is exact. An entry
still compiling, or needed by a request in the waiting queue, is never evicted, so a
released request stays admissible; when every entry is so pinned, a new regex waits for
room. A running row keeps its own matcher whatever happens to the cache.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from runtime.messages import RegexCacheUpdate, RegexCompiled
from runtime.scheduler.req import Req


@dataclass
class _Entry:
    """One regex of the workers' cache."""

    compiling: int  # ranks yet to report it; 0: every rank holds it
    error: str | None = None  # the first failure a rank reported


class GrammarGate:
    """Holds requests whose regex is not compiled yet; the LRU of the workers' cache."""

    def __init__(self, capacity: int = 64, ranks: int = 1) -> None:
        if capacity < 1:
            raise ValueError(f"the regex cache needs room for one entry, got {capacity}")
        self.capacity = capacity
        self.ranks = ranks
        self.cache: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self.held: list[Req] = []  # in arrival order
        self._compile: list[str] = []  # not sent to the workers yet
        self._evict: list[str] = []

    def admissible(self, req: Req) -> bool:
        """Whether `req` may join the waiting queue now (no regex, or one every worker
        holds compiled: a use, for the LRU order); if not, the gate holds it."""
        regex = req.params.regex
        if regex is None:
            return True
        entry = self.cache.get(regex)
        if entry is not None and entry.compiling == 0:
            self.cache.move_to_end(regex)
            return True
        self.held.append(req)
        return False

    def release(self, req: Req) -> bool:
        """Let go of a held request (aborted); False if the gate does not hold it."""
        if req not in self.held:
            return False
        self.held.remove(req)
        return True

    def on_compiled(self, msg: RegexCompiled) -> tuple[list[Req], str | None]:
        """Count one rank's report. Once every rank has reported `msg.regex`: the held
        requests it releases and the error that fails them (None: they may run)."""
        entry = self.cache.get(msg.regex)
        if entry is None or entry.compiling == 0:
            return [], None  # no compile of ours is waiting for this report
        entry.compiling -= 1
        entry.error = entry.error or msg.error
        if entry.compiling:
            return [], None
        if entry.error is not None:  # let a later request try again
            del self.cache[msg.regex]
            self._evict.append(msg.regex)
        released = [r for r in self.held if r.params.regex == msg.regex]
        self.held = [r for r in self.held if r.params.regex != msg.regex]
        return released, entry.error

    def take_update(self, waiting: list[Req]) -> RegexCacheUpdate | None:
        """Start compiling the regexes of held requests not in the cache yet, as far as
        there is room (`waiting` pins the regexes its requests need); the changes the
        workers must make, or None when there are none."""
        missing = dict.fromkeys(
            r.params.regex for r in self.held if r.params.regex not in self.cache
        )
        if missing:
            pinned = {r.params.regex for r in waiting}
            for regex in missing:
                if not self._make_room(pinned):
                    break
                self.cache[regex] = _Entry(compiling=self.ranks)
                self._compile.append(regex)
        if not self._compile and not self._evict:
            return None
        update = RegexCacheUpdate(compile=self._compile, evict=self._evict)
        self._compile, self._evict = [], []
        return update

    def _make_room(self, pinned: set[str | None]) -> bool:
        """Evict least recently used entries until one more fits; False if none may go."""
        while len(self.cache) >= self.capacity:
            victim = next(
                (
                    regex
                    for regex, entry in self.cache.items()
                    if entry.compiling == 0 and regex not in pinned
                ),
                None,
            )
            if victim is None:
                return False
            del self.cache[victim]
            self._evict.append(victim)
        return True
