"""Group `http_malformed`: about a thousand malformed HTTP inputs, each expecting an answer
under 500: every field of the three POST routes set to each bad value, malformed tools
and tool calls, the LoRA adapter fields (`lora_path`, `sampling_params.lora`, a `model`
naming an adapter) set to each bad value, bodies that are not JSON or not objects, wrong
content types, methods and paths, and raw bytes that are not HTTP (read from a socket: an
answer or a close is fine, silence is lost)."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.attack.harness import Tally, Target

BAD_VALUES = [None, -1, 0, 1.5, "x", "", [], {}, True, 1 << 64, -(1 << 63) - 1, "\u0000\n",
              "y" * 10_000, [[[[[]]]]], {"a": {"b": {}}}, -1e308]
# fields whose missing or null value means "as long as the context allows": never emptied
LENGTH_FIELDS = {"max_tokens", "max_completion_tokens"}
ROUTES = {
    "/v1/completions": {"model": "MODEL", "prompt": "Hi", "max_tokens": 2, "temperature": 0,
                        "top_p": 1.0, "n": 1, "stop": ["\n"], "seed": 1, "stream": False,
                        "logprobs": None, "top_k": 5, "priority": 0, "presence_penalty": 0.0,
                        "frequency_penalty": 0.0, "stream_options": None, "user": "u",
                        "min_p": 0.0, "repetition_penalty": 1.0, "stop_token_ids": [],
                        "ignore_eos": False, "logit_bias": {"50": 1.0}},
    "/v1/chat/completions": {"model": "MODEL", "messages": [{"role": "user", "content": "Hi"}],
                             "max_tokens": 2, "temperature": 0, "top_p": 1.0, "n": 1,
                             "stop": None, "seed": 1, "stream": False, "logprobs": False,
                             "top_logprobs": None, "response_format": None, "tools": None,
                             "tool_choice": None, "parallel_tool_calls": None,
                             "chat_template_kwargs": None,
                             "max_completion_tokens": 2, "priority": 0, "user": "u",
                             "logit_bias": {"50": -1.0}, "allowed_token_ids": [50, 51]},
    "/generate": {"text": "Hi", "sampling_params": {"max_tokens": 2, "temperature": 0,
                                                    "stop": [], "top_k": 1},
                  "stream": False, "rid": "r", "priority": 0, "return_logprob": False,
                  "logprob_start_len": -1, "ignore_eos": False, "input_ids": None},
}
RAW = [b"GARBAGE\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc",
       b"GET /health\r\n\r\n", b"GET /health HTTP/1.1\r\n" + b"X: " + b"a" * 100_000 + b"\r\n\r\n",
       b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-A: b\r\n" * 2000 + b"\r\n",
       b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
       b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
       b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n",
       b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n"
       b"Content-Length: 9\r\n\r\n{}",
       b"GET /\x00health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
       b"GET /health HTTP/1.1\nHost: 127.0.0.1\n\n",
       b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
       b"Content-Length: 10\r\n\r\n{\"a\":",
       b"\r\n" * 1000, b"GET " + b"/a" * 40_000 + b" HTTP/1.1\r\n\r\n"]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
BAD_TOOLS = [  # each a `tools` value: no name, parameters not a schema, too many, too large
    [{"type": "function", "function": {"description": "no name"}}],
    [{"type": "function", "function": {"name": "f", "parameters": "{}"}}],
    [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
    [{"type": "function", "function": {"name": "f\n\"<tool_call>"}}],
    [{"type": "retrieval"}], [TOOL, TOOL],
    [{"type": "function", "function": {"name": f"f{i}"}} for i in range(1000)],
    [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "description": "x" * (10 << 20)}}}],
]
BAD_TOOL_FIELDS = [  # other fields of a chat request with tools
    {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
    {"tools": [TOOL], "tool_choice": "sometimes"}, {"tool_choice": "required"},
    {"tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}},
    {"chat_template_kwargs": {"tokenize": True}},
    {"chat_template_kwargs": {"add_generation_prompt": False, "x": [1] * 100}},
    {"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                         "function": {"name": "f",
                                                                      "arguments": "{x"}}]}]},
    {"messages": [{"role": "assistant", "content": None, "tool_calls": []},
                  {"role": "tool", "content": None, "tool_call_id": 5}]},
    {"messages": [{"role": "user", "content": "Hi", "tool_calls": [{"id": "c", "function": {
        "name": "f", "arguments": "{}"}}]}]},
]
REQUEST_TIMEOUT_S = 300.0  # long prompts queue behind each other on two shared cores
THREADS = 8


def corpus(model: str) -> list[tuple[str, str, dict[str, str], bytes]]:
    """(method, path, headers, body) for every malformed input, in a fixed order."""
    json_ct = {"Content-Type": "application/json"}
    items = []
    for path, base in ROUTES.items():
        base = json.loads(json.dumps(base).replace("MODEL", model))
        for name in base:
            values = BAD_VALUES + ([] if name in LENGTH_FIELDS else ["<missing>"])
            for value in values:
                body = dict(base)
                if value == "<missing>":
                    del body[name]
                elif value is None and name in LENGTH_FIELDS:
                    continue
                else:
                    body[name] = value
                items.append(("POST", path, json_ct, json.dumps(body).encode()))
        if path == "/v1/chat/completions":
            for extra in [{"tools": t} for t in BAD_TOOLS] + BAD_TOOL_FIELDS:
                items.append(("POST", path, json_ct, json.dumps({**base, **extra}).encode()))
        for top in (b"[]", b'"x"', b"1", b"null", b"", b"{", b'{"a": NaN}', b"\xff\xfe",
                    b"\xef\xbb\xbf{}", b'{"model": "' + model.encode() + b'"}' + b"x" * 3,
                    b"{" * 5000 + b"}" * 5000):
            items.append(("POST", path, json_ct, top))
        good = json.dumps(base).encode()
        for ct in ("text/plain", "", "multipart/form-data; boundary=x",
                   "application/x-www-form-urlencoded"):
            items.append(("POST", path, {"Content-Type": ct} if ct else {}, good))
        for method in ("GET", "PUT", "DELETE", "PATCH"):
            items.append((method, path, json_ct, good))
        items.append(("POST", path, {**json_ct, "Host": "evil.example"}, good))
    items += [("POST", path, json_ct, json.dumps(body).encode())
              for path, body in lora_bodies(model)]
    for path in ("/v1/embeddings", "/../../etc/passwd", "/" + "a" * 5000, "/metrics?x=%ff",
                 "/health/../generate", "/v1/models/none", f"/v1/models/{model}:none"):
        items.append(("GET", path, {}, b""))
    return items


def lora_bodies(model: str) -> list[tuple[str, dict]]:
    """Requests of LoRA adapters the server does not have, by each field that names one."""
    out = []
    for value in BAD_VALUES + ["nope", "../../etc", model]:
        out.append(("/generate", {"text": "Hi", "lora_path": value,
                                  "sampling_params": {"max_new_tokens": 2}}))
        out.append(("/generate", {"text": "Hi", "sampling_params": {"max_tokens": 2,
                                                                     "lora": value}}))
        if isinstance(value, str):
            out.append(("/v1/completions", {"model": f"{model}:{value}", "prompt": "Hi",
                                            "max_tokens": 2}))
    out.append(("/generate", {"text": ["a", "b"], "lora_path": ["nope"]}))
    return out


def malformed_http(target: Target, tally: Tally, scale: str) -> None:
    items = corpus(target.model)
    raw = RAW
    if scale == "small":
        items, raw = items[::10], raw[::3]
    with httpx.Client(base_url=target.url, timeout=REQUEST_TIMEOUT_S) as client, \
            ThreadPoolExecutor(THREADS) as pool:
        for status, what in pool.map(lambda item: _send(client, *item), items):
            tally.judge_status(status, what)
        for answer, what in pool.map(_send_raw, [(target, data) for data in raw]):
            if answer is None:
                tally.lose(what)
            elif answer.startswith(b"HTTP/1.1 5"):
                tally.fail(f"{what}: {answer[:40]!r}")
            else:
                tally.ok()


def _send(client: httpx.Client, method: str, path: str, headers: dict[str, str],
          body: bytes) -> tuple[int | None, str]:
    what = f"{method} {path[:40]} {body[:80]!r}"
    try:
        r = client.request(method, path, headers=headers, content=body or None)
        return r.status_code, what
    except httpx.TimeoutException:
        return None, what
    except httpx.HTTPError:  # the server closed the connection: a refusal, not silence
        return 0, what


def _send_raw(args: tuple[Target, bytes]) -> tuple[bytes | None, str]:
    """Send raw bytes; what came back before the server closed (b"" for a plain close),
    None if nothing came and the connection stayed open past the bound."""
    target, data = args
    what = f"raw {data[:40]!r}"
    port = int(target.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=REQUEST_TIMEOUT_S) as s:
        try:
            s.sendall(data)
        except OSError:  # closed on us mid-send: refused
            return b"", what
        try:
            return s.recv(4096), what
        except TimeoutError:
            return None, what
        except OSError:
            return b"", what
