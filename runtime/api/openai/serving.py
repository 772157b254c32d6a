"""`OpenAIServing`: `/v1/completions` and `/v1/chat/completions` over the TokenizerManager.

Each choice (n per prompt) runs as its own request (`rid = <response id>-<choice>`, seed
+ choice when a seed is given); their streams are merged. A call is admitted whole: all
its choices count against the per-request cap and the queue (see `api/admission.py`).
The first chunk is awaited before anything is returned, so a request rejected by
validation, by the queue limit or by the scheduler still gets a proper HTTP status;
after that, a stream ends with an error event and `[DONE]`. The responses and stream
events are built by the call's `Call` (`call.py`).

Completions with `echo` return the prompt before each choice's text (in a stream, in its
first chunk); with `logprobs` too, the prompt's tokens and logprobs come first in the
choice's `logprobs` (see `logprobs`): the prompt is tokenized here, so its first
token is known, and scored from position 0 (`SamplingParams.logprob_start_len`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator

import msgspec

from runtime.api.openai.call import Call
from runtime.api.openai.chat_parsing import ChatParsing
from runtime.api.openai.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    api_error,
    check_chat,
    check_completion,
    given_fields,
    prompt_list,
    to_params,
)
from runtime.api.sse import DONE, sse
from runtime.api.streams import EventStream, Guard, MergedStreams, collect, start_streams
from runtime.api.tokenizer_manager import TokenizerManager
from runtime.wire.request_output import RequestOutput
from runtime.wire.sampling import SamplingParams

log = logging.getLogger(__name__)
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class OpenAIServing:
    """Builds OpenAI responses (whole, or as SSE byte chunks) from request streams."""

    def __init__(self, tm: TokenizerManager, model_names: tuple[str, ...]) -> None:
        self.tm = tm
        self.model_names = model_names
        self.parsing = ChatParsing(tm.cfg, tm.tokenizer)

    def check_model(self, name: str) -> str | None:
        """The LoRA adapter that model `name` picks: None for the base model, the adapter
        for `"<adapter>"` or `"<base>:<adapter>"`. An unknown adapter of the base is a
        400, any other unknown name a 404 (both naming `model`)."""
        if name in self.model_names:
            return None
        if name in self.tm.lora_names:
            return name
        for base in self.model_names:
            if name.startswith(base + ":"):
                adapter = name[len(base) + 1:]
                if adapter not in self.tm.lora_names:
                    raise ApiError(400, f"model: unknown LoRA adapter {adapter!r} of `{base}`; "
                                        f"this server has {list(self.tm.lora_names)}",
                                   param="model")
                return adapter
        raise ApiError(404, f"The model `{name}` does not exist; this server has "
                            f"{[*self.model_names, *self.tm.lora_names]}",
                       code="model_not_found", param="model")

    async def completions(self, req: CompletionRequest,
                          guard: Guard) -> msgspec.Struct | EventStream:
        lora = self.check_model(req.model)
        check_completion(req)
        prompts = prompt_list(req.prompt)
        max_tokens = COMPLETION_DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
        params = to_params(req, max_tokens)
        params.lora = lora
        params.logprobs = req.logprobs is not None
        params.top_logprobs = req.logprobs or 0
        call = Call(f"cmpl-{uuid.uuid4().hex}", False, req.model, req.n, params.logprobs,
                    req.include_usage, self._token_text, top=params.top_logprobs,
                    given=given_fields(req))
        if req.echo:
            prompts = [await self._echo_prompt(call, p) for p in prompts]
            if params.logprobs:
                params.logprob_start_len = 0
        return await self._run(call, prompts, params, req.stream, guard)

    async def _echo_prompt(self, call: Call, prompt: str | list[int]) -> list[int]:
        """Record `prompt`'s text and ids for each of its choices to echo; its ids."""
        if isinstance(prompt, str):
            text, ids = prompt, await self.tm.tokenize(prompt)
        else:
            tok = self.tm.tokenizer
            text, ids = ("" if tok is None else tok.decode(prompt)), prompt
        call.echo += [(text, ids)] * call.n
        return ids

    async def chat(self, req: ChatCompletionRequest,
                   guard: Guard) -> msgspec.Struct | EventStream:
        lora = self.check_model(req.model)
        check_chat(req)
        parsing = self.parsing.request(req)
        tools = parsing.template_tools
        text = await self.tm.chat_text(req.messages, tools, req.chat_template_kwargs,
                                       len(msgspec.json.encode(tools)) if tools else 0)
        ids = await self.tm.tokenize(text, add_special_tokens=False)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None \
            else req.max_tokens
        if max_tokens is None:  # OpenAI: as much as the context leaves
            max_tokens = max(1, self.tm.context_len - len(ids))
        params = to_params(req, max_tokens)
        params.lora = lora
        params.logprobs = req.logprobs
        params.top_logprobs = req.top_logprobs or 0
        parsing.apply(params)
        call = Call(f"chatcmpl-{uuid.uuid4().hex}", True, req.model, req.n, req.logprobs,
                    req.include_usage, self._token_text, given=given_fields(req))
        readers = [parsing.output() for _ in range(req.n)]
        call.readers = readers if readers[0] is not None else []
        return await self._run(call, [ids], params, req.stream, guard)

    # ------------------------------------------------------------ running
    async def _run(self, call: Call, prompts: list[str | list[int]], params: SamplingParams,
                   stream: bool, guard: Guard) -> msgspec.Struct | EventStream:
        await self.tm.admit(len(prompts) * call.n)
        gens = []
        for p, prompt in enumerate(prompts):
            for i in range(call.n):
                choice_params = msgspec.structs.replace(params)
                if params.seed is not None:
                    choice_params.seed = params.seed + i
                rid = f"{call.id}-{p * call.n + i}"
                gens.append(self.tm.generate(prompt, choice_params, rid, stream=stream,
                                             given=call.given))
                call.outputs.append(RequestOutput(rid=rid))
                call.chars.append(0)
        streams, first = await start_streams(gens, guard)
        if stream:
            return EventStream(self._events(call, streams, first), streams)
        try:
            for index, out in [first] + await guard(collect(streams)):
                call.outputs[index] = out
        finally:
            await streams.aclose()
        return call.response()

    async def _events(self, call: Call, streams: MergedStreams,
                      first: tuple[int, RequestOutput]) -> AsyncIterator[bytes]:
        """The SSE body: chunks as they come, the usage chunk if asked, then `[DONE]`."""
        try:
            if call.chat:  # the assistant's role first, for every choice
                yield sse(call.role_chunk())
            index, out = first
            while True:
                call.outputs[index] = out
                for chunk in call.chunks(index, out):
                    yield sse(chunk)
                nxt = await anext(streams, None)
                if nxt is None:
                    break
                index, out = nxt
            if call.include_usage:
                yield sse(call.usage_chunk())
        except Exception as e:  # the response has started: the error is the last event
            log.warning("stream %s ended with an error: %r", call.id, e)
            yield sse(api_error(e).body())
        finally:
            await streams.aclose()
        yield DONE

    def _token_text(self, token_id: int) -> str:
        tok = self.tm.tokenizer
        return str(token_id) if tok is None else tok.decode([token_id])
