"""`EngineState`: what the api's request front knows of the engine, through its
`SchedulerLink`: the scheduler's `Limits` (once sent) and what follows from them, whether
the engine died or the front refuses new requests (draining), and the scheduler's stats
and cache flushes. `TokenizerManager` builds on it.
"""

from __future__ import annotations

from collections.abc import Callable

from runtime.api.scheduler_link import SchedulerLink
from runtime.config.server import ServerConfig
from runtime.wire.api_input import BatchOut, CacheFlushed, Limits, SchedulerStats
from runtime.wire.errors import EngineDeadError
from runtime.wire.scheduler_input import FlushCache, GetStats


class EngineState:
    """Build it anywhere, then `await start()` on the loop that will run it; every other
    method must be called on that loop. `on_batch` gets each `BatchOut`, `on_death` the
    error every request in flight must now fail with."""

    def __init__(self, cfg: ServerConfig, on_batch: Callable[[BatchOut], None],
                 on_death: Callable[[EngineDeadError], None]) -> None:
        self.cfg = cfg
        self._refusing: EngineDeadError | None = None  # draining: no new requests
        self._link = SchedulerLink(cfg, on_batch, on_death)

    async def start(self) -> None:
        """Connect to the scheduler and start receiving from it."""
        await self._link.start()

    @property
    def limits(self) -> Limits | None:
        """The scheduler's limits, after every cap (see `Limits`); None until they came."""
        return self._link.limits

    async def wait_limits(self, timeout: float | None = None) -> Limits:
        """Wait for the scheduler's `Limits` (sent once at its start-up); raise
        `EngineDeadError` if the engine dies first, `TimeoutError` after `timeout` s."""
        if self.limits is None:
            await self._link.wait_limits(timeout)
            self._check_alive()
            if self.limits is None:
                raise TimeoutError(f"the scheduler sent no limits within {timeout} s")
        return self.limits

    @property
    def context_len(self) -> int:
        """The longest prompt + output a request may have (`Limits.max_context`)."""
        return self._known_limits().max_context

    @property
    def max_request_bytes(self) -> int:
        """The largest HTTP body or RPC message a request may take (from the context)."""
        return self.cfg.request_bytes_limit(self._known_limits().max_context)

    @property
    def dead(self) -> EngineDeadError | None:
        """The error every request now fails with, once the engine died or was closed."""
        return self._link.dead

    async def wait_dead(self) -> EngineDeadError:
        """Wait until the engine dies (or `close` is called); return why."""
        return await self._link.wait_dead()

    async def scheduler_stats(self) -> SchedulerStats:
        """Ask the scheduler for a snapshot of its queues and KV pool."""
        self._check_alive()
        return await self._link.ask(GetStats)

    async def flush_cache(self) -> CacheFlushed:
        """Have the scheduler drop every cached prefix (refused while requests run)."""
        self._check_alive()
        return await self._link.ask(FlushCache)

    def _check_alive(self) -> None:
        if self.dead is not None:
            raise self.dead
        if self._refusing is not None:
            raise self._refusing
        if not self._link.started:
            raise RuntimeError("TokenizerManager.start() was not awaited")

    def _known_limits(self) -> Limits:
        if self.limits is None:
            raise RuntimeError("the scheduler has not sent its limits yet (see wait_limits)")
        return self.limits
