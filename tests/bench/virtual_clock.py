"""An asyncio event loop whose clock moves only when nothing can run.

When no callback is ready and no socket has data, the loop sets its clock to its next
timer instead of sleeping until then. Over unix sockets a write is in the peer's receive
queue when `send` returns, so "no socket has data" is an exact state, not a guess: a fake
server's `asyncio.sleep(0.125)` takes exactly 0.125 s of loop time (and no wall time),
and a client that stamps events with `loop.time()` measures the server's schedule exactly.
`run_virtual(main())` runs a coroutine on such a loop.
"""

from __future__ import annotations

import asyncio
import selectors


class _JumpingSelector(selectors.DefaultSelector):
    """Polls without blocking; where the loop would sleep until a timer, jumps to it."""

    loop: VirtualClockLoop

    def select(self, timeout: float | None = None):
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:  # no timer: only I/O from outside the loop can come
            return super().select(None)
        self.loop.jump_to_next_timer()
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """A selector event loop on a virtual clock that starts at 0.0."""

    def __init__(self) -> None:
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self
        self._now = 0.0

    def time(self) -> float:
        return self._now

    def jump_to_next_timer(self) -> None:
        # the loop pops cancelled timers off the head of its heap before it selects, so
        # the head is the timer it is about to wait for: its time exactly, not now + delay
        if self._scheduled:
            self._now = max(self._now, self._scheduled[0].when())


def run_virtual(coro):
    """Run `coro` to its end on a `VirtualClockLoop`."""
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
