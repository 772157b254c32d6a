"""`--quantization fp8` served end to end (dummy:tiny on the CPU, dequantized there): the
weight format and the KV dtype show in /get_model_info and /metrics, and a bad value is
refused before anything starts."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from runtime.client import Client
from tests.e2e.server import ServerProcess


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--model", "dummy:tiny", "--quantization", "fp8", "--kv-dtype", "int8",
                        "--kv-slots", "512", "--log-level", "warning")
    yield srv
    srv.stop()


def test_fp8_server_generates_and_reports_its_formats(server):
    with Client(server.rpc_addr) as client:
        out = client.generate([5, 6, 7, 8], max_tokens=4, temperature=0.0, ignore_eos=True)
        assert len(out.token_ids) == 4
        rpc_info = client.model_info()
    assert rpc_info.quantization == "fp8" and rpc_info.kv_dtype == "int8"
    info = httpx.get(f"{server.http_url}/get_model_info", timeout=30).json()
    assert info["quantization"] == "fp8" and info["kv_dtype"] == "int8"
    metrics = httpx.get(f"{server.http_url}/metrics", timeout=30).text
    assert 'sluice_model_format{kv_dtype="int8",quantization="fp8"} 1.0' in metrics


def test_unknown_quantization_is_refused_at_start():
    proc = subprocess.run([sys.executable, "-m", "runtime.launch.cli", "serve", "--model",
                           "dummy:tiny", "--quantization", "int4"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "quantization must be one of ('none', 'fp8'), got 'int4'" in proc.stderr
