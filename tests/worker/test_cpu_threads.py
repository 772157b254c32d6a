"""The CPU worker's thread tuner: it settles on the count whose steps run fastest."""

from __future__ import annotations

import pytest
import torch

from runtime.config.checks import ConfigError
from runtime.config.server import ServerConfig
from runtime.wire.worker_channel import BatchPlan
from runtime.worker import cpu_threads
from runtime.worker.cpu_threads import ThreadTuner, candidates


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _plan(rows: int) -> BatchPlan:
    return BatchPlan(batch_id=0, rows=list(range(rows)), prefix_lens=[5] * rows,
                     extend_lens=[1] * rows, input_ids=[1] * rows, new_pages=[],
                     sample=[True] * rows)


def _run(tuner: ThreadTuner, steps: int, cost, rows: int = 4) -> None:
    """Feed `steps` steps whose time is `cost(threads now)`."""
    for _ in range(steps):
        tuner.observe(_plan(rows), cost(torch.get_num_threads()))


def test_candidates_are_one_half_and_all():
    assert candidates(2) == [1, 2]
    assert candidates(8) == [1, 4, 8]
    assert candidates(1) == [1]


def test_busy_machine_moves_to_fewer_threads_and_back_when_quiet():
    tuner = ThreadTuner([1, 2])
    assert torch.get_num_threads() == 2  # starts on all CPUs
    busy = {1: 0.10, 2: 0.25}  # two threads stall each other behind other processes
    _run(tuner, 200, busy.__getitem__)
    assert tuner.current == 1 and torch.get_num_threads() == 1
    quiet = {1: 0.10, 2: 0.06}
    _run(tuner, 200, quiet.__getitem__)
    assert tuner.current == 2 and torch.get_num_threads() == 2


def test_a_small_difference_keeps_the_current_count():
    tuner = ThreadTuner([1, 2])
    _run(tuner, 300, {1: 0.098, 2: 0.100}.__getitem__)  # 2% apart: below the margin
    assert tuner.current == 2
    # quiet-machine noise: one thread 10% faster on a probe does not give up a CPU
    _run(tuner, 300, {1: 0.090, 2: 0.100}.__getitem__)
    assert tuner.current == 2


def test_steps_of_changing_shape_never_switch_on_mixed_timings():
    tuner = ThreadTuner([1, 2])
    costs = {1: 0.01, 2: 0.5}
    for i in range(400):  # the batch size changes every other step: never comparable
        tuner.observe(_plan(1 + i % 2), costs[torch.get_num_threads()])
    assert tuner.current == 2 and torch.get_num_threads() == 2


def test_fixed_threads_and_single_cpu_need_no_tuner(monkeypatch):
    cpu = torch.device("cpu")
    assert ThreadTuner.for_worker(1, cpu) is None and torch.get_num_threads() == 1
    monkeypatch.setattr(cpu_threads, "usable_cpus", lambda: 1)
    assert ThreadTuner.for_worker(0, cpu) is None
    monkeypatch.setattr(cpu_threads, "usable_cpus", lambda: 4)
    assert ThreadTuner.for_worker(0, cpu, tp=2) is None and torch.get_num_threads() == 2
    tuner = ThreadTuner.for_worker(0, cpu)
    assert tuner is not None and tuner.counts == [1, 2, 4]


def test_negative_threads_are_refused():
    with pytest.raises(ConfigError, match="torch_threads"):
        ServerConfig(torch_threads=-1)
