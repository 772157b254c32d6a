"""Per-BatchOut output work: one-token columns give exactly what ReqOuts give, a consumer
of the whole output gets the join of the deltas, and a thousand concurrent streams
(HTTP-style generate and RPC) all complete correctly."""

from __future__ import annotations

import asyncio
import random

import msgspec
import pytest

from runtime.api.detokenize import IncrementalDetokenizer
from runtime.api.dispatch import apply_batch
from runtime.api.req_state import ReqState
from runtime.api.rpc.server import RpcServer
from runtime.api.timing import RequestTimings
from runtime.api.tokenizer_manager import TokenizerManager
from runtime.client import AsyncClient
from runtime.wire.api_input import BatchOut, ReqOut
from runtime.wire.errors import InvalidRequest, RequestFailed
from runtime.wire.request_output import FinishReason, RequestOutput
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import AbortReq, FinishReq
from tests.api.conftest import SCRIPT_TEXT
from tests.api.fake_scheduler import FakeScheduler

TEXTS = [SCRIPT_TEXT, "emoji 😀😃😄 flags 🇫🇷🇯🇵 family 👨\u200d👩\u200d👧 done",
         "中文测试：你好，世界！日本語。", "plain words and more words",
         "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"]


def workload(tok, rng: random.Random, n: int) -> list[dict]:
    """Random requests: output ids (text, or random ids), stop strings, skip and logprobs
    flags."""
    reqs = []
    for i in range(n):
        text = rng.choice(TEXTS)
        ids = tok.encode(text) if i % 3 else [rng.randrange(len(tok)) for _ in range(30)]
        decoded = tok.decode(ids)
        stop = []
        if i % 4 == 0 and len(decoded) > 8:
            at = rng.randrange(1, len(decoded) - 4)
            stop = [decoded[at:at + rng.randint(1, 4)], "never-there"]
        prompt = [rng.randrange(len(tok)) for _ in range(rng.randint(1, 8))]
        reqs.append(dict(rid=f"r{i}", ids=ids, stop=stop, skip=i % 5 != 0, prompt=prompt,
                         logprobs=i % 2 == 0))
    reqs[7]["ids"] = reqs[7]["ids"][:5] + [-1] + reqs[7]["ids"][5:]  # undecodable
    return reqs


def steps(rng: random.Random, reqs: list[dict]) -> list[list[ReqOut]]:
    """Each step's ReqOuts: the next 1-4 ids of a random subset of the requests (mostly
    one), the header on the first, LENGTH at the end; logprobs where asked for."""
    sent = {r["rid"]: 0 for r in reqs}
    out = []
    while any(sent[r["rid"]] < len(r["ids"]) for r in reqs):
        outs = []
        for r in reqs:
            at = sent[r["rid"]]
            if at == len(r["ids"]) or rng.random() < 0.3:
                continue
            new = r["ids"][at:at + (1 if rng.random() < 0.7 else rng.randint(2, 4))]
            sent[r["rid"]] = at + len(new)
            done = sent[r["rid"]] == len(r["ids"])
            outs.append(ReqOut(r["rid"], new, [-0.5] * len(new) if r["logprobs"] else [],
                               FinishReason.LENGTH if done else None,
                               prompt_tokens=len(r["prompt"]) if at == 0 else 0))
        if len(outs) > 2 and rng.random() < 0.2:  # a request twice in one batch
            first = outs[0]
            if first.finish_reason is None and len(first.token_ids) > 1:
                outs[0] = ReqOut(first.rid, first.token_ids[:1], first.logprobs[:1],
                                 prompt_tokens=first.prompt_tokens)
                outs.append(ReqOut(first.rid, first.token_ids[1:], first.logprobs[1:]))
        out.append(outs)
    return out


def with_columns(outs: list[ReqOut]) -> BatchOut:
    """One step as the scheduler sends it: a lone token with no header, logprobs or finish
    in the columns, unless its request already has a ReqOut in this step."""
    batch = BatchOut([])
    for o in outs:
        plain = (len(o.token_ids) == 1 and not o.logprobs and not o.prompt_tokens
                 and o.finish_reason is None)
        if plain and all(x.rid != o.rid for x in batch.outs):
            batch.rids.append(o.rid)
            batch.next_ids.extend(o.token_ids)
        else:
            batch.outs.append(o)
    return batch


def run(tok, reqs: list[dict], batches: list[BatchOut], stream: bool = True) -> list:
    """Apply the batches to fresh request states; log what the scheduler is told and each
    request's chunk (taken after every batch)."""
    states = {r["rid"]: ReqState(r["rid"], IncrementalDetokenizer(
        tok, r["prompt"], r["skip"], r["stop"]), r["logprobs"], r["prompt"], stream=stream)
        for r in reqs}
    log = []
    for batch in batches:
        log.append(apply_batch(batch, states, RequestTimings()))
        for rid, s in states.items():
            try:
                chunk = s.take()
            except RequestFailed:
                log.append((rid, "failed"))
                continue
            log.append(None if chunk is None else (rid, chunk))
    return log


