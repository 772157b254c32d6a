"""The api process's host cost per streamed token, without a GPU.

    python -m bench.host.api [--streams 256 1000] [--tokens 64] [--step-ms 20] [--out PREFIX]

A stand-in scheduler (a child process) answers every request with one token per step at a
fixed step rate, whether or not the api keeps up, as the real one does. The api's
TokenizerManager, HTTP app and RPC server run in this process on uvloop, as in the api
process. Half the streams are `/v1/completions` SSE responses driven through the Starlette
app by an in-process ASGI client (the socket write is uvicorn's and is not counted); half
are RPC streams read by DEALER clients in a second child process.

Measured: (a) this process's CPU per streamed token, split with cProfile by the module the
time is spent for (detokenize, chunk building, SSE, RPC, receive, event loop); (b) the
event-loop lag (how late a 10 ms sleep wakes) and whether delivery keeps up with
production (the api falling behind shows as delivery ending well after production).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime
import json
import multiprocessing as mp
import shutil
import socket
import statistics
import time
from pathlib import Path

import msgspec
import zmq

from bench.host.api_profile import ADMISSION, split_profile
from runtime.wire.api_input import BatchOut, Limits, ReqOut
from runtime.wire.rpc import RpcGenerate, RpcOutput
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import AbortReq, GenerateReq, SchedulerInput

TEXT = (" Hello 😀 world, 世界! Ünïcödé — naïve café. 🎉🚀 Answer: 42. こんにちは, and the "
        "story goes on: a fox, a dog, a long road home, numbers 3.14159 and 2.71828. ") * 8
PROMPT = "Tell me a story."
RPC_CLIENTS = 8
def _limits(n: int) -> Limits:
    return Limits(max_context=8192, max_req_input_len=8191, max_running=n, kv_slots=1 << 20)


def _scheduler(sched_in: str, api_in: str, n: int, ids: list[int], step_s: float,
               conn) -> None:
    """The stand-in scheduler: one token per active request per step, `n` requests; no
    logprobs (none are asked for)."""
    ctx = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    inbox.bind(sched_in)
    outbox = ctx.socket(zmq.PUSH)
    outbox.connect(api_in)
    enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(SchedulerInput)
    columns = "rids" in BatchOut.__struct_fields__  # a runtime from before them: ReqOuts
    outbox.send(enc.encode(_limits(n)))
    active: dict[str, list] = {}  # rid -> [max_tokens, sent]
    seen = produced = 0
    first = last = 0.0
    next_step = time.monotonic()
    while seen < n or active:
        while inbox.poll(max(0, int((next_step - time.monotonic()) * 1000))):
            msg = dec.decode(inbox.recv())
            if isinstance(msg, GenerateReq):
                active[msg.rid] = [msg.params.max_tokens, 0, len(msg.input_ids)]
                seen += 1
            elif isinstance(msg, AbortReq):
                active.pop(msg.rid, None)
        next_step += step_s
        if seen < n or not active:  # all streams start together
            continue
        outs, rids, next_ids = [], [], []
        for rid, st in list(active.items()):
            st[1] += 1
            tok, done = ids[st[1] - 1], st[1] == st[0]
            if st[1] > 1 and not done and columns:  # a lone token: a column, as sent for real
                rids.append(rid)
                next_ids.append(tok)
            else:
                outs.append(ReqOut(rid, [tok], finish_reason="length" if done else None,
                                   prompt_tokens=st[2] if st[1] == 1 else 0))
            if done:
                del active[rid]
        outbox.send(enc.encode(BatchOut(outs, rids, next_ids) if columns else BatchOut(outs)))
        produced += len(outs) + len(rids)
        first, last = first or time.monotonic(), time.monotonic()
    conn.send({"produced": produced, "first": first, "last": last})
    outbox.close(linger=2000)
    inbox.close(linger=0)
    ctx.term()


def _rpc_clients(addr: str, n: int, max_tokens: int, want: str, conn) -> None:
    """`n` RPC streams over `RPC_CLIENTS` DEALER sockets; report the streams' outcome."""
    ctx = zmq.Context()
    socks = [ctx.socket(zmq.DEALER) for _ in range(RPC_CLIENTS)]
    poller = zmq.Poller()
    for s in socks:
        s.connect(addr)
        poller.register(s, zmq.POLLIN)
    enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(RpcOutput)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i in range(n):
        socks[i % RPC_CLIENTS].send(enc.encode(RpcGenerate(f"r{i}", PROMPT, params)))
    texts: dict[str, list[str]] = {f"r{i}": [] for i in range(n)}
    open_, ok, end = n, 0, 0.0
    while open_ and poller.poll(30_000):
        for s in socks:
            while s.poll(0):
                msg = dec.decode(s.recv())
                for c in getattr(msg, "outputs", None) or [msg]:
                    texts[c.rid].append(getattr(c, "text", ""))
                    if getattr(c, "finish_reason", "error") is not None:
                        open_ -= 1
                        ok += c.finish_reason == "length" and "".join(texts[c.rid]) == want
                        end = time.monotonic()
    conn.send({"ok": ok, "end": end})
    for s in socks:
        s.close(linger=0)
    ctx.term()


