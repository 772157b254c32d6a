"""`SglangServing`: SGLang's native HTTP API over the TokenizerManager.

- `/generate` in SGLang's form (`request` says which bodies are): one request per
  prompt and sample, all admitted together; a single prompt answers an object, a batch
  (or n > 1) a list in SGLang's order; `stream` sends cumulative events (`reply`),
  each item's own as its output grows (with `index` in a batch), then `data: [DONE]`.
- `/get_model_info`, `/model_info`: Sluice's `ModelInfo` plus SGLang's keys (`model_path`
  is the served model's name, as `/v1/models` lists it).
- `/server_info`, `/get_server_info`: the server's configuration (without the API key),
  SGLang's names for the limits, and the scheduler's latest stats as `internal_states`.
- `/flush_cache`: drops every cached prefix no request holds; refused (400) while
  requests wait or run, as SGLang refuses.
- `/health_generate`: generates one token end to end (503 if none comes in time).
- `/abort_request`: `{"rid": ...}` aborts that request, `{"abort_all": true}` all.
- `/encode` and `/tokenize`: a generative model has no embedding, so `/encode` answers
  what a prompt is to the model, its token ids, as `/tokenize` does:
  `{"tokens", "count", "max_model_len"}` (lists for a list of prompts).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from importlib.metadata import version
from typing import Any

import msgspec
import msgspec.structs

from runtime.api.openai.protocol import ApiError, api_error
from runtime.api.sglang.reply import SglOutput
from runtime.api.sglang.request import SglRequest
from runtime.api.sse import DONE, sse
from runtime.api.streams import EventStream, Guard, MergedStreams, collect, start_streams
from runtime.api.tokenizer_manager import TokenizerManager
from runtime.config.server import ServerConfig
from runtime.wire.api_input import SchedulerStats
from runtime.wire.sampling import SamplingParams

log = logging.getLogger(__name__)
HEALTH_GENERATE_TIMEOUT_S = 20.0  # SGLang's health-check timeout


class AbortRequest(msgspec.Struct, kw_only=True):
    """`/abort_request`'s body (SGLang's other fields are ignored, as SGLang does)."""

    rid: str = ""
    abort_all: bool = False


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """`/encode` (`text`) and `/tokenize` (`prompt`): the prompt(s) to tokenize."""

    text: str | list[str] | None = None
    prompt: str | list[str] | None = None
    add_special_tokens: bool = True
    model: str | None = None


class SglangServing:
    """SGLang's native endpoints; the HTTP front routes to these methods."""

    def __init__(self, tm: TokenizerManager, cfg: ServerConfig) -> None:
        self.tm = tm
        self.cfg = cfg
        self._hf_config = tm.spec.hf_config()
        self._texts: dict[int, str] = {}  # token id -> its text, for logprob entries

    # ------------------------------------------------------------ /generate
    async def generate(self, req: SglRequest, guard: Guard) -> Any:
        """The reply: an object, a list (a batch), or an `EventStream` with `stream`."""
        await self.tm.admit(len(req.items))
        token_text = self._token_text \
            if req.text_in_logprobs and self.tm.tokenizer is not None else None
        outputs, gens = [], []
        for k, item in enumerate(req.items):
            prompt, first = item.prompt, None
            if item.return_logprob and item.logprob_start_len == 0:
                # the first token is listed (with no logprob): it must be known here
                if isinstance(prompt, str):
                    prompt = await self.tm.tokenize(prompt)
                first = prompt[0] if prompt else None
            outputs.append(SglOutput(item, first_token=first, token_text=token_text,
                                     index=k if req.batch else None))
            gens.append(self.tm.generate(prompt, item.params, item.rid, stream=req.stream,
                                         given=item.given))
        streams, first_out = await start_streams(gens, guard)
        if req.stream:
            return EventStream(self._events(outputs, streams, first_out), streams)
        try:
            for index, out in [first_out] + await guard(collect(streams)):
                outputs[index].add(out)
        finally:
            await streams.aclose()
        bodies = [o.body() for o in outputs]
        return bodies if req.batch else bodies[0]

    async def _events(self, outputs: list[SglOutput], streams: MergedStreams,
                      first: tuple[int, Any]) -> AsyncIterator[bytes]:
        try:
            index, out = first
            while True:
                outputs[index].add(out)
                yield sse(outputs[index].body())
                nxt = await anext(streams, None)
                if nxt is None:
                    break
                index, out = nxt
        except Exception as e:  # the response has started: the error is the last event
            log.warning("SGLang-form stream ended with an error: %r", e)
            yield sse(api_error(e).body())
        finally:
            await streams.aclose()
        yield DONE

    def _token_text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self.tm.tokenizer.decode([token_id])
        return text

    # ------------------------------------------------------------ information
    def model_info(self) -> dict[str, Any]:
        """Sluice's `ModelInfo` and SGLang's `/model_info` keys."""
        hf = self._hf_config
        return {**msgspec.to_builtins(self.tm.model_info()),
                "model_path": self.cfg.model, "served_model_name": self.cfg.model,
                "tokenizer_path": self.tm.spec.tokenizer_path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": "default",
                "has_image_understanding": False, "has_audio_understanding": False,
                "model_type": getattr(hf, "model_type", None),
                "architectures": getattr(hf, "architectures", None)}

    async def server_info(self, stats: SchedulerStats | None) -> dict[str, Any]:
        """The configuration, the limits under SGLang's names, and the scheduler's latest
        `stats` (if any) as `internal_states`."""
        limits = await self.tm.wait_limits(self.cfg.ready_timeout)
        config = {k: v for k, v in dataclasses.asdict(self.cfg).items() if k != "api_key"}
        return {**msgspec.to_builtins(config),
                "model_path": self.cfg.model, "served_model_name": self.cfg.model,
                "tp_size": self.cfg.tp, "context_length": limits.max_context,
                "max_running_requests": limits.max_running,
                "max_total_num_tokens": limits.kv_slots,
                "internal_states": [] if stats is None else [msgspec.structs.asdict(stats)],
                "version": version("sluice"), "frontend": "sluice"}

    # ------------------------------------------------------------ control
    async def flush_cache(self) -> str:
        """Flush the prefix cache; `ApiError(400)` while requests wait or run."""
        reply = await self.tm.flush_cache()
        if not reply.ok:
            raise ApiError(400, f"Flush cache failed: {reply.message}")
        return f"Cache flushed ({reply.freed_tokens} cached tokens freed).\n"

    async def health_generate(self) -> None:
        """Generate one token end to end; `ApiError(503)` if it fails or takes too long."""
        params = SamplingParams(max_tokens=1, temperature=0.0)

        async def one_token() -> None:
            async with contextlib.aclosing(self.tm.generate([0], params, stream=False)) as gen:
                async for _ in gen:
                    pass

        try:
            await asyncio.wait_for(one_token(), HEALTH_GENERATE_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise ApiError(503, f"no token generated within {HEALTH_GENERATE_TIMEOUT_S:.0f} s",
                           "server_error") from None
        except Exception as e:
            err = api_error(e)
            raise ApiError(503, f"health generation failed: {err.message}",
                           "server_error") from None

    async def abort_request(self, req: AbortRequest, guard: Guard) -> None:
        """Abort the request with `req.rid` (none: nothing), or every request."""
        if req.abort_all:
            self.tm.abort_all()
        elif req.rid:
            self.tm.abort(req.rid)

    async def tokenize(self, req: TokenizeRequest, guard: Guard) -> dict[str, Any]:
        """The token ids of `text` (`/encode`) or `prompt` (`/tokenize`)."""
        prompts = req.text if req.text is not None else req.prompt
        if prompts is None:
            raise ApiError(400, "give the text to tokenize (`text` or `prompt`)")
        many = isinstance(prompts, list)
        ids = [await self.tm.tokenize(p, add_special_tokens=req.add_special_tokens)
               for p in (prompts if many else [prompts])]
        tokens, count = (ids, [len(i) for i in ids]) if many else (ids[0], len(ids[0]))
        return {"tokens": tokens, "count": count, "max_model_len": self.tm.context_len}
