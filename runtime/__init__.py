"""Sluice runtime: `from runtime import Engine, SamplingParams`.

Names are imported lazily so that each server process loads only what it needs.
"""

from runtime.wire.errors import InvalidRequest
from runtime.wire.request_output import FinishReason, RequestOutput
from runtime.wire.sampling import SamplingParams

__all__ = ["Engine", "FinishReason", "RequestOutput", "SamplingParams", "InvalidRequest"]


def __getattr__(name: str):
    if name == "Engine":
        from runtime.engine import Engine

        return Engine
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")
