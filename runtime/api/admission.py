"""Admission at the api: how many sequences one request may run, and when to say 429.

The api holds at most `max_running + max_queue` sequences in flight (the scheduler's
running batch plus its waiting queue). One request (n choices of several prompts) may
take at most `request_cap` of them, so a single client cannot lock every other one out;
a request larger than that can never be admitted and is refused with a 400, not a 429
that invites a retry. A 429 (`Overloaded`) means the server is full right now.
"""

from __future__ import annotations

from runtime.config.server import ServerConfig
from runtime.wire.api_input import Limits
from runtime.wire.errors import InvalidRequest, Overloaded

REQUEST_SHARE = 4  # one request may hold at most 1/REQUEST_SHARE of the capacity


def capacity(limits: Limits, cfg: ServerConfig) -> int:
    """The most sequences in flight at once: running plus waiting."""
    return limits.max_running + cfg.max_queue


def request_cap(limits: Limits, cfg: ServerConfig) -> int:
    """The most sequences one request may run."""
    return max(1, min(cfg.max_request_seqs, capacity(limits, cfg) // REQUEST_SHARE))


def check_admission(inflight: int, seqs: int, limits: Limits, cfg: ServerConfig) -> None:
    """Raise `InvalidRequest` if a request of `seqs` sequences can never be admitted,
    `Overloaded` if it does not fit beside the `inflight` ones now."""
    cap = request_cap(limits, cfg)
    if seqs > cap:
        raise InvalidRequest(
            f"this request runs {seqs} sequences (prompts x n); one request may run at most "
            f"{cap} (max_request_seqs={cfg.max_request_seqs}, and 1/{REQUEST_SHARE} of "
            f"max_running + max_queue = {capacity(limits, cfg)}): split it"
        )
    if inflight + seqs > capacity(limits, cfg):
        raise Overloaded(
            f"{inflight} requests in flight: the queue is full "
            f"(max_running={limits.max_running}, "
            f"max_queue={cfg.max_queue}); retry later"
        )
