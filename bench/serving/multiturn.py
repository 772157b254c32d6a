"""Multi-turn chats against one KV pool, with the host KV tier off and on.

`--conversations` chats of `--turns` turns each. Turn t of a chat sends its whole history
(every earlier prompt and a reply of `--reply-len` tokens) plus `--user-len` new tokens,
and asks for `--reply-len` tokens. The turns go round the chats in a shuffled order, so a
chat comes back only after many others ran: with a working set of `--working-set` x the
device pool, its history has usually left the device by then. The same requests run on
two servers of the same device pool, `--host-kv-gib 0` and `--host-kv-gib N`; the report
compares the prefix hit rate (per tier), TTFT P50/P99 and throughput.

    python -m bench.serving.multiturn                      # the H200 run (dummy:llama3-8b)
    python -m bench.serving.multiturn --smoke              # dummy:tiny on the CPU, tiny sizes

Writes bench/results/<date>-multiturn-<tag>.json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import random
import time
from pathlib import Path

import aiohttp

from bench.serving.data import MIN_TOKEN, RequestSpec
from bench.serving.driver import _vocab, send_request
from bench.serving.metrics import RequestResult, finite, summarize
from bench.serving.scrape import parse_prometheus
from bench.serving.server_proc import SluiceServer, device_name, git_rev, wait_gpu_released


def chat_turns(conversations: int, turns: int, user_len: int, reply_len: int, vocab: int,
               seed: int) -> list[list[RequestSpec]]:
    """Per turn, one request per chat in a shuffled order. The history's replies are fixed
    tokens (not the served ones), so both servers get the very same prompts."""
    rng = random.Random(seed)
    history: list[list[int]] = [[] for _ in range(conversations)]
    rounds = []
    for _ in range(turns):
        specs = []
        for c in rng.sample(range(conversations), conversations):
            history[c] = history[c] + [rng.randrange(MIN_TOKEN, vocab) for _ in range(user_len)]
            specs.append(RequestSpec(list(history[c]), reply_len))
            history[c] = history[c] + [rng.randrange(MIN_TOKEN, vocab) for _ in range(reply_len)]
        rounds.append(specs)
    return rounds


async def run_chats(url: str, model: str, rounds: list[list[RequestSpec]],
                    concurrency: int) -> tuple[list[RequestResult], float]:
    """Send every turn, at most `concurrency` at once; a chat's turn t + 1 starts only
    after its turn t ended (the rounds run one after the other)."""
    gate = asyncio.Semaphore(concurrency)
    results: list[RequestResult] = []
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async def one(spec: RequestSpec) -> None:
            async with gate:
                res = RequestResult(prompt_len=len(spec.prompt))
                results.append(res)
                await send_request(session, url, model, spec, res)
        start = time.perf_counter()
        for specs in rounds:
            await asyncio.gather(*(one(s) for s in specs))
        return results, time.perf_counter() - start


def tier_metrics(url: str) -> dict:
    """Prefix hits per tier and the host tier's traffic, from /metrics."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        m = parse_prometheus(resp.read().decode())
    query = m.get("sluice_prefix_cache_query_tokens_total", 0.0)
    hits = m.get("sluice_prefix_cache_hit_tokens_total", 0.0)
    host_rate = m.get('sluice_prefix_cache_tier_hit_rate{tier="host"}', 0.0)
    return {"prefix_query_tokens": query, "prefix_hit_rate": hits / query if query else 0.0,
            "host_hit_rate": host_rate,
            "device_hit_rate": (hits / query if query else 0.0) - host_rate,
            **{k.removeprefix("sluice_").removesuffix("_total"): v for k, v in m.items()
               if k.startswith(("sluice_kv_writeback", "sluice_kv_load", "sluice_host_kv"))}}


def run_config(args, name: str, host_gib: float, rounds, work: Path) -> dict:
    server_args = ["--model", args.model, "--device", args.device, "--kv-slots",
                   str(args.kv_slots), "--max-running", str(args.concurrency),
                   "--log-interval", "0", "--host-kv-gib", str(host_gib), *args.server_args]
    server = SluiceServer(server_args, work / f"multiturn-{name}.log")
    entry: dict = {"command": " ".join(server.cmd[1:])}
    try:
        server.start(args.ready_timeout)
        results, duration = asyncio.run(run_chats(server.url, args.model, rounds,
                                                  args.concurrency))
        entry.update(summarize(results, duration))
        entry.update(tier_metrics(server.url))
    finally:
        server.stop()
        wait_gpu_released()
    return entry


