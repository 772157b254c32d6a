"""Per-GPU utilization and memory for `/metrics`, read from NVML at scrape time.

`GpuCollector` exports three gauge families, one sample per GPU of this server, labelled
`gpu` with the NVML index:
- `sluice_gpu_utilization_ratio`: the fraction of NVML's last sample period (1/6 s to 1 s,
  by GPU) during which a kernel ran on the device (NVML's "GPU utilization", / 100);
- `sluice_gpu_memory_used_bytes` / `sluice_gpu_memory_total_bytes`: device memory in use
  (by every process on the GPU, not only this server) and installed.

The GPUs of this server are the first `count` devices CUDA shows its workers (the entries
of CUDA_VISIBLE_DEVICES, NVML indices or UUIDs, when set), as the workers take `cuda:0`
upwards. Where there is no NVML (no `nvidia-ml-py`, no driver, a CPU server) the families
are still declared but hold no sample: the names stay the same on every host, and a query
for them returns an empty result instead of an error. A GPU NVML fails to read at a scrape
(fallen off the bus, a MIG slice without utilization counters) is left out of that scrape.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuReading:
    index: int  # NVML's
    utilization: float  # 0..1
    memory_used: int  # bytes
    memory_total: int  # bytes


class GpuCollector(Collector):
    """The GPU gauges of `/metrics` (see the module docstring). `count`: how many GPUs the
    server's workers use on this host (0 on the CPU); `nvml`: the NVML module (tests pass
    a fake; None imports `pynvml` from `nvidia-ml-py`)."""

    def __init__(self, count: int, nvml: Any = None) -> None:
        self._nvml = nvml
        self._handles: list = []
        self._failing: set[int] = set()  # positions already logged as unreadable
        if count > 0:
            self._handles = self._open(count)

    def _open(self, count: int) -> list:
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            nvml = self._nvml
            nvml.nvmlInit()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if visible is None:
                ids: list[str] = [str(i) for i in range(nvml.nvmlDeviceGetCount())]
            else:
                ids = [v.strip() for v in visible.split(",") if v.strip()]
            return [nvml.nvmlDeviceGetHandleByIndex(int(v)) if v.isdigit()
                    else nvml.nvmlDeviceGetHandleByUUID(v) for v in ids[:count]]
        except Exception as e:  # ImportError, or NVMLError: no driver, an unknown device
            log.info("no GPU metrics (NVML: %s)", e)
            return []

    def readings(self) -> list[GpuReading]:
        """One reading per GPU that NVML answers for now."""
        out = []
        for pos, handle in enumerate(self._handles):
            try:
                mem = self._nvml.nvmlDeviceGetMemoryInfo(handle)
                out.append(GpuReading(
                    self._nvml.nvmlDeviceGetIndex(handle),
                    self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0,
                    int(mem.used), int(mem.total)))
                self._failing.discard(pos)
            except Exception as e:  # NVMLError: lost, or no utilization counters
                if pos not in self._failing:
                    self._failing.add(pos)
                    log.warning("GPU %d of this server: NVML read failed (%s); left out of "
                                "/metrics until it reads again", pos, e)
        return out

    def collect(self) -> Iterator[Metric]:
        util = GaugeMetricFamily("sluice_gpu_utilization_ratio", "Fraction of NVML's last "
                                 "sample period in which a kernel ran on the GPU", labels=["gpu"])
        used = GaugeMetricFamily("sluice_gpu_memory_used_bytes", "GPU memory in use on the "
                                 "device (all processes), from NVML", labels=["gpu"])
        total = GaugeMetricFamily("sluice_gpu_memory_total_bytes", "GPU memory installed on "
                                  "the device, from NVML", labels=["gpu"])
        for r in self.readings():
            label = [str(r.index)]
            util.add_metric(label, r.utilization)
            used.add_metric(label, r.memory_used)
            total.add_metric(label, r.memory_total)
        yield from (util, used, total)