def test_columns_give_the_same_chunks_as_reqouts(tok):
    rng = random.Random(2)
    reqs = workload(tok, rng, 150)
    outs = steps(rng, reqs)
    columns = [with_columns(o) for o in outs]
    assert sum(len(b.rids) for b in columns) > len(reqs) * 5  # most tokens came alone
    log = run(tok, reqs, columns)
    assert log == run(tok, reqs, [BatchOut(o) for o in outs])
    aborts = [a for step in log if isinstance(step, list) for a in step]
    assert AbortReq("r7", reason=FinishReason.ERROR) in aborts
    assert any(isinstance(a, FinishReq) for a in aborts)


def test_the_whole_output_is_the_join_of_the_deltas(tok):
    rng = random.Random(5)
    reqs = workload(tok, rng, 60)
    batches = [with_columns(o) for o in steps(rng, reqs)]
    deltas: dict[str, list[RequestOutput]] = {}
    for entry in run(tok, reqs, batches):
        if isinstance(entry, tuple) and entry[1] != "failed":
            deltas.setdefault(entry[0], []).append(entry[1])
    whole = {e[0]: e[1] for e in run(tok, reqs, batches, stream=False)
             if isinstance(e, tuple) and e[1] != "failed"}
    assert set(whole) == set(deltas) - {"r7"} == {r["rid"] for r in reqs} - {"r7"}
    for rid, pieces in deltas.items():
        if rid == "r7":  # failed: streamed some deltas, then the error
            continue
        assert RequestOutput.join(pieces) == whole[rid], rid
        assert pieces[-1].finish_reason is not None
    assert sum(len(p) > 1 for p in deltas.values()) > len(deltas) // 2


def test_ids_only_outputs_are_the_same_without_text(cfg, spec, script_ids):
    """`text=False`: the ids, counters and finish of the text output, an empty text, and
    no stop strings (they are matched in the text)."""
    params = SamplingParams(max_tokens=len(script_ids), logprobs=True)

    async def main():
        tm = TokenizerManager(cfg, spec)
        await tm.start()
        try:
            with_text = [c async for c in tm.generate("Story", params, stream=False)]
            ids_only = [c async for c in tm.generate("Story", params, text=False)]
            with pytest.raises(InvalidRequest, match="stop strings"):
                await anext(tm.generate("Story", SamplingParams(stop=["END"]), text=False))
            return with_text[0], ids_only
        finally:
            await tm.close()

    with FakeScheduler(cfg, lambda r: script_ids):
        whole, deltas = asyncio.run(main())
    joined = RequestOutput.join(deltas)
    assert whole.text and joined.text == "" and len(deltas) > 1
    assert msgspec.structs.replace(joined, rid=whole.rid, text=whole.text) == whole


def test_a_thousand_concurrent_streams_complete(cfg, spec, tok, script_ids):
    n_gen, n_rpc = 500, 500
    n = len(script_ids)
    full = tok.decode(script_ids, skip_special_tokens=True)
    cut = full[:full.index("END")]

    async def main():
        tm = TokenizerManager(cfg, spec)
        rpc = RpcServer(tm, cfg.rpc_addr)
        await tm.start()
        await tm.wait_limits(10)
        await rpc.start()
        try:
            async with AsyncClient(rpc.addr, timeout=60) as client:
                async def gen(i):
                    stop = ["END"] if i % 2 else []
                    chunks = [c async for c in tm.generate(f"Story {i}", SamplingParams(
                        max_tokens=n, stop=stop))]
                    return "".join(c.text for c in chunks), chunks[-1].finish_reason, stop

                async def over_rpc(i):
                    stop = ["END"] if i % 2 else []
                    chunks = [c async for c in await client.generate(
                        f"Story {i}", stream=True, max_tokens=n, stop=stop)]
                    return "".join(c.text for c in chunks), chunks[-1].finish_reason, stop

                return await asyncio.gather(*[gen(i) for i in range(n_gen)],
                                            *[over_rpc(i) for i in range(n_rpc)])
        finally:
            await rpc.close()
            await tm.close()

    with FakeScheduler(cfg, lambda r: script_ids, per_msg=2):
        results = asyncio.run(main())
    assert len(results) == n_gen + n_rpc
    for text, reason, stop in results:
        assert (text, reason) == ((cut, "stop") if stop else (full, "length"))
