"""`python -m bench.probes.sass` compiles the decode kernels for sm_90 on a machine without a
GPU and reads what ptxas made of them: the numbers the kernel notes in bench/results quote."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.probes.sass import main_loop
from tests.bench.triton_pin import counts_measured


def run_sass(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # a real compile
    done = subprocess.run([sys.executable, "-m", "bench.probes.sass", *args], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.timeout(300)
def test_fp8_decode_loop_widens_codes_and_uses_tensor_cores():
    out = run_sass("--kernel", "decode-fp8", "--block-n", "32", "--warps", "4", "--stages", "2")
    assert "warps an SM" in out
    assert "F2FP.F16.E4M3.UNPACK_B" in out  # e4m3 -> fp16 pairs in the loop
    assert "HMMA" in out  # both dots on tensor cores
    # a 32-key tile of fp8 K and V is 8 KB
    assert "for a 8 KB tile of K and V" in out


@pytest.mark.timeout(300)
def test_register_cap_holds_more_warps():
    free = run_sass("--kernel", "decode-16", "--block-n", "64", "--stages", "2")
    capped = run_sass("--kernel", "decode-16", "--block-n", "64", "--stages", "2",
                      "--maxnreg", "64")
    assert "registers 64," in capped.splitlines()[0]
    assert "registers 64," not in free.splitlines()[0]


def test_main_loop_is_the_longest_backward_branch():
    sass = "\n".join([
        "        /*0000*/                   MOV R1, c[0x0][0x28] ;",
        "        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;",
        "        /*0020*/                   FADD R3, R3, R4 ;",
        "        /*0030*/              @!P0 BRA 0x10 ;",
        "        /*0040*/                   FMUL R3, R3, R4 ;",
        "        /*0050*/               @P1 BRA 0x40 ;",
        "        /*0060*/                   EXIT ;",
    ])
    assert main_loop(sass) == ["IADD3", "FADD", "BRA"]


def gluon_decode_sass(pool: str) -> str:
    return run_sass("--kernel", f"decode-{pool}-gluon", "--heads", "32/8", "--block-n", "64",
                    "--stages", "2", "--top", "60")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("pool, widen", [("fp8", "F2FP.F16.E4M3.UNPACK_B"), ("int8", "HADD2")])
def test_gluon_decode_loop_copies_asynchronously_and_widens_in_registers(pool, widen):
    out = gluon_decode_sass(pool)
    assert "stack 0 B" in out, out  # nothing spills
    assert "LDGSTS.E.BYPASS.128" in out and "LDS.128" in out, out  # 16-byte cp.async, loads
    assert "LDS.U8" not in out and "PRMT" in out and "HMMA" in out and widen in out, out


@counts_measured
@pytest.mark.timeout(300)
@pytest.mark.parametrize("pool", ["fp8", "int8"])
def test_gluon_decode_loop_instructions_per_byte(pool):
    out = gluon_decode_sass(pool)
    per_byte = float(out.split("= ")[1].split(" thread-instructions")[0])
    assert per_byte < 5.6, out  # 4.5 (fp8) and 5.1 (int8) on Triton 3.6; Triton's kernel: 5.1
