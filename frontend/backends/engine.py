"""`EngineBackend`: programs run against an in-process `runtime.Engine`."""

from __future__ import annotations

from typing import Any

from frontend.backends.base import Backend, OnText, follow
from runtime.engine import Engine
from runtime.wire.model_info import ModelInfo
from runtime.wire.request_output import RequestOutput
from runtime.wire.sampling import SamplingParams


class EngineBackend(Backend):
    """Wraps an `Engine` the caller owns (and shuts down)."""

    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self.engine = engine

    def generate(self, prompt: str, params: dict[str, Any],
                 on_text: OnText | None = None) -> RequestOutput:
        if on_text is None:
            return self.engine.generate(prompt, SamplingParams(**params))[0]
        return follow(self.engine.stream(prompt, SamplingParams(**params)), on_text)

    def generate_batch(self, prompts: list[str],
                       params: dict[str, Any]) -> list[RequestOutput]:
        return self.engine.generate(prompts, SamplingParams(**params))

    def _fetch_model_info(self) -> ModelInfo:
        return self.engine.model_info()

    def cache_stats(self) -> tuple[int, int]:
        stats = self.engine.stats()
        return stats.prefix_hit_tokens, stats.prefix_query_tokens
