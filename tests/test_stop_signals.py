"""`StopSignals`, the flag a launcher's SIGTERM / SIGINT set: every signal is recorded and
`wait` returns as soon as one came (or False at its timeout)."""

from __future__ import annotations

import os
import signal

from runtime.procutil import StopSignals


def test_signals_set_it_and_wait_returns_at_once():
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        stop = StopSignals((signal.SIGUSR2,))
        assert not stop.is_set() and stop.wait(0.05) is False
        for _ in range(3):
            os.kill(os.getpid(), signal.SIGUSR2)
        assert stop.wait() is True and stop.is_set()
        assert set(stop.received) == {signal.SIGUSR2}
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_a_signal_inside_the_handler_is_recorded_too():
    """A second signal while the first one's handler runs: both recorded, nothing hangs."""
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        stop = StopSignals((signal.SIGUSR2,))
        record = signal.getsignal(signal.SIGUSR2)

        def first(sig, frame):
            signal.signal(signal.SIGUSR2, record)
            os.kill(os.getpid(), signal.SIGUSR2)  # lands while this handler runs
            record(sig, frame)

        signal.signal(signal.SIGUSR2, first)
        os.kill(os.getpid(), signal.SIGUSR2)
        assert stop.wait(5) and stop.received == [signal.SIGUSR2, signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, previous)
