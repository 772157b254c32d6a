"""Sluice runtime: `from runtime import Engine, SamplingParams`.

Names are imported lazily so that each server process loads only what it needs.
"""

from runtime.messages import InvalidRequest, SamplingParams

__all__ = ["Engine", "RequestOutput", "SamplingParams", "InvalidRequest"]


def __getattr__(name: str):
    if name in ("Engine", "RequestOutput"):
        from runtime import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")
