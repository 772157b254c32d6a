"""Per-BatchOut output work: the batched path gives exactly what the per-request path gives,
and a thousand concurrent streams (HTTP-style generate and RPC) all complete correctly."""

from __future__ import annotations

import asyncio
import random

import msgspec

from runtime.api.detokenize import IncrementalDetokenizer
from runtime.api.detokenize_batch import BatchDecoder, detokenize_batch
from runtime.api.dispatch import apply_batch
from runtime.api.errors import RequestFailed
from runtime.api.req_state import ReqState
from runtime.api.rpc import RpcServer
from runtime.api.timing import RequestTimings
from runtime.api.tokenizer_manager import TokenizerManager
from runtime.client import AsyncClient
from runtime.messages import AbortReq, BatchOut, FinishReason, FinishReq, ReqOut, SamplingParams
from tests.api.conftest import SCRIPT_TEXT
from tests.api.fake_scheduler import FakeScheduler

TEXTS = [SCRIPT_TEXT, "emoji 😀😃😄 flags 🇫🇷🇯🇵 family 👨\u200d👩\u200d👧 done",
         "中文测试：你好，世界！日本語。", "plain words and more words",
         "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"]


def workload(tok, rng: random.Random, n: int) -> list[dict]:
    """Random requests: output ids (text, or random ids), stop strings, skip flag."""
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
        reqs.append(dict(rid=f"r{i}", ids=ids, stop=stop, skip=i % 5 != 0, prompt=prompt))
    reqs[7]["ids"] = reqs[7]["ids"][:5] + [-1] + reqs[7]["ids"][5:]  # undecodable
    return reqs


def batches(rng: random.Random, reqs: list[dict]) -> list[BatchOut]:
    """Each step: the next 1-4 ids of a random subset of the requests, LENGTH at the end."""
    sent = {r["rid"]: 0 for r in reqs}
    out = []
    while any(sent[r["rid"]] < len(r["ids"]) for r in reqs):
        outs = []
        for r in reqs:
            at = sent[r["rid"]]
            if at == len(r["ids"]) or rng.random() < 0.3:
                continue
            new = r["ids"][at:at + rng.randint(1, 4)]
            sent[r["rid"]] = at + len(new)
            done = sent[r["rid"]] == len(r["ids"])
            outs.append(ReqOut(r["rid"], new, [-0.5] * len(new),
                               FinishReason.LENGTH if done else None,
                               prompt_tokens=len(r["prompt"]) if at == 0 else 0))
        if len(outs) > 2 and rng.random() < 0.2:  # a request twice in one batch
            first = outs[0]
            if first.finish_reason is None and len(first.token_ids) > 1:
                outs[0] = ReqOut(first.rid, first.token_ids[:1], first.logprobs[:1],
                                 prompt_tokens=first.prompt_tokens)
                outs.append(ReqOut(first.rid, first.token_ids[1:], first.logprobs[1:]))
        out.append(BatchOut(outs))
    return out


def test_batched_detokenize_equals_per_request(tok):
    rng = random.Random(1)
    reqs = workload(tok, rng, 120)
    per, bat = {}, {}
    for r in reqs:
        per[r["rid"]] = IncrementalDetokenizer(tok, r["prompt"], r["skip"], r["stop"])
        bat[r["rid"]] = IncrementalDetokenizer(tok, r["prompt"], r["skip"], r["stop"])
    decoder = BatchDecoder(tok)
    failed: set[str] = set()
    for batch in batches(rng, reqs):
        outs = [o for o in batch.outs if o.rid not in failed]
        outs = list({o.rid: o for o in outs}.values())  # one output per request here
        got = detokenize_batch(decoder, [(bat[o.rid], o.token_ids) for o in outs])
        for o, text in zip(outs, got):
            try:
                want = per[o.rid].add(o.token_ids)
            except OverflowError:
                assert isinstance(text, OverflowError)
                failed.add(o.rid)
                continue
            assert text == want, o.rid
    assert failed == {"r7"}
    for rid, d in per.items():
        if rid not in failed:
            assert bat[rid].flush() == d.flush()
            assert bat[rid].token_ids == d.token_ids and bat[rid].stop_str == d.stop_str


def test_apply_batch_gives_the_same_chunks_as_per_request(tok):
    rng = random.Random(2)
    reqs = workload(tok, rng, 150)
    steps = batches(rng, reqs)
    runs = []
    for decoder in (BatchDecoder(tok), None):  # None: each request detokenizes alone
        states = {r["rid"]: ReqState(r["rid"], IncrementalDetokenizer(
            tok, r["prompt"], r["skip"], r["stop"]), True, r["prompt"]) for r in reqs}
        log = []
        for batch in steps:
            aborts = apply_batch(batch, states, decoder, RequestTimings())
            log.append(aborts)
            for rid, s in states.items():
                try:
                    chunk = s.take()
                except RequestFailed:
                    log.append((rid, "failed"))
                    continue
                log.append(None if chunk is None else msgspec.structs.astuple(chunk))
        runs.append(log)
    assert runs[0] == runs[1]
    aborts = [a for step in runs[0] if isinstance(step, list) for a in step]
    assert AbortReq("r7", reason=FinishReason.ERROR) in aborts
    assert any(isinstance(a, FinishReq) for a in aborts)


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
            async with AsyncClient(cfg.rpc_addr, timeout=60) as client:
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
