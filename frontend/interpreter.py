"""`StreamExecutor`: runs one program state's expressions, in order, on its own thread.

`s += expr` only enqueues (as in SGLang), so a program runs ahead until it reads a
variable or the text, and the branches of a `fork` generate concurrently. The executor
renders text and role markers itself and asks the backend for `gen` and `select`;
with `stream=True` every piece of text is also published, as it arrives, to the
listeners of `ProgramState.text_iter`.
"""

from __future__ import annotations

import copy
import queue
import threading
from typing import Any

from frontend.backends.base import Backend
from frontend.ir import Concat, Expr, Gen, Role, Select, Text
from frontend.select import run_select
from runtime.wire.model_info import RoleMarkers

_END = object()  # closes the expression queue and the text stream


class _Fail:
    """Queued by `fail`: the program function itself raised `error`."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class StreamExecutor:
    """The text, variables and chat messages of one program state."""

    def __init__(self, backend: Backend, stream: bool = False) -> None:
        self.backend = backend
        self.stream = stream
        self.text = ""
        self.vars: dict[str, Any] = {}
        self.assigned: set[str] = set()  # variables set by this state (not inherited)
        self.meta: dict[str, dict[str, Any]] = {}
        self.messages: list[dict[str, str]] = []
        self.started_chat = False  # a role block began: later ones take `prefix`
        self._open_role: tuple[str, int] | None = None  # (role, text offset of its content)
        self.error: BaseException | None = None
        self.children: list[StreamExecutor] = []
        self.events: queue.Queue = queue.Queue()  # (var name | None, text) pieces, then _END
        self._queue: queue.Queue = queue.Queue()
        self._ended = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="sl-program")
        self._thread.start()

    # ------------------------------------------------------------ control (caller thread)
    def submit(self, expr: Expr) -> None:
        if self._ended:
            raise RuntimeError("the program has ended: its state takes no more expressions")
        self._queue.put(expr)

    def sync(self) -> None:
        """Wait until every submitted expression ran; raise the first error."""
        self._queue.join()
        if self.error is not None:
            raise self.error

    def fail(self, error: BaseException) -> None:
        """Record the program function's own error, in order with what it appended."""
        self._queue.put(_Fail(error))

    def end(self) -> None:
        """Finish: run what is queued, close the stream, stop the thread (and the forks')."""
        if not self._ended:
            self._ended = True
            self._queue.put(_END)
            self._thread.join()
        for child in self.children:
            child.end()

    def fork(self, n: int) -> list[StreamExecutor]:
        """`n` copies of the state as it is now (after everything submitted so far).

        The text so far is prefilled first (`max_tokens=0`), so the branches, which
        start at once, all find it in the radix cache instead of each computing it.
        """
        self.sync()
        if n > 1 and self.text:
            self.backend.generate(self.text, {"max_tokens": 0})
        forks = []
        for _ in range(n):
            child = StreamExecutor(self.backend)
            child.text, child.started_chat = self.text, self.started_chat
            child.vars, child.meta = dict(self.vars), copy.deepcopy(self.meta)
            child.messages = copy.deepcopy(self.messages)
            forks.append(child)
        self.children += forks
        return forks

    # ------------------------------------------------------------ execution (own thread)
    def _run(self) -> None:
        while True:
            expr = self._queue.get()
            try:
                if expr is _END:
                    self.events.put(_END)
                    return
                if isinstance(expr, _Fail):
                    self.error = self.error or expr.error
                elif self.error is None:  # after an error, the rest is skipped
                    self._execute(expr)
            except BaseException as e:  # surfaced by sync() / the stream
                self.error = e
            finally:
                self._queue.task_done()

    def _execute(self, expr: Expr) -> None:
        if isinstance(expr, Text):
            self._append(expr.text)
        elif isinstance(expr, Concat):
            for part in expr.parts:
                self._execute(part)
        elif isinstance(expr, Role):
            self._begin_role(expr.role)
            self._execute(expr.content)
            self._end_role()
        elif isinstance(expr, Gen):
            self._gen(expr)
        elif isinstance(expr, Select):
            self._select(expr)
        else:
            raise TypeError(f"cannot execute {expr!r}")

    def _append(self, text: str, name: str | None = None) -> None:
        self.text += text
        if self.stream and text:
            self.events.put((name, text))

    def _gen(self, expr: Gen) -> None:
        on_text = (lambda t: self._append(t, expr.name)) if self.stream else None
        out = self.backend.generate(self.text, dict(expr.params), on_text)
        if not self.stream:
            self._append(out.text, expr.name)
        if expr.name is not None:
            self.vars[expr.name] = out.text
            self.assigned.add(expr.name)
            self.meta[expr.name] = {
                "finish_reason": out.finish_reason, "prompt_tokens": out.prompt_tokens,
                "completion_tokens": out.completion_tokens, "cached_tokens": out.cached_tokens}

    def _select(self, expr: Select) -> None:
        res = run_select(self.backend, self.text, expr.choices)
        self._append(res.choice, expr.name)
        if expr.name is not None:
            self.vars[expr.name] = res.choice
            self.assigned.add(expr.name)
            self.meta[expr.name] = {"scores": res.scores, "token_logprobs": res.token_logprobs}

    def _markers(self, role: str) -> RoleMarkers:
        roles = self.backend.model_info().chat_roles
        if role not in roles:
            raise ValueError(f"the model has no chat template for role {role!r}")
        return roles[role]

    def _begin_role(self, role: str) -> None:
        if self._open_role is not None:
            raise ValueError(f"a {role} block cannot start inside a {self._open_role[0]} block")
        m = self._markers(role)
        self._append(m.prefix if self.started_chat else m.first_prefix)
        self.started_chat = True
        self._open_role = (role, len(self.text))

    def _end_role(self) -> None:
        role, start = self._open_role
        self.messages.append({"role": role, "content": self.text[start:]})
        self._open_role = None
        self._append(self._markers(role).suffix)
