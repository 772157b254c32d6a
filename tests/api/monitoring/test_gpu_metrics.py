"""GPU utilization and memory in /metrics, read through a fake NVML module."""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from runtime.api.monitoring.gpu_metrics import GpuCollector
from runtime.api.monitoring.metrics import Metrics
from runtime.api.timing import RequestTimings

GIB = 1 << 30
FAMILIES = ("sluice_gpu_utilization_ratio", "sluice_gpu_memory_used_bytes",
            "sluice_gpu_memory_total_bytes")


class NVMLError(Exception):
    pass


class FakeNvml:
    """NVML's calls the collector makes, over `gpus`: NVML index -> (util %, used, total),
    UUID `GPU-<index>`; `broken`: indices whose reads raise; `present=False`: no driver."""

    def __init__(self, gpus: dict[int, tuple[int, int, int]], present: bool = True) -> None:
        self.gpus, self.present, self.broken = gpus, present, set()
        self.inits = 0

    def nvmlInit(self):
        self.inits += 1
        if not self.present:
            raise NVMLError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if i not in self.gpus:
            raise NVMLError("Invalid Argument")
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return int(uuid.removeprefix("GPU-"))

    def nvmlDeviceGetIndex(self, h):
        return h

    def _read(self, h):
        if h in self.broken:
            raise NVMLError("GPU is lost")
        return self.gpus[h]

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self._read(h)[0], memory=0)

    def nvmlDeviceGetMemoryInfo(self, h):
        _, used, total = self._read(h)
        return SimpleNamespace(used=used, total=total, free=total - used)


def scrape(metrics: Metrics) -> dict[str, dict[str, float]]:
    """Family name -> {gpu label: value} for the GPU families of the rendered text."""
    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(metrics.render().decode()):
        if fam.name in FAMILIES:
            out[fam.name] = {s.labels["gpu"]: s.value for s in fam.samples}
    return out


def metrics_with(nvml, count: int) -> Metrics:
    return Metrics(RequestTimings(), GpuCollector(count, nvml))


@pytest.fixture(autouse=True)
def no_visible_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_each_gpu_exports_utilization_and_memory():
    nvml = FakeNvml({0: (87, 70 * GIB, 141 * GIB), 1: (12, 3 * GIB, 141 * GIB)})
    got = scrape(metrics_with(nvml, 2))
    assert got == {"sluice_gpu_utilization_ratio": {"0": 0.87, "1": 0.12},
                   "sluice_gpu_memory_used_bytes": {"0": 70 * GIB, "1": 3 * GIB},
                   "sluice_gpu_memory_total_bytes": {"0": 141 * GIB, "1": 141 * GIB}}


def test_only_the_servers_gpus_are_exported(monkeypatch):
    nvml = FakeNvml({i: (10 * i, i * GIB, 80 * GIB) for i in range(8)})
    assert scrape(metrics_with(nvml, 2))["sluice_gpu_utilization_ratio"] == {"0": 0.0,
                                                                            "1": 0.1}
    # CUDA_VISIBLE_DEVICES names the devices by NVML index or UUID; the workers take the
    # first of them; more GPUs asked than visible: those visible
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5, GPU-3,7")
    assert scrape(metrics_with(nvml, 2))["sluice_gpu_memory_used_bytes"] == {"5": 5 * GIB,
                                                                           "3": 3 * GIB}
    assert set(scrape(metrics_with(nvml, 4))["sluice_gpu_utilization_ratio"]) == {"5", "3",
                                                                                 "7"}


@pytest.mark.parametrize("nvml", [FakeNvml({}, present=False), "no module"])
def test_without_nvml_the_families_are_declared_and_empty(nvml, monkeypatch):
    if nvml == "no module":  # nvidia-ml-py not installed: the import fails
        monkeypatch.setitem(sys.modules, "pynvml", None)
        nvml = None
    m = metrics_with(nvml, 1)
    assert scrape(m) == {name: {} for name in FAMILIES}
    text = m.render().decode()
    assert "# TYPE sluice_gpu_utilization_ratio gauge" in text
    assert "\nsluice_gpu_utilization_ratio{" not in text


def test_a_cpu_server_never_asks_nvml():
    nvml = FakeNvml({0: (50, GIB, 2 * GIB)})
    assert scrape(metrics_with(nvml, 0)) == {name: {} for name in FAMILIES}
    assert nvml.inits == 0


def test_a_gpu_that_fails_to_read_is_left_out_until_it_reads_again(caplog):
    nvml = FakeNvml({0: (40, GIB, 8 * GIB), 1: (60, 2 * GIB, 8 * GIB)})
    m = metrics_with(nvml, 2)
    nvml.broken.add(1)
    with caplog.at_level(logging.WARNING, logger="runtime.api.monitoring.gpu_metrics"):
        assert scrape(m)["sluice_gpu_utilization_ratio"] == {"0": 0.4}
        assert scrape(m)["sluice_gpu_memory_total_bytes"] == {"0": 8 * GIB}
    assert len([r for r in caplog.records if "GPU 1" in r.message]) == 1  # logged once
    nvml.broken.clear()
    assert scrape(m)["sluice_gpu_utilization_ratio"] == {"0": 0.4, "1": 0.6}
