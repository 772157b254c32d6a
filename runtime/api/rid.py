"""Client-chosen request ids: bounded on the way in, escaped on the way into a log.

A rid is the caller's name for a request (`/generate`'s `rid`, an RPC request's `rid`);
the scheduler never sees it (the api keys its requests by an id of its own). It still
reaches log lines, where a newline could forge a line and a megabyte would be logged
whole: `loggable` escapes and shortens it.
"""

from __future__ import annotations

from runtime.wire.errors import InvalidRequest

MAX_RID_LEN = 256  # characters
LOG_RID_LEN = 64  # characters of a rid a log line shows


def check_rid(rid: str) -> str:
    """`rid`, or `InvalidRequest` if it is not a non-empty string of at most MAX_RID_LEN."""
    if not isinstance(rid, str) or not rid:
        raise InvalidRequest("rid must be a non-empty string")
    if len(rid) > MAX_RID_LEN:
        raise InvalidRequest(f"rid is {len(rid)} characters; at most {MAX_RID_LEN}")
    return rid


def loggable(rid: str) -> str:
    """`rid` safe for one log line: control and non-ASCII characters escaped, at most
    LOG_RID_LEN characters of it shown."""
    head = rid[:LOG_RID_LEN]
    text = head if head.isascii() and head.isprintable() else ascii(head)[1:-1]
    return text + "..." if len(rid) > LOG_RID_LEN else text
