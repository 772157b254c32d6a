"""The constant text a program starts with, found by running it on placeholders.

Before a batch, `run_batch` prefills this prefix once (`max_tokens=0`), so every program
of the batch finds it in the radix cache instead of all computing it at once (SGLang
precaches the same way). Tracing runs the function with a `Placeholder` for each
argument and a backend that refuses to generate: the text appended before the first
use of an argument's value, `gen`, `select` or read of the state is the prefix. The
function runs once more than asked; side effects it has happen during tracing too.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any

from frontend.backends.base import Backend, OnText
from frontend.interpreter import StreamExecutor
from frontend.ir import Expr
from frontend.state import ProgramState
from runtime.wire.model_info import ModelInfo
from runtime.wire.request_output import RequestOutput


class _StopTrace(Exception):
    """The traced program used something unknown before generation."""


def _stop(*args: Any, **kwargs: Any) -> Any:
    raise _StopTrace


class Placeholder(Expr):
    """Stands for an argument: appending it, or using its value, ends the trace."""

    __str__ = __format__ = __len__ = __iter__ = __getitem__ = __bool__ = _stop
    __int__ = __float__ = __contains__ = __call__ = _stop

    def __getattr__(self, name: str) -> Any:
        raise _StopTrace

    def __repr__(self) -> str:
        return "<argument>"


class _TracingBackend(Backend):
    """Role markers from the real backend; any generation ends the trace."""

    def __init__(self, real: Backend) -> None:
        super().__init__()
        self.real = real

    def generate(self, prompt: str, params: dict[str, Any],
                 on_text: OnText | None = None) -> RequestOutput:
        raise _StopTrace

    def _fetch_model_info(self) -> ModelInfo:
        return self.real.model_info()


def trace_prefix(func: Callable[..., Any], backend: Backend) -> str:
    """The text `func(s, **args)` appends before it depends on its arguments or output."""
    params = list(inspect.signature(func).parameters.values())[1:]
    kwargs = {p.name: Placeholder() for p in params
              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    executor = StreamExecutor(_TracingBackend(backend))
    # any use of a placeholder or of generated output ends the trace
    with contextlib.suppress(Exception):
        func(ProgramState(executor), **kwargs)
    executor.end()
    return executor.text
