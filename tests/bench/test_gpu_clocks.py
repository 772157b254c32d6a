"""`bench.probes.gpu_clocks`: the summary of sampled clocks a bench prints beside its times, and the
sampler's quiet absence where there is no GPU."""

from __future__ import annotations

import pytest

from bench.probes.gpu_clocks import ClockSampler, summarize

LINES = [  # clocks.sm, power.draw, clocks_event_reasons.active (as nvidia-smi prints them)
    "345, 81.40, 0x0000000000000001",  # idle: not counted as busy
    "1980, 130.20, 0x0000000000000000",
    "1440, 695.06, 0x0000000000000004",  # at the power cap
    "1725, 696.21, 0x0000000000000004",
    "1980, 412.26, 0x0000000000000000",
    "1530, [N/A], 0x0",  # unreadable: skipped
    "17",  # a line cut short when the sampler stopped
]


def test_summary_counts_only_busy_samples_and_the_power_cap_share():
    s = summarize(LINES)
    assert s["samples"] == 5 and s["busy_samples"] == 3
    assert s["busy_sm_mhz_median"] == 1725 and s["busy_sm_mhz_min"] == 1440
    assert s["power_w_max"] == pytest.approx(696.21)
    assert s["busy_power_capped"] == pytest.approx(2 / 3)


def test_summary_of_an_idle_or_empty_run():
    idle = summarize(LINES[:2])
    assert idle["busy_samples"] == 0 and idle["busy_sm_mhz_median"] is None
    assert idle["busy_power_capped"] == 0.0
    assert summarize([]) is None and summarize(["garbage"]) is None


def test_sampler_without_nvidia_smi_gives_no_summary(monkeypatch):
    monkeypatch.setenv("PATH", "")
    with ClockSampler() as clocks:
        pass
    assert clocks.summary is None
