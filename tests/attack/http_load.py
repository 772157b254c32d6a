"""Groups of many connections at once: concurrent streams (their tokens against the
server's counters), mid-stream disconnects, slow senders (slowloris), idle half-open
connections to both ports, clients leaving mid-upload, and a rid retried right after its
stream was dropped."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import httpx

from runtime.client import Client
from tests.attack.harness import Tally, Target, generate_once

STREAM_TIMEOUT_S = 240.0  # a whole stream under load on two shared cores
CLOSE_BOUND_S = 30.0  # beyond --read-timeout, for the server to close a slow connection


def _scale(scale: str, full: int, small: int) -> int:
    return full if scale == "full" else small


def _completion(target: Target, i: int, max_tokens: int = 4, **extra) -> dict:
    return {"model": target.model, "prompt": f"Story {i}: once upon a time",
            "max_tokens": max_tokens, "temperature": 0, **extra}


async def _stream(client: httpx.AsyncClient, body: dict, stop_after: int | None = None):
    """(status, completion tokens from usage, saw [DONE]); stops reading after
    `stop_after` data lines (closing the connection mid-stream)."""
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return r.status_code, 0, False
        tokens, seen = 0, 0
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            seen += 1
            if line == "data: [DONE]":
                return 200, tokens, True
            usage = json.loads(line[6:]).get("usage")
            if usage:
                tokens = usage["completion_tokens"]
            if stop_after is not None and seen >= stop_after:
                return 200, tokens, False
        return 200, tokens, False


def streams(target: Target, tally: Tally, scale: str) -> None:
    n = _scale(scale, 300, 30)
    before = target.metrics().get("sluice_generation_tokens_total", 0.0)

    async def one(client, i):
        try:
            status, tokens, done = await _stream(client, _completion(
                target, i, stream=True, stream_options={"include_usage": True}))
        except httpx.TimeoutException:
            tally.lose(f"stream {i}")
            return 0
        except httpx.HTTPError as e:
            tally.fail(f"stream {i}: {e!r}")
            return 0
        if status != 200 or not done:
            tally.fail(f"stream {i}: HTTP {status}, [DONE] {done}")
        else:
            tally.ok()
        return tokens

    async def main():
        async with httpx.AsyncClient(base_url=target.url, timeout=STREAM_TIMEOUT_S,
                                     limits=httpx.Limits(max_connections=None)) as client:
            return await asyncio.gather(*(one(client, i) for i in range(n)))

    client_tokens = sum(asyncio.run(main()))
    served = target.metrics().get("sluice_generation_tokens_total", 0.0) - before
    tally.checks["tokens_clients_vs_metrics"] = f"{client_tokens} / {served:.0f}"
    if served != client_tokens:
        tally.fail(f"the clients got {client_tokens} tokens, /metrics counted {served}")


def disconnects(target: Target, tally: Tally, scale: str) -> None:
    n = _scale(scale, 200, 20)

    async def one(client, i):
        try:
            status, _, _ = await _stream(client, _completion(target, i, 64, stream=True),
                                         stop_after=1)
        except httpx.TimeoutException:
            tally.lose(f"disconnect {i}: no first chunk")
            return
        except httpx.HTTPError as e:
            tally.fail(f"disconnect {i}: {e!r}")
            return
        tally.judge_status(status, f"disconnect {i}", (200,))

    async def main():
        async with httpx.AsyncClient(base_url=target.url, timeout=STREAM_TIMEOUT_S,
                                     limits=httpx.Limits(max_connections=None)) as client:
            await asyncio.gather(*(one(client, i) for i in range(n)))

    asyncio.run(main())


def _port(target: Target) -> int:
    return int(target.url.rsplit(":", 1)[1])


async def _held_open(port: int, n: int, first: bytes, drip: bytes | None, bound: float,
                     tally: Tally, label: str) -> None:
    """Open `n` connections sending `first` (then `drip` every second): each must be closed
    by the server within `bound` seconds (else failed)."""

    async def one(i):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as e:  # refused at once: the cap at work
            tally.ok() if isinstance(e, ConnectionError) else tally.fail(f"{label} {i}: {e!r}")
            return
        try:
            writer.write(first)
            async with asyncio.timeout(bound):
                while True:
                    if drip is not None:
                        writer.write(drip)
                    try:
                        got = await asyncio.wait_for(reader.read(4096), 1.0)
                    except asyncio.TimeoutError:
                        continue
                    if not got:
                        break
            tally.ok()
        except (TimeoutError, asyncio.TimeoutError):
            tally.fail(f"{label} {i}: still open after {bound:.0f} s")
        except OSError:
            tally.ok()  # reset by the server
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    await asyncio.gather(*(one(i) for i in range(n)))


def slowloris(target: Target, tally: Tally, scale: str) -> None:
    n = _scale(scale, 500, 50)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"

    async def main():
        flood = asyncio.create_task(_held_open(_port(target), n, head, b"X", 5 + CLOSE_BOUND_S,
                                               tally, "slow sender"))
        await asyncio.sleep(1)
        served = await asyncio.to_thread(generate_once, target)
        tally.checks["served_during"] = served[0] == 200
        if served[0] != 200:
            tally.fail(f"a normal request during the flood got {served}")
        await flood

    asyncio.run(main())


def idle_connections(target: Target, tally: Tally, scale: str) -> None:
    n = _scale(scale, 3000, 300)
    rpc_port = int(target.rpc_addr.rsplit(":", 1)[1])

    async def main():
        flood = asyncio.gather(
            _held_open(_port(target), n // 2, b"", None, 5 + CLOSE_BOUND_S, tally, "idle http"),
            _held_open(rpc_port, n - n // 2, b"", None, 5 + CLOSE_BOUND_S, tally, "idle rpc"))
        await asyncio.sleep(1)
        # beyond a full cap a new client is refused until the idle ones time out
        http_s, rpc_s = await asyncio.gather(
            asyncio.to_thread(_served_after, lambda: generate_once(target)[0] == 200),
            asyncio.to_thread(_served_after, lambda: _rpc_generate(target)))
        tally.checks["served_after_s"] = f"http {http_s}, rpc {rpc_s}"
        if http_s is None or rpc_s is None:
            tally.fail(f"not served within {5 + CLOSE_BOUND_S:.0f} s of the flood: "
                       f"http {http_s}, rpc {rpc_s}")
        await flood

    asyncio.run(main())


def _served_after(attempt) -> float | None:
    """Seconds until `attempt()` succeeds, retried up to the bound; None if it never does."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < 5 + CLOSE_BOUND_S:
        if attempt():
            return round(time.monotonic() - t0, 1)
        time.sleep(0.5)
    return None


