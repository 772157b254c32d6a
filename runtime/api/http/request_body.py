"""Read an HTTP request's body up to a size limit (`--max-request-bytes`)."""

from __future__ import annotations

from starlette.requests import Request

from runtime.api.openai.protocol import ApiError

_MAX_LENGTH_DIGITS = 18  # a longer Content-Length is over any limit (and int() of it slow)


async def read_body(request: Request, limit: int) -> bytes:
    """The body of `request`, or `ApiError(413)` as soon as it is known to be over `limit`
    bytes: from its Content-Length before reading anything, else once the bytes read pass
    the limit (nothing more is read or kept). A client that disconnects meanwhile raises
    Starlette's `ClientDisconnect`."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and (len(length) > _MAX_LENGTH_DIGITS or int(length) > limit):
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"the request body is over {limit} bytes (--max-request-bytes)",
        code="request_too_large",
    )
