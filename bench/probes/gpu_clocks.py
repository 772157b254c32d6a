"""What the GPU's clocks did during a run: `nvidia-smi` sampled in the background.

A compute-bound phase can hold a GPU at its power cap; the H200 then lowers its SM clock from
1,980 MHz to 1,440-1,800 MHz (`bench/results/modes/2026-12-03-prefill-slow-mode-h200.md`). Two
runs compared as a ratio mean little unless both ran at like clocks, so benches that time
prefill record them beside their times. `ClockSampler` samples the SM clock, the power draw
and the clock-event reasons every `period_ms` while open; `summarize` reduces the samples
drawn while the GPU was busy (power at or over `busy_w`).

    with ClockSampler() as clocks:
        ...  # the timed work, in this process or a child
    clocks.summary  # None where nvidia-smi is missing (the CPU)
"""

from __future__ import annotations

import shutil
import statistics
import subprocess

QUERY = "clocks.sm,power.draw,clocks_event_reasons.active"
POWER_CAP = 0x4  # clocks_event_reasons bit: software power cap


def summarize(lines: list[str], busy_w: float = 300.0) -> dict | None:
    """Summary of `nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits` lines (first
    GPU's): sample counts, the busy samples' median and lowest SM clock (MHz), the highest
    power (W), and the share of busy samples held at the power cap. None without samples."""
    rows = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        try:
            rows.append((float(parts[0]), float(parts[1]), int(parts[2], 16)))
        except (IndexError, ValueError):
            continue  # a partial last line, or "[N/A]"
    if not rows:
        return None
    busy = [r for r in rows if r[1] >= busy_w]
    mhz = [r[0] for r in busy]
    return {
        "samples": len(rows),
        "busy_samples": len(busy),
        "busy_sm_mhz_median": statistics.median(mhz) if mhz else None,
        "busy_sm_mhz_min": min(mhz) if mhz else None,
        "power_w_max": max(r[1] for r in rows),
        "busy_power_capped": sum(r[2] & POWER_CAP != 0 for r in busy) / len(busy) if busy else 0.0,
    }


class ClockSampler:
    """Context manager: samples the GPU's clocks while open; `summary` after it closes."""

    def __init__(self, period_ms: int = 250, busy_w: float = 300.0):
        self.period_ms, self.busy_w = period_ms, busy_w
        self.summary: dict | None = None
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> ClockSampler:
        exe = shutil.which("nvidia-smi")
        if exe is not None:
            cmd = [exe, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-i", "0",
                   f"--loop-ms={self.period_ms}"]  # fmt: skip
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, text=True)  # fmt: skip
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        out, _ = self._proc.communicate(timeout=10)
        self.summary = summarize(out.splitlines(), self.busy_w)
