"""A live `sluice serve` (dummy:tiny on the CPU, with a host KV tier so the host-tier
families exist) whose /metrics names every deployment file is checked against."""

from __future__ import annotations

import httpx
import pytest

from tests.api.http_helpers import live_server, wait_until
from tests.deploy.metric_names import exported_names


@pytest.fixture(scope="session")
def live_names() -> set[str]:
    with live_server(model="dummy:tiny", device="cpu", kv_slots=512, host_kv_gib=0.01,
                     torch_threads=1) as srv:
        text = ""

        def stats_in() -> bool:  # the scheduler's first stats reply feeds the KV gauges
            nonlocal text
            text = httpx.get(f"{srv.url}/metrics", timeout=10).text
            return "\nsluice_num_requests_running " in text

        wait_until(stats_in, 60, "the scheduler's stats in /metrics")
        return exported_names(text)
