"""`LoopThread`: an asyncio loop in a background thread, driven from synchronous code.

The offline `Engine` runs `TokenizerManager` here: `submit` a coroutine and wait on the
returned future, or turn `tm.generate(...)` into a plain iterator with `iterate`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """A daemon thread running one event loop until `close`."""

    def __init__(self, name: str = "sluice-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `coro` on the loop; thread-safe. Cancelling the future cancels it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result (never call from the loop)."""
        return self.submit(coro).result(timeout)

    def iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        """A blocking iterator over an async generator running on the loop.

        One item is produced per `next()` (so a slow consumer applies backpressure).
        Closing the iterator early (break, `close()`, garbage collection, an exception
        in the consumer such as KeyboardInterrupt) closes the async generator on the
        loop, which runs its cleanup (for `generate`: aborting the request).
        """
        stepper = _Stepper(agen)
        try:
            while True:
                try:
                    item = self.submit(stepper.step()).result()
                except StopAsyncIteration:
                    return
                yield item
        finally:
            if not self.loop.is_closed():
                self.submit(stepper.close()).result()

    def close(self) -> None:
        """Stop the loop (after running what is scheduled) and join the thread."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class _Stepper:
    """Steps an async generator from another thread and can close it mid-step."""

    def __init__(self, agen: AsyncIterator[T]) -> None:
        self.agen = agen
        self._task: asyncio.Task | None = None

    async def step(self) -> T:
        self._task = asyncio.current_task()
        return await self.agen.__anext__()

    async def close(self) -> None:
        """Cancel a step still running (its generator unwinds), then close the generator."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self.agen.aclose()
