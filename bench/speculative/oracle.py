"""`OracleDrafter`: drafts a request's known continuation (benchmarks and tests only).

It replays the output of an earlier greedy run of the same request, so every draft is
accepted and proposing costs nothing: what remains is the verify step's own cost, the
ceiling any proposer can reach.
"""

from __future__ import annotations

from runtime.scheduler.req import Req
from runtime.scheduler.speculative.speculation import Speculation


class OracleDrafter:
    """Drafts `continuation[len(outputs so far):]` for a prompt of `prompt_len` tokens."""

    def __init__(self, prompt_len: int, continuation: list[int]) -> None:
        self.prompt_len, self.continuation = prompt_len, continuation

    def propose(self, tokens: list[int], k: int) -> list[int]:
        done = len(tokens) - self.prompt_len
        return self.continuation[done:done + k]


def oracle_speculation(continuations: dict[str, list[int]], k: int) -> Speculation:
    """Speculation whose drafter for request `rid` replays `continuations[rid]`."""
    def drafter(req: Req) -> OracleDrafter:
        return OracleDrafter(len(req.prompt_ids), continuations.get(req.rid, []))
    return Speculation(k, drafter)
