"""Shared test setup: Triton runs interpreted without CUDA; GPU-marked tests skip there."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton chooses compiled vs interpreted when a kernel module is imported: decide first.
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The test process computes on one torch thread: its models are tiny, and on a busy machine
# a second thread mostly waits at the barrier that ends each parallel region (a step can run
# many times slower). Tests of thread tuning set their own counts; servers started as
# subprocesses get theirs from their flags.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