def report(res: dict) -> str:
    rows = ["| host tier | prefix hit rate | device / host | TTFT P50 ms | TTFT P99 ms | "
            "output tok/s | total tok/s | failed |", "|---|---|---|---|---|---|---|---|"]
    for name, r in res["configs"].items():
        rows.append(f"| {name} | {r['prefix_hit_rate']:.1%} | {r['device_hit_rate']:.1%} / "
                    f"{r['host_hit_rate']:.1%} | {r['ttft_ms']['p50']:.1f} | "
                    f"{r['ttft_ms']['p99']:.1f} | {r['output_throughput']:.1f} | "
                    f"{r['total_token_throughput']:.1f} | {r['failed']} |")
    w = res["workload"]
    return "\n".join([
        f"# Multi-turn chats, host KV tier off and on ({res['device']}, {res['date']})", "",
        f"{w['conversations']} chats x {w['turns']} turns ({w['user_len']} user + "
        f"{w['reply_len']} reply tokens a turn), concurrency {w['concurrency']}, model "
        f"{w['model']}, device pool {w['kv_slots']} slots; the last turn's histories "
        f"total {w['working_set_tokens']} tokens ({w['working_set_tokens'] / w['kv_slots']:.1f}"
        f"x the pool).", "", *rows, "", f"git {res['git']}", ""])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="dummy:tiny on the CPU, tiny sizes")
    ap.add_argument("--model", default="dummy:llama3-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--conversations", type=int, default=200)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--user-len", type=int, default=256)
    ap.add_argument("--reply-len", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--working-set", type=float, default=3.0,
                    help="the last turn's histories over the device pool")
    ap.add_argument("--kv-slots", type=int, default=0, help="default: from --working-set")
    ap.add_argument("--host-kv-gib", type=float, default=48.0)
    ap.add_argument("--vocab", type=int, default=0, help="default: the dummy model's")
    ap.add_argument("--ready-timeout", type=float, default=300.0)
    ap.add_argument("--out-dir", default="bench/results")
    ap.add_argument("--tag", default=None)
    ap.add_argument("--server-args", nargs=argparse.REMAINDER, default=[])
    args = ap.parse_args(argv)
    if args.smoke:
        args.model, args.device, args.conversations, args.turns = "dummy:tiny", "cpu", 6, 3
        args.user_len, args.reply_len, args.concurrency = 16, 4, 4
        args.host_kv_gib, args.tag = 0.05, args.tag or "smoke"
        args.server_args = [*args.server_args, "--torch-threads", "1"]
    working_set = args.conversations * args.turns * (args.user_len + args.reply_len)
    args.kv_slots = args.kv_slots or max(int(working_set / args.working_set),
                                         args.turns * (args.user_len + args.reply_len) + 1)
    rounds = chat_turns(args.conversations, args.turns, args.user_len, args.reply_len,
                        _vocab(args.model, args.vocab), seed=0)
    out = Path(args.out_dir)
    work = out / "work"
    res = {"date": datetime.date.today().isoformat(), "device": device_name(), "git": git_rev(),
           "workload": {"model": args.model, "conversations": args.conversations,
                        "turns": args.turns, "user_len": args.user_len,
                        "reply_len": args.reply_len, "concurrency": args.concurrency,
                        "kv_slots": args.kv_slots, "working_set_tokens": working_set},
           "configs": {}}
    for name, gib in (("off", 0.0), (f"{args.host_kv_gib:g} GiB", args.host_kv_gib)):
        res["configs"][name] = run_config(args, name.replace(" ", ""), gib, rounds, work)
    tag = args.tag or ("h200" if args.device == "cuda" else "cpu")
    stem = out / f"{res['date']}-multiturn-{tag}"
    stem.with_suffix(".json").write_text(json.dumps(finite(res), indent=1))
    stem.with_suffix(".md").write_text(report(res))
    print(report(res))


if __name__ == "__main__":
    main()