def _rpc_generate(target: Target) -> bool:
    """A real generation over RPC; a refused connection is retried by zmq until a place frees."""
    try:
        with Client(target.rpc_addr, timeout=10) as client:
            return client.generate("The capital of France is", max_tokens=2).completion_tokens > 0
    except Exception:
        return False


def upload_disconnects(target: Target, tally: Tally, scale: str) -> None:
    n = _scale(scale, 50, 10)
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
            b"application/json\r\nContent-Length: 100000\r\n\r\n")

    async def one(i):
        _, writer = await asyncio.open_connection("127.0.0.1", _port(target))
        writer.write(head + b'{"prompt": "' + b"x" * 1000)
        await writer.drain()
        writer.transport.abort()  # a reset mid-upload
        tally.ok()

    async def main():
        await asyncio.gather(*(one(i) for i in range(n)))

    before = _labelled(target, "sluice_http_errors_total")
    asyncio.run(main())
    errors = _labelled(target, "sluice_http_errors_total") - before
    tally.checks["http_5xx_counted"] = errors
    if errors:
        tally.fail(f"clients leaving mid-upload were counted as {errors} server errors")


def _labelled(target: Target, name: str) -> int:
    """The sum over labels of a counter, from the /metrics text (5xx only)."""
    text = httpx.get(f"{target.url}/metrics", timeout=10).text
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith(name + "{") and 'status="5' in line)


def rid_retry(target: Target, tally: Tally, scale: str) -> None:
    n = _scale(scale, 20, 5)
    with httpx.Client(base_url=target.url, timeout=STREAM_TIMEOUT_S) as client:
        for i in range(n):
            rid = f"retry-{i}"
            body = {"text": f"Tell me about {i}", "rid": rid, "stream": True,
                    "sampling_params": {"max_tokens": 64, "temperature": 0}}
            with client.stream("POST", "/generate", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        break  # drop the stream after its first chunk
            body.update(stream=False, sampling_params={"max_tokens": 2, "temperature": 0})
            try:
                again = client.post("/generate", json=body)
            except httpx.TimeoutException:
                tally.lose(f"retry of {rid}")
                continue
            reply = again.json() if again.status_code == 200 else {}
            if again.status_code != 200 or reply.get("finish_reason") == "abort":
                tally.fail(f"retry of {rid}: HTTP {again.status_code} {again.text[:120]}")
            else:
                tally.ok()
