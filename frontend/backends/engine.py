"""`EngineBackend`: programs run against an in-process `runtime.Engine`."""

from __future__ import annotations

from typing import Any

from frontend.backends.base import Backend, GenResult, OnText
from runtime.engine import Engine, RequestOutput
from runtime.messages import ModelInfo, SamplingParams


class EngineBackend(Backend):
    """Wraps an `Engine` the caller owns (and shuts down)."""

    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self.engine = engine

    def generate(self, prompt: str, params: dict[str, Any],
                 on_text: OnText | None = None) -> GenResult:
        if on_text is None:
            return _result(self.engine.generate(prompt, SamplingParams(**params))[0])
        chunks = []
        for chunk in self.engine.stream(prompt, SamplingParams(**params)):
            chunks.append(chunk)
            if chunk.text:
                on_text(chunk.text)
        return GenResult.from_chunks(chunks)

    def generate_batch(self, prompts: list[str], params: dict[str, Any]) -> list[GenResult]:
        return [_result(o) for o in self.engine.generate(prompts, SamplingParams(**params))]

    def _fetch_model_info(self) -> ModelInfo:
        return self.engine.model_info()

    def cache_stats(self) -> tuple[int, int]:
        stats = self.engine.stats()
        return stats.prefix_hit_tokens, stats.prefix_query_tokens


def _result(out: RequestOutput) -> GenResult:
    return GenResult(out.text, out.finish_reason, out.prompt_tokens, out.completion_tokens,
                     out.cached_tokens, out.input_logprobs, out.input_token_ids)
