"""Process lifecycle records: readiness, shutdown and a process's death."""

from __future__ import annotations

from runtime.wire.record import WireRecord


class Ready(WireRecord):
    """A server process's word to the supervisor that it started (`info`: what it reports)
    or could not (`error`)."""

    name: str
    info: dict[str, str] = {}
    error: str | None = None


class Shutdown(WireRecord):
    """Stop serving and exit (to the scheduler, and from it to the workers)."""


class ProcessDied(WireRecord):
    """Sent by the supervisor: a server process exited; fail everything in flight."""

    name: str
    exitcode: int | None = None
