"""Groups replaying the hardening issue's defects: a million stop strings, a huge prompt,
new regexes beside a stream, one request taking all admission, ints beyond int64 and deep
nesting over HTTP, a newline or 1 MB rid, cached_tokens probing (`--no-cache-report`), and
`logit_bias` / `allowed_token_ids` out of bounds on every route.
Each expects a 4xx (or a 200 where the request is fine) and a prompt answer."""

from __future__ import annotations

import json
import threading
import time

import httpx

from tests.attack.harness import Tally, Target, generate_once

TIMEOUT_S = 120.0
BIG = 1 << 64


def _post(target: Target, path: str, body: dict | bytes, tally: Tally, what: str,
          expect: tuple[int, ...]) -> httpx.Response | None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        r = httpx.post(f"{target.url}{path}", content=content, timeout=TIMEOUT_S,
                       headers={"Content-Type": "application/json"})
    except httpx.TimeoutException:
        tally.lose(what)
        return None
    except httpx.HTTPError as e:
        tally.fail(f"{what}: {e!r}")
        return None
    tally.judge_status(r.status_code, what, expect)
    return r


def stop_strings(target: Target, tally: Tally, scale: str) -> None:
    count = 1_000_000 if scale == "full" else 100_000
    for path, body in (("/v1/completions", {"model": target.model, "prompt": "Hi",
                                            "max_tokens": 4}),
                       ("/generate", {"text": "Hi", "sampling_params": {"max_tokens": 4}})):
        many = [f"s{i}" for i in range(count)]
        if path == "/generate":
            body["sampling_params"]["stop"] = many
        else:
            body["stop"] = many
        _post(target, path, body, tally, f"{count} stop strings on {path}", (400, 413))
    _post(target, "/v1/completions", {"model": target.model, "prompt": "Hi", "max_tokens": 4,
                                      "stop": [f"s{i}" for i in range(16)]},
          tally, "16 stop strings", (200,))


def huge_prompt(target: Target, tally: Tally, scale: str) -> None:
    size = 50_000_000 if scale == "full" else 5_000_000
    rss = target.rss_mb()
    text = "x" * size
    for path, body in (("/v1/completions", {"model": target.model, "prompt": text,
                                            "max_tokens": 1}),
                       ("/generate", {"text": text}),
                       ("/v1/chat/completions", {"model": target.model, "max_tokens": 1,
                                                 "messages": [{"role": "user",
                                                               "content": text}]})):
        _post(target, path, body, tally, f"{size // 1_000_000} MB prompt on {path}", (413, 400))
    after = target.rss_mb()
    tally.checks["api_rss_mb_before_after"] = f"{rss} / {after}"


def regexes(target: Target, tally: Tally, scale: str) -> None:
    n = 8 if scale == "full" else 3
    gaps: list[float] = []

    def watch():  # one plain stream beside the regex requests: its longest gap
        body = {"model": target.model, "prompt": "Count: 1, 2, 3,", "max_tokens": 24,
                "temperature": 0, "stream": True, "ignore_eos": True}
        last = None
        with httpx.stream("POST", f"{target.url}/v1/completions", json=body,
                          timeout=TIMEOUT_S) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    now = time.monotonic()
                    if last is not None:
                        gaps.append(now - last)
                    last = now

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = []
    for i in range(n):
        body = {"text": "My code is", "sampling_params": {
            "max_tokens": 6, "temperature": 0, "regex": rf"[a-z]{{2,{3 + i}}}[0-9]{{{i + 1}}}"}}
        t = threading.Thread(target=_post, args=(target, "/generate", body, tally,
                                                 f"regex {i}", (200,)))
        t.start()
        threads.append(t)
    for t in threads:
        t.join(TIMEOUT_S)
    watcher.join(TIMEOUT_S)
    tally.checks["stream_max_gap_s"] = round(max(gaps), 2) if gaps else None


def admission(target: Target, tally: Tally, scale: str) -> None:
    for prompts, n in ((80, 16), (200, 16)):
        body = {"model": target.model, "prompt": [f"p{i}" for i in range(prompts)], "n": n,
                "max_tokens": 2}
        _post(target, "/v1/completions", body, tally, f"{prompts} prompts x n={n}", (400,))
    body = {"model": target.model, "prompt": ["a", "b"], "n": 2, "max_tokens": 2}
    _post(target, "/v1/completions", body, tally, "2 prompts x n=2", (200,))


