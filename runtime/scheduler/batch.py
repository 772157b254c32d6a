"""`Batch`: the scheduler's record of one planned step, and its wire form (`BatchPlan`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from runtime.scheduler.req import Req
from runtime.wire.worker_channel import BatchPlan, RowInit


@dataclass
class Batch:
    """Requests of one step: decodes (one new token each, planned in bulk) first, then
    extends (prefill chunks and other multi-token or special steps) with their lengths."""

    batch_id: int
    decode: list[Req] = field(default_factory=list)
    extend: list[Req] = field(default_factory=list)
    extend_lens: list[int] = field(default_factory=list)
    sampled: list[Req] = field(default_factory=list)
    logprob_reqs: list[Req] = field(default_factory=list)  # per BatchPlan.input_logprobs entry
    prefilled: list[Req] = field(default_factory=list)  # prefill-only requests done this step

    # holds a request whose drafter needs its step's result: nothing may follow in flight
    speculative: bool = False
    num_drafts: int = 0  # draft tokens verified: the step samples len(sampled) + this
    sampled_drafts: list[int] = field(default_factory=list)  # per `sampled`: drafts verified

    def add(self, req: Req, n: int) -> None:
        self.extend.append(req)
        self.extend_lens.append(n)

    def add_verify(self, req: Req, drafts: list[int]) -> None:
        """A verify step for a decoding `req`: its last token and `drafts` as new
        positions, each sampled (see `Speculation`); behind a verify step of the request
        still in flight, planned as if that one kept all its drafts (`chain_back`)."""
        req.drafts = drafts
        self.num_drafts += len(drafts)
        self.add(req, len(drafts) + 1)

    @property
    def reqs(self) -> list[Req]:
        return self.decode + self.extend

    def to_plan(self, decode_pages: np.ndarray, extend_pages: list[np.ndarray]) -> BatchPlan:
        """Advance each request's KV and pending counts and describe the step for the worker.

        The work is proportional to the step's new tokens: a decode contributes its row,
        position and (placeholder) input id; an extend its new tokens and, on admission,
        its row binding and cached prefix pages (and, where the model asks it, the prefix's
        last `Req.replay` tokens again, with the pages they start); any request the ids of
        compressed entries it was handed (`Req.entry_writes`).
        """
        bid = self.batch_id
        rows, prefix_lens, input_ids = [], [], []
        owed = []  # (request index, token) of the draft KV owed (`Req.draft_kv_owed`)
        for req in self.decode:  # decoding: KV for all but the last token, which samples
            row, pos, ids = req.row, req.kv_len, req.token_ids
            if req.draft_kv_owed:
                owed.append((len(rows), ids[pos - 1]))
                req.draft_kv_owed = False
            rows.append(row)
            prefix_lens.append(pos)
            # the last token is known once the scheduler saw it, else it is the row's sample
            input_ids.append(ids[pos] if pos < len(ids) else -1 - row)
            req.kv_len = pos + 1
            req.last_batch_id = bid
            req.pending += 1
        self.sampled.extend(self.decode)
        self.sampled_drafts.extend([0] * len(self.decode))
        sample = [True] * len(self.decode)
        inits, prefix_writes, logprob_targets, draft_lens = [], [], [], []
        chain_back = [0] * len(self.decode)
        extend_lens, pages = [1] * len(self.decode), [decode_pages.tolist()]
        for i, (req, n) in enumerate(zip(self.extend, self.extend_lens), start=len(self.decode)):
            if req.needs_init:
                inits.append(_row_init(req))
                req.needs_init = False
            if req.cached_len and not req.prefix_written:
                prefix_writes.append((req.row, req.prefix_pages))
            req.prefix_written = True
            start = req.kv_len
            if req.draft_kv_owed:
                owed.append((i, req.token_ids[start - 1]))
                req.draft_kv_owed = False
            rows.append(req.row)
            back, req.replay = req.replay, 0  # a prefix hit's last tokens, computed again
            prefix_lens.append(start - back)
            extend_lens.append(back + n)
            pages.append(req.replay_pages)
            req.replay_pages = []
            drafts, req.drafts = req.drafts or [], None
            body = start + n - len(drafts)  # the positions before the drafts end here
            known = min(body, req.known_len)
            input_ids.extend(req.tokens(start - back, known))
            # a position past the known tokens holds the token the worker last sampled
            input_ids.extend([-(req.row + 1)] * (body - max(known, start - back)))
            input_ids.extend(drafts)
            draft_lens.append(len(drafts))
            chain_back.append(len(req.verifies[-1][1]) if drafts and req.verifies else 0)
            if drafts:
                req.verifies.append([start, drafts])
            if (targets := req.take_logprob_targets(start, start + n)) is not None:
                logprob_targets.append((i, *targets))
                self.logprob_reqs.append(req)
            req.kv_len = start + n
            req.last_batch_id = bid
            complete = req.kv_len == req.total_len
            does_sample = bool(drafts) or complete and not req.prefill_only
            sample.append(does_sample)
            if does_sample:
                req.pending += 1
                self.sampled.append(req)
                self.sampled_drafts.append(len(drafts))
            elif complete:
                self.prefilled.append(req)
            pages.append(extend_pages[i - len(self.decode)].tolist())
        entry_writes = []
        for req in self.reqs:
            if req.entry_writes:
                entry_writes += [(m, req.row, w, ids) for m, w, ids in req.entry_writes]
                req.entry_writes = []
        return BatchPlan(
            batch_id=bid, rows=rows, prefix_lens=prefix_lens, extend_lens=extend_lens,
            input_ids=input_ids, new_pages=list(itertools.chain.from_iterable(pages)),
            sample=sample, inits=inits, prefix_writes=prefix_writes,
            input_logprobs=logprob_targets,
            draft_lens=[0] * len(self.decode) + draft_lens if any(draft_lens) else [],
            draft_backfill=_spread(owed, len(rows)), entry_writes=entry_writes,
            chain_back=chain_back if any(chain_back) else [],
        )


def split_top(reqs: list[Req], counts: Iterable[int], ids: list[int], logprobs: list[float],
              stride: int) -> Iterator[tuple[list[int], list[float]]]:
    """Per request of `reqs`, its top alternatives from a StepResult's flat `ids` /
    `logprobs` (`stride` per scored token; `counts[i]` tokens scored for reqs[i]; only
    requests with `top_logprobs` > 0 have any there): its `top_logprobs` first ones per
    token, flat."""
    if not stride:
        yield from itertools.repeat(([], []), len(reqs))
        return
    at = 0
    for req, n in zip(reqs, counts):
        k = req.params.top_logprobs
        if not k:
            yield [], []
            continue
        end = at + n * stride
        if k == stride:
            yield ids[at:end], logprobs[at:end]
        else:
            keep = [j for t in range(at, end, stride) for j in range(t, t + k)]
            yield [ids[j] for j in keep], [logprobs[j] for j in keep]
        at = end


def _spread(owed: list[tuple[int, int]], n: int) -> list[int]:
    """`BatchPlan.draft_backfill` of `n` requests from their (index, token) debts."""
    if not owed:
        return []
    out = [-1] * n
    for i, token in owed:
        out[i] = token
    return out


def _row_init(req: Req) -> RowInit:
    p = req.params
    return RowInit(
        row=req.row, params=p,
        prompt_ids=req.prompt_ids if p.repetition_penalty != 1.0 else [],
        # penalty counts and a grammar matcher replay the outputs after a retraction
        output_ids=list(req.output_ids) if p.uses_penalties or p.grammar is not None else [],
    )
