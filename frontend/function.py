"""`@function`: a program over a state `s`; `run`, `run(stream=True)` and `run_batch`."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from tqdm import tqdm

from frontend.backends.base import Backend
from frontend.interpreter import StreamExecutor
from frontend.state import ProgramState
from frontend.tracing import trace_prefix

_default_backend: Backend | None = None


def set_default_backend(backend: Backend) -> None:
    """The backend programs run against when `run` / `run_batch` are given none."""
    global _default_backend
    _default_backend = backend


def _backend(backend: Backend | None) -> Backend:
    backend = backend if backend is not None else _default_backend
    if backend is None:
        raise RuntimeError("no backend: pass backend=... or call set_default_backend()")
    return backend


class BatchResult(list):
    """The states of a `run_batch`, in order, and the server's prefix-cache hit rate over
    the batch (from its counters before and after; other clients' requests count too)."""

    def __init__(self, states: list[ProgramState], before: tuple[int, int] | None,
                 after: tuple[int, int] | None) -> None:
        super().__init__(states)
        self.prefix_hit_tokens = self.prefix_query_tokens = None
        if before is not None and after is not None:
            self.prefix_hit_tokens = after[0] - before[0]
            self.prefix_query_tokens = after[1] - before[1]

    @property
    def prefix_hit_rate(self) -> float | None:
        """Prompt tokens served by the prefix cache / prompt tokens looked up."""
        if not self.prefix_query_tokens:
            return None
        return self.prefix_hit_tokens / self.prefix_query_tokens


class SlFunction:
    """A program: `func(s, *args, **kwargs)` appends to its state `s`."""

    def __init__(self, func: Callable[..., Any]) -> None:
        functools.update_wrapper(self, func)
        self.func = func

    def run(self, *args: Any, backend: Backend | None = None, stream: bool = False,
            **kwargs: Any) -> ProgramState:
        """Run the program to the end and return its state; raises the program's error.

        With `stream=True` it returns at once, the program running on a thread; read the
        text as it comes with `state.text_iter()` (or `text_async_iter()`).
        """
        executor = StreamExecutor(_backend(backend), stream=stream)
        state = ProgramState(executor)
        if not stream:
            try:
                self.func(state, *args, **kwargs)
            finally:
                executor.end()
            return state.sync()

        def body() -> None:
            try:
                self.func(state, *args, **kwargs)
            except BaseException as e:
                executor.fail(e)
            finally:
                executor.end()

        threading.Thread(target=body, daemon=True, name="sl-program-body").start()
        return state

    def run_batch(self, batch_kwargs: list[dict[str, Any]], *, backend: Backend | None = None,
                  num_threads: int | None = None, progress_bar: bool = False,
                  precache: bool = True) -> BatchResult:
        """Run the program once per kwargs dict, concurrently on `num_threads` threads
        (default: all at once, up to 64); returns the states in order.

        With `precache`, the constant prefix of the program (see `tracing`) is prefilled
        once first, so the batch finds it in the radix cache.
        """
        backend = _backend(backend)
        before = backend.cache_stats()
        if precache and len(batch_kwargs) > 1:
            prefix = trace_prefix(self.func, backend)
            if prefix:
                backend.generate(prefix, {"max_tokens": 0})
        threads = num_threads or max(1, min(len(batch_kwargs), 64))
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sl-batch") as pool:
            futures = [pool.submit(self.run, backend=backend, **kw) for kw in batch_kwargs]
            with tqdm(total=len(futures), disable=not progress_bar) as bar:
                for _ in as_completed(futures):
                    bar.update(1)
            states = [f.result() for f in futures]
        result = BatchResult(states, before, backend.cache_stats())
        if progress_bar and result.prefix_hit_rate is not None:
            tqdm.write(f"prefix cache hit rate: {result.prefix_hit_rate:.1%}")
        return result

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramState:
        return self.run(*args, **kwargs)


def function(func: Callable[..., Any]) -> SlFunction:
    """Decorate `def prog(s, ...)` into a program with `run` and `run_batch`."""
    return SlFunction(func)
