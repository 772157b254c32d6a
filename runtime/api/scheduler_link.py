"""`SchedulerLink`: the api's two channels with the scheduler, and what they carry beside
the requests' outputs: the scheduler's `Limits`, its replies to stats and flush requests,
and whether the engine is alive.

It runs on the tokenizer manager's loop: one receive task reads the `api_in` channel,
hands each `BatchOut` to `on_batch` and ends everything when a process dies
(`ProcessDied`) or the socket fails.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import msgspec
import zmq.asyncio

from runtime.api.aio_queue import AsyncPullQueue, AsyncPushQueue
from runtime.config.server import ServerConfig
from runtime.wire.api_input import ApiInput, BatchOut, CacheFlushed, Limits, SchedulerStats
from runtime.wire.errors import EngineDeadError
from runtime.wire.lifecycle import ProcessDied, Shutdown
from runtime.wire.scheduler_input import FlushCache, GetStats, SchedulerInput

log = logging.getLogger(__name__)


class SchedulerLink:
    """`start` it on the loop that will run it; every other method runs on that loop.
    `on_death` gets the error every request in flight must now fail with."""

    def __init__(self, cfg: ServerConfig, on_batch: Callable[[BatchOut], None],
                 on_death: Callable[[EngineDeadError], None]) -> None:
        self.cfg = cfg
        self._on_batch = on_batch
        self._on_death = on_death
        self.limits: Limits | None = None  # the scheduler's, after every cap (see Limits)
        self._limits_event = asyncio.Event()
        self.dead: EngineDeadError | None = None
        self._dead_event = asyncio.Event()
        self._ctx: zmq.asyncio.Context | None = None
        self._sched: AsyncPushQueue[SchedulerInput] | None = None
        self._api_in: AsyncPullQueue[ApiInput] | None = None
        self._recv_task: asyncio.Task | None = None
        self._waiters: dict[int, asyncio.Future] = {}  # scheduler replies, by token
        self._token = 0

    @property
    def started(self) -> bool:
        return self._recv_task is not None

    async def start(self) -> None:
        """Connect to the scheduler (`sched_in`), bind `api_in`, start the receive loop."""
        self._ctx = zmq.asyncio.Context()
        self._sched = AsyncPushQueue(self._ctx, self.cfg.ipc("sched_in"))
        self._api_in = AsyncPullQueue(self._ctx, self.cfg.ipc("api_in"), ApiInput)
        self._recv_task = asyncio.create_task(self._recv_loop(), name="tm-recv")

    def put(self, msg: SchedulerInput) -> None:
        self._sched.put(msg)

    async def wait_limits(self, timeout: float | None) -> None:
        """Return once the scheduler's `Limits` arrived, the engine died or `timeout` s
        passed."""
        dead = asyncio.ensure_future(self._dead_event.wait())
        got = asyncio.ensure_future(self._limits_event.wait())
        try:
            await asyncio.wait({dead, got}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            dead.cancel()
            got.cancel()

    async def wait_dead(self) -> EngineDeadError:
        """Wait until the engine dies (or the link is closed); return why."""
        await self._dead_event.wait()
        assert self.dead is not None
        return self.dead

    async def ask(self, request: type[GetStats | FlushCache]) -> SchedulerStats | CacheFlushed:
        """Send the scheduler `request(token)`; return its reply carrying that token."""
        self._token += 1
        token = self._token
        fut = asyncio.get_running_loop().create_future()
        self._waiters[token] = fut
        try:
            self.put(request(token))
            return await fut
        finally:
            self._waiters.pop(token, None)

    def die(self, reason: str, *, quiet: bool = False) -> None:
        """The engine is gone (a process died, or the server is closing): fail the replies
        awaited and, through `on_death`, the requests in flight."""
        if self.dead is not None:
            return
        if not quiet:
            log.error("engine dead: %s; failing the requests in flight", reason)
        self.dead = EngineDeadError(reason)
        self._dead_event.set()
        self._on_death(self.dead)
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(self.dead)

    async def close(self, *, shutdown_scheduler: bool = False) -> None:
        """Fail what is in flight, stop the receive loop, close the sockets; with
        `shutdown_scheduler`, first send `Shutdown` (an offline engine that owns the
        scheduler; under the launcher the supervisor stops the processes)."""
        if self._recv_task is None:
            return
        if shutdown_scheduler and self.dead is None:
            self.put(Shutdown())
        self.die("the tokenizer manager was closed", quiet=True)
        self._recv_task.cancel()
        await asyncio.gather(self._recv_task, return_exceptions=True)
        self._recv_task = None
        self._sched.close(linger_ms=1000 if shutdown_scheduler else 0)
        self._api_in.close()
        self._ctx.term()

    async def _recv_loop(self) -> None:
        while True:
            try:
                msg = await self._api_in.get()
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                log.error("dropping a malformed message on api_in: %s", e)
                continue
            except Exception as e:  # the socket itself failed: nothing more will arrive
                self.die(f"the api receive loop failed: {e!r}")
                return
            if isinstance(msg, ProcessDied):
                code = "" if msg.exitcode is None else f" (exit code {msg.exitcode})"
                self.die(f"the {msg.name} process died{code}")
                return
            if isinstance(msg, BatchOut):
                self._on_batch(msg)
            elif isinstance(msg, Limits):
                self.limits = msg
                self._limits_event.set()
            elif isinstance(msg, (SchedulerStats, CacheFlushed)):
                fut = self._waiters.get(msg.token)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
