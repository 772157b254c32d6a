"""`GrammarRows`: the worker's grammar matchers (regex or JSON schema), one per
constrained row.

Where the mask lives: here, in the worker, because the sampled token must advance a
matcher before the next step's mask exists, and with the overlap scheduler the
scheduler plans step N+1 before it has seen step N's tokens. The worker runs steps in
order, so: `allowed` fills each constrained row's bitmask just before sampling, and
`advance` feeds the sampled tokens to the matchers right after. That needs the sampled
ids on the host: free on the CPU, a device sync on CUDA, paid only by steps that hold
a constrained row (unconstrained steps never sync). When a match is complete and
nothing may follow, the mask allows only the stop tokens (EOS), which ends the request.

A row's matcher is built from its RowInit (on admission and on re-admission after a
retraction, replaying the outputs so far), from a grammar `prepare` compiled ahead: the
scheduler admits a constrained request only once every worker reports its grammar ready
(see `runtime.grammar`), so the step never waits. A row whose grammar was not prepared
(only a caller that skips the scheduler) waits for the compile, counted in
`compile_waits`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import numpy as np
import torch

from runtime.grammar import GrammarCompiler, error_message

log = logging.getLogger(__name__)

NO_TOKENIZER = "grammar constraints need the model's tokenizer"


class _RowMatcher:
    """One row's matcher, built from its compiled grammar and fed `replay` first; None
    when the compile failed (the row may then only stop)."""

    def __init__(self, compiled: Future, replay: list[int]) -> None:
        import xgrammar

        self.matcher = None
        try:
            self.matcher = xgrammar.GrammarMatcher(compiled.result())
        except Exception:
            log.exception("grammar compilation failed; the row may only stop")
        for tok in replay:
            self.accept(tok)

    def accept(self, token: int) -> None:
        m = self.matcher
        if m is None or m.is_terminated():
            return  # a token sampled after the end (discarded by the scheduler)
        if not m.accept_token(token):
            log.error("grammar rejected token %d that its own mask allowed", token)


class GrammarRows:
    """Grammar matchers of the constrained rows; `compiler` is None for models without a
    tokenizer (the api refuses constraints for them)."""

    def __init__(
        self,
        compiler: GrammarCompiler | None,
        vocab_size: int,
        stop_ids: list[int],
        device: torch.device,
    ) -> None:
        self.compiler = compiler
        self.vocab_size = vocab_size
        self.device = device
        self.words = (vocab_size + 31) // 32
        self.rows: dict[int, _RowMatcher] = {}
        self.compile_waits = 0  # rows bound before their grammar was compiled: a stalled step
        stop = np.zeros(self.words, dtype=np.uint32)
        for t in stop_ids:
            stop[t // 32] |= np.uint32(1 << (t % 32))
        self._stop_only = torch.from_numpy(stop.view(np.int32))  # [W] int32 bitmask
        self._shifts = torch.arange(32, dtype=torch.int32, device=device)  # [32]

    def prepare(self, keys: Sequence[str], notify: Callable[[str, str | None], None]) -> None:
        """Start compiling the grammars `keys` (those not held yet) without waiting;
        `notify(key, error)` is called once per key when it is ready (`error` None) or has
        failed, from the compile thread."""
        for key in keys:
            if self.compiler is None:
                notify(key, NO_TOKENIZER)
                continue
            fut = self.compiler.submit(key)
            fut.add_done_callback(functools.partial(_report, key, notify))

    def evict(self, keys: Sequence[str]) -> None:
        """Drop grammars `keys` from the compiled cache; rows bound to them keep their
        matchers."""
        if self.compiler is not None:
            for key in keys:
                self.compiler.evict(key)

    def init_row(self, row: int, key: str | None, output_ids: list[int]) -> None:
        """Bind `row` to a new request: a fresh matcher for grammar `key` (fed
        `output_ids`)."""
        self.rows.pop(row, None)
        if key is None:
            return
        if self.compiler is None:
            raise ValueError(NO_TOKENIZER)
        compiled = self.compiler.submit(key)
        if not compiled.done():
            self.compile_waits += 1
            log.warning("grammar %.80r was not compiled ahead: this step waits for it", key)
        self.rows[row] = _RowMatcher(compiled, list(output_ids))

    def allowed(self, rows: Sequence[int]) -> torch.Tensor | None:
        """Tokens each of `rows` may sample: [S, V] bool on the device, or None when no
        row is constrained (unconstrained rows allow everything)."""
        if not self.rows:
            return None
        constrained = [(i, self.rows[r]) for i, r in enumerate(rows) if r in self.rows]
        if not constrained:
            return None
        bitmask = torch.full((len(rows), self.words), -1, dtype=torch.int32)  # [S, W]
        for i, rm in constrained:
            m = rm.matcher
            if m is None or m.is_terminated():
                bitmask[i] = self._stop_only
            else:
                m.fill_next_token_bitmask(bitmask, i)
        if self.device.type == "cuda":
            bitmask = bitmask.pin_memory().to(self.device, non_blocking=True)
        bits = (bitmask[:, :, None] >> self._shifts) & 1  # [S, W, 32], token 32w+b at (w, b)
        return bits.bool().reshape(len(rows), -1)[:, : self.vocab_size]  # [S, V]

    def advance(self, rows: Sequence[int], ids: torch.Tensor) -> None:
        """Feed the tokens just sampled for `rows` ([S]) to their matchers."""
        if not self.rows or not any(r in self.rows for r in rows):
            return
        host = ids.tolist()  # a device sync on CUDA, only for steps with constrained rows
        for r, tok in zip(rows, host):
            if (rm := self.rows.get(r)) is not None:
                rm.accept(tok)

    def close(self) -> None:
        if self.compiler is not None:
            self.compiler.close()


def _report(key: str, notify: Callable[[str, str | None], None], compiled: Future) -> None:
    if compiled.cancelled():
        return  # the worker is shutting down
    error = compiled.exception()
    if error is None:
        notify(key, None)
    else:
        notify(key, f"grammar compilation failed: {error_message(error)}")