def int64_and_nesting(target: Target, tally: Tally, scale: str) -> None:
    base = {"model": target.model, "prompt": "Hi", "max_tokens": 2}
    cases = [("/v1/completions", {**base, f: v}) for f in ("seed", "top_k", "priority")
             for v in (BIG, -BIG)]
    cases += [("/generate", {"text": "Hi", "sampling_params": {"seed": BIG}}),
              ("/generate", {"text": "Hi", "logprob_start_len": BIG}),
              ("/generate", {"text": "Hi", "priority": -BIG})]
    for path, body in cases:
        _post(target, path, body, tally, f"int64 on {path}: {list(body)[-1]}", (400,))
    for depth in (1000, 5000, 100_000):
        deep = b"[" * depth + b"]" * depth
        for path, body in (("/v1/completions", b'{"model": "m", "prompt": ' + deep + b"}"),
                           ("/generate", b'{"text": "Hi", "sampling_params": {"stop": '
                            + deep + b"}}")):
            _post(target, path, body, tally, f"nesting {depth} on {path}", (400, 413))


def bad_rids(target: Target, tally: Tally, scale: str) -> None:
    for rid in ("a\nINFO forged log line", "x" * 1_000_000, "", "\x00", "é" * 300):
        _post(target, "/generate", {"text": "Hi", "rid": rid,
                                    "sampling_params": {"max_tokens": 2}},
              tally, f"rid {rid[:20]!r} ({len(rid)} chars)", (200, 400, 413))


def cache_probe(target: Target, tally: Tally, scale: str) -> None:
    """With --no-cache-report, a right and a wrong guess of a cached prompt look alike."""
    secret = "The launch code of tenant A is 4711. Keep it safe."
    generate_once(target)
    _post(target, "/v1/completions", {"model": target.model, "prompt": secret, "max_tokens": 1},
          tally, "the secret prompt", (200,))
    cached = []
    for guess in (secret, secret.replace("4711", "1234")):
        r = _post(target, "/v1/completions", {"model": target.model, "prompt": guess,
                                              "max_tokens": 1}, tally, "a guess", (200,))
        if r is not None and r.status_code == 200:
            details = r.json()["usage"].get("prompt_tokens_details") or {}
            cached.append(details.get("cached_tokens", 0))
    tally.checks["cached_tokens_right_wrong"] = cached
    if len(set(cached)) > 1:
        tally.fail(f"cached_tokens tells the guesses apart: {cached}")


def token_bias(target: Target, tally: Tally, scale: str) -> None:
    """Bad `logit_bias` / `allowed_token_ids` on the four request forms: a 400 (or 413 for
    a map over the body limit); good ones, a 10,000-entry map included, a 200."""
    far = 10**9  # outside any vocabulary
    huge = {str(i): -1 for i in range(300_000 if scale == "full" else 100_000)}
    bad = [{"logit_bias": {"5": v}} for v in (100.5, -101, 1e308, "x", None, [1])]
    bad += [{"logit_bias": {k: 1}} for k in ("-1", "abc", "1e3", "", str(far), str(BIG))]
    bad += [{"logit_bias": v} for v in ([5], "x", 5)]
    bad += [{"allowed_token_ids": v} for v in ([], [far], [-1], ["5"], [BIG], 5)]
    good = [{"logit_bias": {"0": -100, "1": 100}}, {"allowed_token_ids": [5, 6, 7]},
            {"logit_bias": {str(i): -100 for i in range(10_000)}}]
    for fields, expect in [*[(f, (400,)) for f in bad], ({"logit_bias": huge}, (400, 413)),
                           *[(f, (200,)) for f in good]]:
        what = f"{str(fields)[:60]} ({len(json.dumps(fields))} bytes)"
        for path, body in _routes(target.model, fields):
            _post(target, path, body, tally, f"{what} on {path}", expect)
    regex = {"allowed_token_ids": [5], "regex": "a+"}
    _post(target, "/generate", {"text": "Hi", "sampling_params": regex}, tally,
          "allowed_token_ids with a regex", (400,))


def _routes(model: str, fields: dict) -> list[tuple[str, dict]]:
    """`fields` in a small request on each route: completions, chat, and /generate in
    Sluice's and SGLang's forms."""
    return [("/v1/completions", {"model": model, "prompt": "Hi", "max_tokens": 2, **fields}),
            ("/v1/chat/completions", {"model": model, "max_tokens": 2, **fields,
                                      "messages": [{"role": "user", "content": "Hi"}]}),
            ("/generate", {"text": "Hi", "sampling_params": {"max_tokens": 2, **fields}}),
            ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2, **fields}})]
