"""`SluiceIngress`: the Serve deployment that takes the HTTP requests (every route of the
server: OpenAI, SGLang, native, /metrics, /health) and relays each to a server replica.

The request goes to the replica Serve's router picks (prefix-aware: the prompt travels in
the `ForwardRequest`). A replica that fails before answering (it died, its server is gone)
costs a retry on another replica; once an answer has started, a failure ends a stream with
an OpenAI error event and `[DONE]`, and a whole answer with 502. Every answer names its
replica in `x-sluice-replica`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from runtime.ray_serve.forward import ForwardRequest, ReplyHead, forwarded_headers, prefix_key

log = logging.getLogger("sluice.ray_serve")
ATTEMPTS = 2  # a replica that fails before answering: one more, on another replica
REPLICA_HEADER = "x-sluice-replica"
DONE = b"data: [DONE]\n\n"


def error_body(message: str) -> dict:
    return {"error": {"message": message, "type": "server_error", "param": None,
                      "code": "replica_failed"}}


class SluiceIngress:
    def __init__(self, replicas: DeploymentHandle) -> None:
        self._replicas = replicas.options(stream=True)

    async def __call__(self, request: Request) -> Response:
        body = await request.body()
        req = ForwardRequest(request.method, request.url.path, request.url.query,
                             forwarded_headers(request.headers.items()), body, prefix_key(body))
        failure = None
        for _ in range(ATTEMPTS):
            stream = self._replicas.forward.remote(req)
            try:
                head: ReplyHead = await stream.__anext__()
                break
            except Exception as exc:  # whatever stopped the replica answering
                stream.cancel()
                log.warning("%s %s: a replica failed before answering: %r", req.method,
                            req.path, exc)
                failure = exc
        else:
            return JSONResponse(error_body(f"no replica answered: {failure!r}"), status_code=503)
        headers = {**dict(head.headers), REPLICA_HEADER: head.replica}
        if head.is_stream:
            return StreamingResponse(self._relay(stream, head.replica),
                                     status_code=head.status, headers=headers)
        try:
            content = b"".join([chunk async for chunk in stream])
        except Exception as exc:
            log.warning("%s: the answer from %s broke off: %r", req.path, head.replica, exc)
            return JSONResponse(error_body(f"the replica failed while answering: {exc!r}"),
                                status_code=502)
        return Response(content, status_code=head.status, headers=headers)

    async def _relay(self, stream: DeploymentResponseGenerator,
                     replica: str) -> AsyncIterator[bytes]:
        """The replica's SSE body; if the replica fails, an error event and `[DONE]`."""
        last = b"\n\n"
        try:
            async for chunk in stream:
                last = chunk or last
                yield chunk
        except Exception as exc:
            log.warning("a stream from %s ended with an error: %r", replica, exc)
            event = b"data: %b\n\n" % json.dumps(
                error_body(f"the replica failed while streaming: {exc!r}")).encode()
            # close an event the replica left half-sent
            yield (b"" if last.endswith(b"\n\n") else b"\n\n") + event + DONE
        finally:
            stream.cancel()