async def _sse_stream(app, body: bytes) -> tuple[list[bytes], float]:
    """One streamed POST /v1/completions through the ASGI app, as uvicorn would call it."""
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
             "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"",
             "root_path": "", "headers": [(b"content-type", b"application/json")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    parts: list[bytes] = []
    finished = asyncio.Event()
    unread = [body]

    async def receive() -> dict:
        if unread:
            return {"type": "http.request", "body": unread.pop(), "more_body": False}
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(msg: dict) -> None:
        if msg["type"] == "http.response.body":
            parts.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                finished.set()

    await app(scope, receive, send)
    return parts, time.monotonic()


def _sse_ok(parts: list[bytes], want: str) -> bool:
    events = [e[6:] for e in b"".join(parts).split(b"\n\n") if e.startswith(b"data: {")]
    chunks = [json.loads(e)["choices"] for e in events]
    text = "".join(c[0]["text"] for c in chunks if c)
    return text == want and chunks[-1][0]["finish_reason"] == "length"


async def _ticker(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.01)
        lags.append(time.perf_counter() - t - 0.01)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _scenario(n: int, tokens: int, step_s: float, profile: cProfile.Profile | None,
                    tok, ids: list[int]) -> dict:
    from runtime.api.http.app import build_app
    from runtime.api.monitoring.monitor import Monitor
    from runtime.api.rpc.server import RpcServer
    from runtime.api.tokenizer_manager import TokenizerManager
    from runtime.config.server import ServerConfig
    from runtime.model_config import resolve_model

    cfg = ServerConfig(model="smollm2", max_running=n, max_queue=n, rpc_port=_free_port(),
                       log_level="warning")
    want = tok.decode(ids[:tokens], skip_special_tokens=True)
    mpc = mp.get_context("spawn")
    sched_rx, sched_tx = mpc.Pipe(duplex=False)
    sched = mpc.Process(target=_scheduler, args=(cfg.ipc("sched_in"), cfg.ipc("api_in"), n,
                                                       ids, step_s, sched_tx), daemon=True)
    sched.start()
    procs = [sched]
    tm = TokenizerManager(cfg, resolve_model("smollm2"))
    rpc = RpcServer(tm, cfg.rpc_addr)
    try:
        await tm.start()
        await tm.wait_limits(60)
        await rpc.start()
        app = build_app(tm, cfg, Monitor(tm, cfg))
        lags: list[float] = []
        stop = asyncio.Event()
        ticker = asyncio.create_task(_ticker(lags, stop))
        started, cpu0 = asyncio.Event(), [0.0]

        def on_first_batch(batch) -> None:  # admission is done: production starts
            del tm._dispatch
            lags.clear()
            cpu0[0] = time.process_time()
            started.set()
            tm._dispatch(batch)

        tm._dispatch = on_first_batch
        if profile is not None:  # from admission on: frames never start mid-flight
            profile.enable()
        body = json.dumps({"model": "smollm2", "prompt": PROMPT, "max_tokens": tokens,
                           "temperature": 0, "ignore_eos": True, "stream": True}).encode()
        n_rpc = n // 2
        sse = [asyncio.create_task(_sse_stream(app, body)) for _ in range(n - n_rpc)]
        rpc_rx, rpc_tx = mpc.Pipe(duplex=False)
        clients = mpc.Process(target=_rpc_clients, args=(cfg.rpc_addr, n_rpc, tokens, want,
                                                         rpc_tx), daemon=True)
        clients.start()
        procs.append(clients)
        await started.wait()
        results = await asyncio.gather(*sse)
        rpc_res = await asyncio.to_thread(rpc_rx.recv)
        if profile is not None:
            profile.disable()
        cpu = time.process_time() - cpu0[0]
        stop.set()
        await ticker
        prod = await asyncio.to_thread(sched_rx.recv)
    finally:
        await rpc.close()
        await tm.close()
        for proc in procs:
            proc.join(5)
            proc.terminate()
        shutil.rmtree(cfg.ipc_dir, ignore_errors=True)
    end = max([t for _, t in results] + [rpc_res["end"]])
    produce_s, deliver_s = prod["last"] - prod["first"], end - prod["first"]
    ms = sorted(x * 1000 for x in lags)
    return {"streams": n, "tokens_per_stream": tokens, "step_ms": step_s * 1000,
            "ok_streams": sum(_sse_ok(p, want) for p, _ in results) + rpc_res["ok"],
            "tokens": prod["produced"], "cpu_s": round(cpu, 3),
            "cpu_us_per_token": round(cpu / prod["produced"] * 1e6, 2),
            "produced_tok_s": round(prod["produced"] / produce_s),
            "delivered_tok_s": round(prod["produced"] / deliver_s),
            "delivery_behind_s": round(end - prod["last"], 3),
            "lag_p50_ms": round(statistics.median(ms), 2),
            "lag_p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 2), "lag_max_ms": round(ms[-1], 2)}


async def _run(streams: list[int], tokens: int, step_s: float) -> dict:
    from transformers import AutoTokenizer

    from runtime.model_config import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("smollm2").tokenizer_path)
    ids = tok.encode(TEXT)[:tokens]
    assert len(ids) == tokens, f"at most {len(ids)} tokens per stream"
    await _scenario(8, 4, step_s, None, tok, ids)  # warm-up: lazy imports, first calls
    prof = cProfile.Profile()
    profiled = await _scenario(256, tokens, step_s, prof, tok, ids)
    split = split_profile(prof)
    api = {k: v for k, v in split.items() if k not in ("bench clients", ADMISSION)}
    total = sum(api.values())
    runs = [await _scenario(n, tokens, step_s, None, tok, ids) for n in streams]
    cost = next((r for r in runs if r["streams"] == 256), profiled)["cpu_us_per_token"]
    per_token = {k: round(v / total * cost, 2)
                 for k, v in sorted(api.items(), key=lambda kv: -kv[1])}
    return {"cpu_split_us_per_token_256": per_token,
            "admission_us_per_request": round(split.get(ADMISSION, 0) / 256 * 1e6, 1),
            "profiled_share": {k: round(v / sum(split.values()), 3) for k, v in split.items()},
            "runs": runs}


def run_api_bench(streams: list[int] = [256, 1000], tokens_per_stream: int = 64,  # noqa: B006
                  step_ms: float = 20.0) -> dict:
    """Run the scenarios (a profiled one at 256 streams, then one per `streams`)."""
    import uvloop

    return uvloop.run(_run(list(streams), tokens_per_stream, step_ms / 1000))


def to_markdown(res: dict) -> str:
    lines = ["## api CPU per streamed token at 256 streams (us, split by cProfile)", "",
             "| part | us/token |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in res["cpu_split_us_per_token_256"].items()]
    keys = ["streams", "ok_streams", "tokens", "cpu_us_per_token", "produced_tok_s",
            "delivered_tok_s", "delivery_behind_s", "lag_p50_ms", "lag_p99_ms", "lag_max_ms"]
    lines += ["", "## event-loop lag and delivery", "", "| " + " | ".join(keys) + " |",
              "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in res["runs"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, nargs="+", default=[256, 1000])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--step-ms", type=float, default=20.0)
    day = datetime.date.today().isoformat()
    p.add_argument("--out", default=f"bench/results/{day}-host-api-cpu")
    args = p.parse_args()
    res = run_api_bench(args.streams, args.tokens, args.step_ms)
    md = to_markdown(res)
    print(md)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(res, indent=2))
    Path(args.out + ".md").write_text(md)


if __name__ == "__main__":
    main()
