"""Clients for the Ray Serve tests: streamed `/generate` requests from worker threads, each
outcome kept (status, replica, output ids, how the stream ended)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class Outcome:
    prompt: int
    status: int = 0
    replica: str = ""
    output_ids: list[int] = field(default_factory=list)
    finish: str | None = None  # the last event's finish reason
    done: bool = False  # `[DONE]` came
    error: str = ""  # an error event's message, or the client's exception
    started: float = 0.0  # monotonic times: the request sent, its answer's end
    ended: float = 0.0

    @property
    def whole(self) -> bool:
        """A 200 whose stream ran to its finish reason and `[DONE]`, with no error."""
        return self.status == 200 and self.done and self.finish is not None and not self.error


def stream_generate(url: str, prompt: list[int], max_tokens: int, index: int = 0,
                    on_head=None, client: httpx.Client | None = None) -> Outcome:
    """One streamed greedy `/generate` of `prompt`; `on_head(replica)` once headers came;
    `client`: the connection pool to send it on (default: a new one)."""
    out = Outcome(index, started=time.monotonic())
    body = {"input_ids": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0,
                                "ignore_eos": True}}
    try:
        send = httpx.stream if client is None else client.stream
        with send("POST", f"{url}/generate", json=body, timeout=120) as r:
            out.status, out.replica = r.status_code, r.headers.get("x-sluice-replica", "")
            if on_head is not None:
                on_head(out.replica)
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    out.done = True
                    continue
                event = json.loads(line[len("data: "):])
                if "error" in event:
                    out.error = event["error"]["message"]
                    continue
                out.output_ids = event["output_ids"]
                out.finish = (event["meta_info"].get("finish_reason") or {}).get("type")
    except httpx.HTTPError as exc:
        out.error = repr(exc)
    out.ended = time.monotonic()
    return out


class Load:
    """`concurrency` threads sending prompts back to back: request n sends
    `prompt(n) = (key, token ids)`, its outcome keeps the key."""

    def __init__(self, url: str, prompt, max_tokens: int) -> None:
        self.url, self.prompt, self.max_tokens = url, prompt, max_tokens
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._next = 0
        self._concurrency = 0
        self._threads: list[threading.Thread] = []

    def set_concurrency(self, n: int) -> None:
        """Run `n` clients (extra ones stop after their current request)."""
        self._concurrency = n
        for i in range(n):
            if i < len(self._threads) and self._threads[i].is_alive():
                continue
            t = threading.Thread(target=self._client, args=(i,), daemon=True)
            if i == len(self._threads):
                self._threads.append(t)
            else:
                self._threads[i] = t
            t.start()

    def _client(self, slot: int) -> None:
        with httpx.Client() as client:
            while slot < self._concurrency:
                with self._lock:
                    key, ids = self.prompt(self._next)
                    self._next += 1
                out = stream_generate(self.url, ids, self.max_tokens, key, client=client)
                with self._lock:
                    self.outcomes.append(out)

    def served_by(self, replica: str, after: float = 0.0) -> list[Outcome]:
        """The outcomes `replica` answered that ended after monotonic time `after`."""
        with self._lock:
            return [o for o in self.outcomes if o.replica == replica and o.ended > after]

    def open_at(self, moment: float) -> list[Outcome]:
        """The outcomes whose stream was open at monotonic time `moment`."""
        with self._lock:
            return [o for o in self.outcomes if o.started <= moment < o.ended]

    def replicas(self) -> list[str]:
        """The replicas that answered, in the order they first did."""
        with self._lock:
            return list(dict.fromkeys(o.replica for o in self.outcomes))

    def stop(self) -> list[Outcome]:
        self._concurrency = 0
        for t in self._threads:
            t.join(120)
        return list(self.outcomes)
