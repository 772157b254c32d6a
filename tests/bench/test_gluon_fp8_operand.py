"""`python -m bench.probes.gluon_fp8_operand` compiles the fp8 V-operand probe for sm_90 without a
GPU: the loop builds its MMA operand in registers (PRMT + conversions), never byte by byte through
shared memory, at well under the quantized decode kernel's ~5 instructions a byte."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys

import pytest

from tests.bench.triton_pin import counts_measured


@functools.cache
def probe_output() -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # a real compile
    done = subprocess.run([sys.executable, "-m", "bench.probes.gluon_fp8_operand"], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.timeout(300)
def test_fp8_v_operand_is_built_in_registers():
    out = probe_output()
    mix = out.splitlines()[1]
    assert "HMMA" in mix and "PRMT" in mix and "F2FP.F16.E4M3.UNPACK_B" in mix
    assert "shared-memory instructions in the loop: 0" in out  # no shared-memory round trip


@counts_measured
@pytest.mark.timeout(300)
def test_fp8_v_operand_instructions_per_byte():
    out = probe_output()
    per_byte = float(re.search(r"= ([\d.]+) thread-instructions a byte", out).group(1))
    assert per_byte < 3.0, out
