"""`ProgramState`: the `s` of a program: append with `+=`, read text, variables, messages.

Appending never waits (the state's executor runs expressions in order on its own
thread); reading (`s["name"]`, `s.text()`, `s.messages()`) waits for what was appended.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

from frontend.interpreter import _END, StreamExecutor
from frontend.ir import Expr, as_expr


class ProgramState:
    """One program's state over its executor."""

    def __init__(self, executor: StreamExecutor) -> None:
        self._ex = executor

    def __iadd__(self, expr: Expr | str) -> ProgramState:
        self._ex.submit(as_expr(expr))
        return self

    def __getitem__(self, name: str) -> Any:
        """A variable set by `gen` / `select` (a list of the branches' values after a join)."""
        self._ex.sync()
        return self._ex.vars[name]

    def text(self) -> str:
        """Everything appended so far: prompts, role markers and generated text."""
        self._ex.sync()
        return self._ex.text

    def messages(self) -> list[dict[str, str]]:
        """The role blocks so far, as chat messages ({"role", "content"})."""
        self._ex.sync()
        return [dict(m) for m in self._ex.messages]

    def get_meta_info(self, name: str) -> dict[str, Any]:
        """About variable `name`: a gen's finish reason and token counts (cached_tokens:
        prompt tokens served by the prefix cache), or a select's per-choice scores."""
        self._ex.sync()
        return self._ex.meta[name]

    def sync(self) -> ProgramState:
        """Wait for everything appended so far; raise the program's error, if any."""
        self._ex.sync()
        return self

    def fork(self, n: int) -> ForkGroup:
        """`n` branches that start from the text so far (its KV shared through the prefix
        cache) and run concurrently; read them, or `join` them back into this state."""
        return ForkGroup(self, [ProgramState(ex) for ex in self._ex.fork(n)])

    # ------------------------------------------------------------ streaming
    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """The text as it is produced (of one variable if `var_name`), until the program
        ends; joined, it is the final `text()`. A state run without `stream=True` yields
        its whole text (or variable) at once."""
        if not self._ex.stream:
            yield self.text() if var_name is None else self[var_name]
            return
        while (item := self._ex.events.get()) is not _END:
            name, text = item
            if var_name is None or name == var_name:
                yield text
        self._ex.events.put(_END)  # later iterators end at once
        self.sync()

    async def text_async_iter(self, var_name: str | None = None) -> AsyncIterator[str]:
        """`text_iter` for asyncio: awaits each piece without blocking the loop."""
        loop = asyncio.get_running_loop()
        it = self.text_iter(var_name)
        while (piece := await loop.run_in_executor(None, next, it, _END)) is not _END:
            yield piece

    def _end(self) -> None:
        self._ex.end()

    def __repr__(self) -> str:
        return f"ProgramState({self._ex.text!r})"


class ForkGroup(list):
    """The branches of `ProgramState.fork`; `join` folds them back into the parent."""

    def __init__(self, parent: ProgramState, branches: list[ProgramState]) -> None:
        super().__init__(branches)
        self._parent = parent
        self._base = len(parent._ex.text)  # the text the branches started from

    def join(self, mode: str = "gather_variable") -> None:
        """Wait for every branch. "gather_variable": each variable a branch set becomes,
        in the parent, the list of the branches' values. "concate_and_append": the text
        each branch added is appended to the parent, branch after branch."""
        parent = self._parent._ex
        parent.sync()
        for branch in self:
            branch.sync()
        if mode == "gather_variable":
            for name in set().union(*(b._ex.assigned for b in self)):
                parent.vars[name] = [b._ex.vars.get(name) for b in self]
                parent.assigned.add(name)
        elif mode == "concate_and_append":
            parent.submit(as_expr("".join(b._ex.text[self._base:] for b in self)))
            parent.sync()
        else:
            raise ValueError(f"unknown join mode {mode!r}")
        for branch in self:
            branch._end()
