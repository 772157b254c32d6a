"""Errors the serving front raises, shared by the api process and its clients.

`InvalidRequest` and its subclasses and `Unauthorized` are the caller's fault; every
`ServerError` is the server's, so a client can retry elsewhere or report it.
"""

from __future__ import annotations


class InvalidRequest(ValueError):
    """A request was rejected before it reached the scheduler (bad prompt or parameters)."""


class ServerError(RuntimeError):
    """The server could not complete a request."""


class EngineDeadError(ServerError):
    """A server process died (or the front was closed): nothing more will be served."""


class RequestFailed(ServerError):
    """The scheduler finished one request with an error; other requests are unaffected."""


class Overloaded(ServerError):
    """Too many requests in flight; retry later."""


class Unauthorized(PermissionError):
    """The server refused the client's API key (HTTP 401, RPC "unauthorized")."""


class ServerTimeout(ServerError, TimeoutError):
    """A client heard nothing from the server for longer than its timeout."""


class ContextLengthExceeded(InvalidRequest):
    """The prompt, or the prompt plus max_tokens, does not fit the context."""

    code = "context_length_exceeded"  # the OpenAI error code


class MessageTooLarge(InvalidRequest):
    """An RPC request larger than the server reads (its --max-request-bytes): the client
    does not send it, as the server would drop the connection unanswered."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the request is {size} bytes encoded, over the server's limit of "
                         f"{limit} bytes (--max-request-bytes)")
        self.size = size
        self.limit = limit
