"""The expressions a program appends to its state: text, role blocks, `gen` and `select`.

`s += expr` hands an expression to the state's executor (`interpreter.py`), which renders
text and role markers itself and asks the backend for `Gen` and `Select`. Expressions
concatenate with `+`, so `sl.user("Q: " + question)` and `sl.assistant(sl.gen("a"))` nest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "user", "assistant")


class Expr:
    """Something a program appends to its state; `a + b` appends both in order."""

    def __add__(self, other: Expr | str) -> Concat:
        return Concat((self, as_expr(other)))

    def __radd__(self, other: Expr | str) -> Concat:
        return Concat((as_expr(other), self))


@dataclass(frozen=True, eq=False)
class Text(Expr):
    text: str


@dataclass(frozen=True, eq=False)
class Concat(Expr):
    parts: tuple[Expr, ...]


@dataclass(frozen=True, eq=False)
class Role(Expr):
    """A chat message: the role's prefix, `content`, the role's suffix (chat template)."""

    role: str
    content: Expr


@dataclass(frozen=True, eq=False)
class Gen(Expr):
    """Generate text from everything before it; stored under `name` if given.

    `params` are `SamplingParams` fields (max_tokens, stop, temperature, top_p, regex, ...).
    """

    name: str | None
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class Select(Expr):
    """Append the choice with the highest mean token logprob; stored under `name`."""

    name: str | None
    choices: tuple[str, ...]


def as_expr(x: Expr | str) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, str):
        return Text(x)
    raise TypeError(f"a program appends strings or expressions, not {type(x).__name__}")


def gen(name: str | None = None, max_tokens: int | None = None,
        stop: str | list[str] | None = None, temperature: float | None = None,
        top_p: float | None = None, top_k: int | None = None, regex: str | None = None,
        choices: list[str] | None = None, **params: Any) -> Gen | Select:
    """Generate text (`regex` constrains it to a full match), or pick one of `choices`.

    Unset parameters take the server's defaults; `params` passes any other
    `SamplingParams` field (seed, min_p, frequency_penalty, stop_token_ids, logit_bias
    ({token id: bias}), allowed_token_ids, ...).
    """
    if choices is not None:
        if regex is not None:
            raise ValueError("gen takes either `choices` or `regex`, not both")
        return select(name, choices)
    given = dict(max_tokens=max_tokens, stop=stop, temperature=temperature, top_p=top_p,
                 top_k=top_k, regex=regex)
    params.update({k: v for k, v in given.items() if v is not None})
    if isinstance(params.get("stop"), str):
        params["stop"] = [params["stop"]]
    return Gen(name, params)


def select(name: str | None = None, choices: list[str] | tuple[str, ...] = ()) -> Select:
    """Pick the choice the model finds most likely: the highest mean logprob of the
    choice's tokens after the text so far (SGLang's normalized score)."""
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError("select needs a non-empty list of non-empty strings")
    return Select(name, tuple(choices))


def _role(role: str):
    def block(content: Expr | str = "") -> Role:
        return Role(role, as_expr(content))

    block.__name__ = role
    block.__doc__ = (f"A {role} message around `content`, with the model's chat template.")
    return block


system = _role("system")
user = _role("user")
assistant = _role("assistant")
