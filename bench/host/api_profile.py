"""Attribute a cProfile of the api process to what its time is spent for (detokenize,
chunk building, SSE, RPC, receive, event loop), for `bench.host.api`."""

from __future__ import annotations

import cProfile
import pstats

# cProfile attribution: the module (or module:function) a function lives in names what
# its time is spent for; functions elsewhere (builtins, asyncio, msgspec, zmq) count for
# their callers. "admission" is per request, not per token, and is left out of the split.
ADMISSION = "admission"
CATEGORIES = [("tokenizer_manager:open", ADMISSION), ("tokenizer_manager:_prepare", ADMISSION),
              ("engine_state:wait_limits", ADMISSION), ("http/app:_serve", ADMISSION),
              ("http/app:completions", ADMISSION), ("http/disconnect:guard", ADMISSION),
              ("openai/serving:completions", ADMISSION), ("openai/serving:_run", ADMISSION),
              ("runtime/api/openai/protocol", ADMISSION), ("streams:start_streams", ADMISSION),
              ("streams:__init__", ADMISSION), ("rpc/server:_handle", ADMISSION),
              ("detokenize:__init__", ADMISSION), ("req_state:__init__", ADMISSION),
              ("runtime/api/detok", "detokenize"),
              ("runtime/api/req_state", "chunk building"),
              ("runtime/wire/request_output:join", "chunk building"),
              ("runtime/api/tokenizer_manager", "chunk building"),
              ("runtime/api/engine_state", "chunk building"),
              ("runtime/api/streams", "chunk building"), ("runtime/api/timing", "chunk building"),
              ("runtime/api/dispatch", "chunk building"),
              ("runtime/api/monitoring/metrics", "chunk building"),
              ("runtime/api/openai", "SSE encoding"), ("runtime/api/http/generate", "SSE encoding"),
              ("runtime/api/http/app", "SSE encoding"),
              ("runtime/api/http/disconnect", "SSE encoding"),
              ("runtime/api/http/server", "SSE encoding"), ("runtime/api/sse", "SSE encoding"),
              ("starlette/", "SSE encoding"), ("anyio/", "SSE encoding"),
              ("runtime/api/rpc", "RPC encoding"), ("runtime/api/aio_queue", "receive"),
              ("bench/host/api", "bench clients")]


def _category(func: tuple) -> str | None:
    path, _, name = func
    for key, cat in CATEGORIES:
        where, _, fn = key.partition(":")
        if where in path and (not fn or fn == name):
            return cat
    return None


def split_profile(profile: cProfile.Profile) -> dict[str, float]:
    """Seconds of own time per category; an uncategorized function's time goes to its
    callers' categories in proportion to the time spent in it for each caller."""
    stats = pstats.Stats(profile).stats  # func -> (cc, nc, tt, ct, callers)
    memo: dict = {}

    def dist(func, depth: int = 0) -> dict[str, float]:
        if func in memo:
            return memo[func]
        cat = _category(func)
        if cat is not None or depth > 40 or func not in stats:
            return {cat or "event loop / other": 1.0}
        memo[func] = {"event loop / other": 1.0}  # a cycle resolves to "other"
        callers = stats[func][4]
        total = sum(v[2] for v in callers.values())
        out: dict[str, float] = {}
        for caller, v in callers.items():
            w = v[2] / total if total else 1.0 / len(callers)
            for c, x in dist(caller, depth + 1).items():
                out[c] = out.get(c, 0.0) + w * x
        memo[func] = out or {"event loop / other": 1.0}
        return memo[func]

    split: dict[str, float] = {}
    for func, (_, _, tt, _, _) in stats.items():
        for c, x in dist(func).items():
            split[c] = split.get(c, 0.0) + tt * x
    return split
