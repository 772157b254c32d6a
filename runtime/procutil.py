"""Helpers every server process uses: dying with its parent, logging setup, errors to text."""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback


def exit_with_parent(poll_s: float = 0.5) -> None:
    """Exit this process (hard) when the process that started it is gone: no orphans."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def setup_logging(name: str, level: str) -> logging.Logger:
    logging.basicConfig(
        level=level.upper(),
        format=f"%(asctime)s [{name}] %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    return logging.getLogger(f"sluice.{name}")


def error_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()
