"""A stand-in peer engine for the `bench.peers` tests: it speaks the engine protocol
(`python -m tests.bench.fake_peer offline|serve`) without a model. Offline it returns
`max_tokens` tokens per prompt at once; served it is a small aiohttp server with /health,
/v1/models, an empty /metrics and a streaming /v1/completions of `max_tokens` one-token
chunks, so that the driver, the load generator and the report run as with a real peer."""

from __future__ import annotations

import json
import sys

from bench.peers.protocol import Job, main

MODEL = "fake-model"


class FakeOffline:
    name = "fake_peer"

    def start(self, job: Job) -> dict:
        return {"version": "0.0-fake", "import_s": 0.0, "defaults": {"max_num_seqs": 7}}

    def generate(self, prompts: list[list[int]], max_tokens: int) -> int:
        return sum(max_tokens for p in prompts if p)

    def stop(self) -> None:
        pass


def serve_argv(job: Job, port: int) -> list[str]:
    return [sys.executable, "-m", "tests.bench.fake_peer", "http", str(port)]


def http(port: int) -> None:
    from aiohttp import web

    async def health(_):
        return web.Response(text="ok")

    async def models(_):
        return web.json_response({"object": "list", "data": [{"id": MODEL, "root": MODEL}]})

    async def metrics(_):
        return web.Response(text="")

    async def completions(request):
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(obj) -> None:
            await resp.write(f"data: {json.dumps(obj)}\n\n".encode())

        n = body["max_tokens"]
        for i in range(n):
            await send({"choices": [{"index": 0, "text": " w5", "logprobs": {"tokens": ["w5"]},
                                     "finish_reason": "length" if i == n - 1 else None}]})
        prompt = body["prompt"]
        await send({"choices": [], "usage": {"completion_tokens": n, "prompt_tokens":
                                             len(prompt) if isinstance(prompt, list) else 1}})
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.add_routes([web.get("/health", health), web.get("/v1/models", models),
                    web.get("/metrics", metrics), web.post("/v1/completions", completions)])
    web.run_app(app, host="127.0.0.1", port=port, print=None)


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        http(int(sys.argv[2]))
    else:
        main(FakeOffline(), serve_argv)
