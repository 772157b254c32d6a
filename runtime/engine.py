"""`Engine`: the offline, in-process API over the same scheduler and worker processes.

The api side (`TokenizerManager`) runs on a background event-loop thread in the caller's
process; the scheduler and worker are child processes, exactly as under `sluice serve`.
"""

from __future__ import annotations

import asyncio
import atexit
import weakref
from collections.abc import Iterator, Sequence

from runtime.api.loop_thread import LoopThread
from runtime.api.tokenizer_manager import TokenizerManager
from runtime.config.checks import ConfigError
from runtime.config.server import ServerConfig
from runtime.launch.process_group import ProcessGroup
from runtime.wire.api_input import SchedulerStats
from runtime.wire.errors import InvalidRequest
from runtime.wire.model_info import ModelInfo
from runtime.wire.request_output import RequestOutput
from runtime.wire.sampling import SamplingParams

Prompt = str | list[int]


class Engine:
    """Generate in-process: `Engine(model="smollm2", overlap=False, kv_slots=4096, ...)`.

    Keyword arguments are the server's options, named like the CLI flags.
    """

    def __init__(self, model: str = "smollm2", **options) -> None:
        from runtime.scheduler.loop import run_scheduler
        from runtime.worker.model_check import prepare_model
        from runtime.worker.worker import worker_targets

        self.config = ServerConfig(model=model, **options)
        self.spec = prepare_model(self.config)
        if self.config.dp > 1 or self.config.node_rank > 0:
            raise ConfigError("an Engine is one server on node 0: dp and node_rank are "
                              "options of `sluice serve`")
        self._tm = TokenizerManager(self.config, self.spec)  # raises before any thread starts
        self._loop = LoopThread("sluice-engine")
        self._loop.run(self._tm.start())
        self._group = ProcessGroup(self.config, {**worker_targets(self.config),
                                                 "scheduler": run_scheduler})
        try:
            self._group.start()
            # sent by the scheduler before its Ready: the limits after every cap
            self._loop.run(self._tm.wait_limits(self.config.ready_timeout))
        except BaseException:
            self._group.stop()
            self._loop.run(self._tm.close())
            self._loop.close()
            raise
        self._group.watch()
        self._closed = False
        _running.add(self)

    @property
    def tokenizer(self):
        return self._tm.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 *, text: bool = True) -> list[RequestOutput]:
        """Run every prompt concurrently (one batch stream) and return their whole outputs
        in order.

        `prompts` is a string, a list of token ids, or a list of either; `params` one
        SamplingParams for all of them, or a list with one per prompt (e.g. each its own
        LoRA adapter). `text=False`: token ids only, no detokenization (empty text; stop
        strings are refused).
        """
        batch = [prompts] if _is_single(prompts) else list(prompts)
        params = params if params is not None else SamplingParams()
        each = [params] * len(batch) if isinstance(params, SamplingParams) else list(params)
        if len(each) != len(batch):
            raise InvalidRequest(f"{len(each)} SamplingParams for {len(batch)} prompts")
        return self._loop.run(self._generate_all(batch, each, text))

    async def _generate_all(self, prompts: list[Prompt], params: list[SamplingParams],
                            text: bool) -> list[RequestOutput]:
        return list(await asyncio.gather(*(self._whole(p, q, text)
                                           for p, q in zip(prompts, params))))

    async def _whole(self, prompt: Prompt, params: SamplingParams, text: bool) -> RequestOutput:
        gen = self._tm.generate(prompt, _copy(params), stream=False, text=text)
        return RequestOutput.join([out async for out in gen])

    def stream(self, prompt: Prompt, params: SamplingParams | None = None, *,
               text: bool = True) -> Iterator[RequestOutput]:
        """Yield a request's output as `RequestOutput` deltas as it is produced; breaking
        out aborts the request. `text=False`: token ids only, as in `generate`."""
        params = params if params is not None else SamplingParams()
        return self._loop.iterate(self._tm.generate(prompt, _copy(params), text=text))

    def model_info(self) -> ModelInfo:
        """The model's name, context length and chat role markers."""
        return self._tm.model_info()

    def stats(self) -> SchedulerStats:
        """The scheduler's queues and KV pool right now (allocator invariant checked)."""
        return self._loop.run(self._tm.scheduler_stats(), timeout=30)

    def shutdown(self) -> None:
        """Stop the scheduler and worker processes and the loop thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._loop.run(self._tm.close(shutdown_scheduler=True), timeout=10)
        finally:
            self._group.stop()
            self._loop.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.shutdown()


_running: weakref.WeakSet[Engine] = weakref.WeakSet()


@atexit.register
def _shutdown_running() -> None:
    """At interpreter exit, while the loop threads still run: stop the engines a script
    left running (after this, module teardown is too late to stop them cleanly)."""
    for engine in list(_running):
        engine.shutdown()


def _is_single(prompts) -> bool:
    return isinstance(prompts, str) or (
        isinstance(prompts, list) and bool(prompts) and all(isinstance(t, int) for t in prompts))


def _copy(params: SamplingParams) -> SamplingParams:
    import msgspec

    return msgspec.structs.replace(params)
