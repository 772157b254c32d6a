"""Helpers every server process uses: logging setup, errors to text, IPC files removed, the
signal its supervisor stops it with, and the stop flag a supervisor's signals set."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import glob
import logging
import os
import signal
import socket
import time
import traceback

# How a supervisor (the launcher, a replica) tells one of its server processes to stop:
# not SIGTERM, which systemd (KillMode=control-group) and `kill -- -PGID` send to every
# process at once. The processes ignore SIGTERM and SIGINT and leave stopping to their
# supervisor, which drains the api first and then stops the rest, as for a SIGTERM sent to
# it alone. The api drains on this signal; for the others it keeps its default (exit).
STOP_SIGNAL = signal.SIGUSR1
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)  # loaded in the parent: a forked child only calls it


def free_port() -> int:
    """A loopback port free now (it may be taken before it is used)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StopSignals:
    """A stop flag that `signals` set, with `threading.Event`'s `is_set` and `wait` but no
    lock: a handler that takes one (as `Event.set` does) deadlocks when a second signal
    lands while the first handler holds it (`kill` twice, or a SIGTERM to the process and
    to its group at once). `wait` polls, so the main thread stays free to run handlers."""

    POLL_S = 0.1

    def __init__(self, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> None:
        self.received: list[int] = []  # appending is atomic: safe in a handler
        for sig in signals:
            signal.signal(sig, lambda sig, _frame: self.received.append(sig))

    def is_set(self) -> bool:
        return bool(self.received)

    def wait(self, timeout: float | None = None) -> bool:
        """Until a signal came or `timeout` s passed; whether one came."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.received:
            left = self.POLL_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(left, self.POLL_S))
        return bool(self.received)


def die_with_parent(parent: int, sig: signal.Signals) -> None:
    """In a child before exec (`preexec_fn`): the kernel sends it `sig` when its parent
    dies; if the parent (pid `parent`) died before that took effect, exit at once."""
    _libc.prctl(_PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:
        os._exit(1)


def setup_logging(name: str, level: str) -> logging.Logger:
    logging.basicConfig(
        level=level.upper(),
        format=f"%(asctime)s [{name}] %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    return logging.getLogger(f"sluice.{name}")


def freeze_startup_heap() -> None:
    """Move every object alive after start-up (modules, the model's tokenizer and config,
    the sockets) out of the garbage collector's reach: a serving process allocates
    short-lived containers on every step, and each full collection would otherwise walk
    that whole start-up heap again (milliseconds per collection in the api process)."""
    gc.collect()
    gc.freeze()


def error_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def startup_failure(log: logging.Logger, name: str, exc: BaseException,
                    expected: tuple[type[BaseException], ...]) -> str:
    """Why process `name` failed to start, as one line for its supervisor to print. An
    `expected` error (in the model, files or options the user named) is its message alone,
    its traceback logged at debug level only; anything else is named with its type and
    its traceback logged at error level."""
    if isinstance(exc, expected):
        log.debug("%s failed to start", name, exc_info=exc)
        return str(exc)
    log.error("%s failed to start", name, exc_info=exc)
    return error_text(exc)


def remove_ipc_files(ipc_dir: str, run_id: str) -> None:
    """Remove one server's IPC socket files (`<run_id>-*`; a closed ZMQ socket leaves its
    file behind), then `ipc_dir` itself once nothing else is in it."""
    for path in glob.glob(os.path.join(glob.escape(ipc_dir), f"{glob.escape(run_id)}-*")):
        with contextlib.suppress(OSError):
            os.unlink(path)
    with contextlib.suppress(OSError):  # not empty: another server's, or someone's files
        os.rmdir(ipc_dir)
