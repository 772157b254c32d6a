"""`Speculation`: the scheduler's side of speculative decoding.

A request whose sampling allows it gets a drafter at admission. When the request has no
step in flight (its whole sequence is known), the scheduler asks the drafter for up to k
tokens and plans a verify step: the last token and the drafts as k + 1 new positions,
sampled at every one of them. The worker samples the target at each position exactly as
plain decoding would (same logits processing, same per-position seeded noise), and the
scheduler keeps the target's samples up to and including the first one that differs from
the draft (`accepted_prefix`): greedy rows get the very tokens plain decoding gives, and
sampled rows the target's distribution, since each kept token is a target sample given a
context of kept tokens (for a fixed draft this is rejection sampling with a one-hot draft
distribution: accept with p(draft), else a sample of p without the draft). The slots of
the positions after the kept ones go back to the pool when the result arrives.

With a drafter on the host (n-gram without overlap) a verify step is planned only once
the request's previous step has returned: the drafts come from the whole sequence. With
a drafter on the device and overlap (`chains`) the next verify step is planned while the
previous one runs, as if that one kept all its d drafts (`BatchPlan.chain_back`): the
worker moves it back by the drafts rejected, which only it knows yet, and the scheduler
learns where the step began when the previous result arrives (`Req.verifies`), gives back
the slots the worst case took beyond it, and keeps the request's counts within
`max_tokens` by drafting at most what remains after the d + 1 tokens in flight. Requests without a
drafter keep the overlapped decode path. A request whose drafts keep failing loses its
drafter (`off_window`, `off_accept`) and goes back to that path for good.

With a draft model, an EAGLE head or n-gram lookup with overlap (`NgramOnDevice`) the
worker writes the drafts in the verify step itself (`ModelDrafts`): the scheduler plans k
placeholder positions and learns the drafts with the step's result (so every request that
speculates verifies k drafts, found or not, and the off rule below ends it for a request
whose lookups keep failing). The draft model's KV of a verify step's last draft is written
only if the request's next step needs it, when every draft was accepted: the request then
owes it (`Req.draft_kv_owed`) to its next step, and a request that ends owing it keeps that
position out of the prefix cache (`Scheduler`); a step chained behind it always feeds
that position's token, known on the device, so nothing is owed then. An EAGLE head writes
its entries of a step's positions after the target's forward of that step, so it never
owes one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from runtime.config.speculative import worker_drafts
from runtime.scheduler.kv_manager import KVManager
from runtime.scheduler.req import Req
from runtime.scheduler.speculative.ngram import NgramDrafter
from runtime.wire.sampling import SamplingParams

if TYPE_CHECKING:
    from runtime.config.server import ServerConfig


class Drafter(Protocol):
    """Proposes draft tokens for one sequence."""

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to `k` tokens likely to follow `tokens` (the sequence so far)."""


def speculable(params: SamplingParams) -> bool:
    """Whether a request's sampling lets a verify step sample several positions at once:
    penalties count the previous outputs and a grammar advances token by token, both
    within the step, and top alternatives are reported per plain step."""
    return not params.uses_penalties and params.grammar is None and params.top_logprobs == 0


def accepted_prefix(drafts: Sequence[int], samples: Sequence[int]) -> int:
    """How many leading drafts the target's samples confirm (`samples[i]` is the
    target's token after drafts[:i]); the step yields that many plus one tokens."""
    m = 0
    for d, s in zip(drafts, samples):
        if d != s:
            break
        m += 1
    return m


class ModelDrafts:
    """The drafter of a model or an n-gram lookup in the worker: k placeholder
    positions, whose tokens the worker writes in the verify step and returns with its
    result."""

    def propose(self, tokens: list[int], k: int) -> list[int]:
        return [0] * k


