"""One Engine (overlap on, chunked prefill) and one HF reference for the frontend tests."""

from __future__ import annotations

import pytest

from runtime import Engine
from tests.frontend.hf_scores import HFScores


@pytest.fixture(scope="package")
def engine():
    with Engine(model="smollm2", chunk_size=32, torch_threads=2) as eng:
        yield eng


@pytest.fixture(scope="package")
def hf():
    return HFScores()
