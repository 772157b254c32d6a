"""Instruction counts hold for the Triton release they were measured on: another release
compiles the same kernel differently, so a count test skips there (the structural checks
beside it still run)."""

import pytest
import triton

MEASURED_ON = "3.6"  # the GPU machine's Triton, where the results files were measured

counts_measured = pytest.mark.skipif(
    not triton.__version__.startswith(MEASURED_ON + "."),
    reason=f"instruction counts were measured on Triton {MEASURED_ON}; "
           f"this is {triton.__version__}")
