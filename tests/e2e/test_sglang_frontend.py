"""SGLang's own frontend (`import sglang as sgl`, `sgl.RuntimeEndpoint`) against `sluice
serve` (SmolLM2 on the CPU): gen with stop, select, fork, regex, run_batch, streaming,
and the endpoints the frontend calls besides `/generate` (`tests/e2e/sglang_program.py`,
in a process of its own).

Needs the `sglang` package (`make test` installs it without its GPU dependencies: see
the README's "Using SGLang's tools with Sluice"); skipped when it is missing.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import pytest

from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None,
    reason="the sglang package is not installed (see the README: Using SGLang's tools "
           "with Sluice)")
PROGRAM_TIMEOUT_S = 600  # a bound on the programs, never a timing assertion


@pytest.fixture(scope="module")
def ran():
    """What the programs produced against one server."""
    srv = ServerProcess()
    try:
        proc = subprocess.run([sys.executable, "-m", "tests.e2e.sglang_program", srv.http_url],
                              capture_output=True, text=True, timeout=PROGRAM_TIMEOUT_S)
    finally:
        srv.stop()
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_endpoint_reads_model_and_server_info(ran):
    assert ran["model_name"] == "smollm2"
    info = ran["server_info"]
    assert info["model_path"] == "smollm2" and len(info["internal_states"]) == 1
    assert info["internal_states"][0]["kv_cached"] == 0  # flushed after the requests


def test_gen_with_stop_and_streaming_agree(ran):
    assert ran["answer"] and "\n" not in ran["answer"]
    assert ran["streamed"] == ran["answer"]
    assert ran["answer_finish"]["type"] in ("stop", "length")


def test_select_and_regex(ran):
    assert ran["kind"] in ("person", "place", "thing")
    assert re.fullmatch(r"\d{4}", ran["year"]), ran["year"]


def test_fork_and_run_batch(ran):
    assert not ran["errors"]
    for text, tips in zip(ran["tip_texts"], ran["tips"], strict=True):
        assert text.startswith("Two tips about") and "Tip 1: " in text
        assert len(tips) == 2 and all("\n" not in tip for tip in tips)