class Speculation:
    """Drafters for the requests that can speculate, and how many tokens they draft.

    A request stops speculating once its last `off_window` drafting steps (verify steps,
    and steps its drafter had nothing for) kept fewer than `off_accept` drafts on
    average; `off_window` 0: never."""

    def __init__(self, num_draft_tokens: int, new_drafter: Callable[[Req], Drafter | None],
                 off_window: int = 0, off_accept: float = 0.0,
                 draft_model: bool = False) -> None:
        self.num_draft_tokens = num_draft_tokens
        self.draft_model = draft_model  # the worker's draft model drafts (`ModelDrafts`)
        self.new_drafter = new_drafter
        self.off_window, self.off_accept = off_window, off_accept
        self.drafted = 0  # draft tokens verified so far
        self.accepted = 0  # of which the target kept
        self.verify_steps = 0
        self.turned_off = 0  # requests that stopped speculating
        # verify steps are planned behind the request's verify step in flight (a drafter on
        # the device, with overlap; set by the scheduler's builder)
        self.chains = False

    @classmethod
    def from_config(cls, cfg: ServerConfig) -> Speculation | None:
        """The speculation `cfg.speculative_algorithm` asks for (None: none)."""
        algo = cfg.speculative_algorithm
        if worker_drafts(algo, cfg.kv_mode.overlap):
            drafts = ModelDrafts()
            new_drafter = lambda req: drafts  # noqa: E731
        elif algo == "ngram":
            lo, hi = cfg.speculative_ngram_min, cfg.speculative_ngram_max
            new_drafter = lambda req: NgramDrafter(lo, hi)  # noqa: E731
        else:
            return None
        return cls(cfg.speculative_num_draft_tokens, new_drafter,
                   cfg.speculative_off_window, cfg.speculative_off_accept,
                   draft_model=algo == "draft")

    def attach(self, req: Req) -> None:
        """Give a new request its drafter, if its sampling allows speculation."""
        req.drafter = self.new_drafter(req) if speculable(req.params) else None
        req.recent_accepts = deque(maxlen=self.off_window)

    def drafts(self, req: Req) -> list[int]:
        """Draft tokens for a decoding request: at most k, and at most one fewer than the
        outputs it may still produce (a verify step yields one more) once a verify step in
        flight yielded all it may (its drafts beyond the one token `pending` counts)."""
        in_flight = len(req.verifies[-1][1]) if req.verifies else 0
        k = min(self.num_draft_tokens, req.remaining_tokens - 1 - in_flight)
        if k <= 0:
            return []
        drafts = req.drafter.propose(req.token_ids, k)
        if not drafts:
            self._observe(req, 0)
        return drafts

    def _observe(self, req: Req, accepted: int) -> None:
        """Count a drafting step of `req` that kept `accepted` drafts; turn its
        speculation off when its recent steps kept too few."""
        if not self.off_window or req.drafter is None:  # (off already: a chained step)
            return
        recent = req.recent_accepts
        recent.append(accepted)
        if len(recent) == self.off_window and sum(recent) < self.off_accept * self.off_window:
            req.drafter = None
            self.turned_off += 1

    def record(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self.verify_steps += 1

    @property
    def mean_accept_length(self) -> float:
        """Tokens per verify step (accepted drafts + the target's own), 0 before any."""
        return (self.accepted / self.verify_steps + 1) if self.verify_steps else 0.0

    def take_verifies(self, decode: list[Req], kv: KVManager) -> list[tuple[Req, list[int]]]:
        """Take the requests of `decode` that get drafts out of it, as (request, drafts),
        when the pool has room for every draft beside the decodes (else none: they
        decode token by token this step, but for those behind a verify step in flight,
        which leave `decode`: such a request moves on by verify steps alone)."""
        verify = [(r, d) for r in decode if r.drafter is not None and (d := self.drafts(r))]
        if verify and not kv.can_decode(decode,
                                        sum(len(d) + kv.page_size for _, d in verify)):
            verify = []
        chosen = {id(r) for r, _ in verify}
        decode[:] = [r for r in decode if id(r) not in chosen and not r.verifies]
        return verify

    def settle(self, req: Req, samples: list[int], logprobs: list[float],
               kv: KVManager, drafts: list[int] | None = None) -> None:
        """Apply the result of `req`'s oldest verify step in flight: keep the target's
        samples up to the first that differs from its draft (`drafts`: the drafts the
        worker wrote, else those planned; fewer when one ends the request), and give back
        the slots past the kept tokens' inputs, or, with a step chained behind it, past
        that step's positions, which move back by the drafts rejected here."""
        start, planned = req.verifies.popleft()  # the step's first position: the last token's
        drafts = drafts or planned
        if req.finished:  # ended while the step ran: its sequence stops where it was
            req.pending -= 1
            if req.kv_len > start + 1:  # (a chained step behind an ended one: already cut)
                kv.truncate(req, start + 1)
            return
        m = accepted_prefix(drafts, samples)
        kept = req.append_outputs(samples[:m + 1], logprobs[:m + 1])
        self.record(len(drafts), m)
        self._observe(req, m)
        if req.verifies:  # the next step starts at start + m + 1, not start + len + 1
            moved = len(drafts) - m
            req.verifies[0][0] -= moved
            kv.truncate(req, start + kept if req.finished else req.kv_len - moved)
            return
        kv.truncate(req, start + kept)
        # the draft model's steps wrote the draft KV of every kept position but the last
        # draft's
        req.draft_kv_owed = self.draft_model and kept == len(drafts) + 1
