"""`TokenizerManager`: tokenize, send to the scheduler, stream detokenized output back.

It lives on one asyncio loop: uvloop in the api process, or a background loop thread in
the offline `Engine` (see `runtime.api.loop_thread`). What it knows of the engine (its
limits, whether it died) comes from `EngineState` (`engine_state.py`), whose
`SchedulerLink` reads the scheduler's `BatchOut`s, each fed to the requests' `ReqState`s;
`generate` streams from that state. Stop strings end a request here (the scheduler only
knows stop token ids), so this side tells the scheduler to finish it (`FinishReq`); a
consumer that goes away aborts it (`AbortReq`).
The scheduler knows a request by a key unique in this process, not by the caller's rid,
which may be reused once released here, while the scheduler may still be freeing it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Collection

from runtime.api.admission import check_admission
from runtime.api.chat_template import chat_prompt_text, conversation_chars, role_markers
from runtime.api.detokenize import IncrementalDetokenizer
from runtime.api.dispatch import apply_batch
from runtime.api.engine_state import EngineState
from runtime.api.openai.protocol import ChatMessage
from runtime.api.prompt import check_lora, prepare_prompt
from runtime.api.prompt_tokenizer import PromptTokenizer
from runtime.api.req_state import ReqState
from runtime.api.rid import check_rid
from runtime.api.sampling_defaults import SamplingDefaults
from runtime.api.timing import RequestTimings
from runtime.config.server import ServerConfig
from runtime.model_config import ModelSpec
from runtime.wire.api_input import BatchOut, Limits
from runtime.wire.errors import EngineDeadError, InvalidRequest
from runtime.wire.model_info import ModelInfo
from runtime.wire.request_output import FinishReason, RequestOutput
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import AbortReq, GenerateReq

log = logging.getLogger(__name__)
DRAIN_POLL_S = 0.02  # how often `drain` looks whether the requests in flight have ended


class TokenizerManager(EngineState):
    """The api process's request front: validation, tokenization, per-request streams.

    Build it anywhere, then `await start()` on the loop that will run it; every other
    method must be called on that loop.
    """

    def __init__(self, cfg: ServerConfig, spec: ModelSpec) -> None:
        # `_dispatch` is looked up at each batch (a benchmark may wrap it)
        super().__init__(cfg, lambda batch: self._dispatch(batch), self._fail_all)
        self.spec = spec
        self.lora_names = tuple(cfg.lora_adapters)  # the LoRA adapters a request may pick
        self.tokenizer = spec.load_tokenizer()  # TokenizerError: it does not fit the model
        vocab = spec.hf_config().vocab_size
        if self.tokenizer is not None:
            vocab = min(vocab, len(self.tokenizer))
        self.vocab_size: int = vocab
        self.sampling_defaults = SamplingDefaults.load(cfg.generation_config, spec.path)
        self._prompts = PromptTokenizer(self.tokenizer) if self.tokenizer is not None else None
        self._reqs: dict[str, ReqState] = {}  # by the key the scheduler knows it by
        self._by_rid: dict[str, ReqState] = {}  # by the caller's rid
        self._keys = itertools.count()
        self.timings = RequestTimings()  # per-request timings; listeners get each record
        self._model_info: tuple[Limits, ModelInfo] | None = None  # and the limits it holds

    @property
    def num_inflight(self) -> int:
        return len(self._reqs)

    async def generate(self, prompt: str | list[int], params: SamplingParams,
                       rid: str | None = None, *, stream: bool = True,
                       given: Collection[str] | None = None,
                       text: bool = True) -> AsyncIterator[RequestOutput]:
        """The output of one request: with `stream`, `RequestOutput` deltas as they come;
        otherwise the whole output, once. The last has `finish_reason`. The model's
        default sampling parameters fill the fields the request left unset (`given`: the
        fields it set, see `SamplingDefaults.apply`). `text=False`: token ids only, never
        detokenized (the output's text stays empty).

        Raises `InvalidRequest` (before anything reaches the scheduler), `Overloaded` when
        `max_running + max_queue` requests are already in flight (the queue of requests
        waiting beyond the running capacity is full), `EngineDeadError` if a server process
        died, `RequestFailed` if the scheduler failed this request.
        Closing the iterator early (or cancelling its task) aborts the request.
        """
        state = await self.open(prompt, params, rid, stream=stream, given=given, text=text)
        try:
            while True:
                await state.event.wait()
                state.event.clear()
                out = state.take()
                if out is None:
                    continue
                yield out
                if out.finished:
                    return
        finally:
            self.release(state)

    async def open(self, prompt: str | list[int], params: SamplingParams,
                   rid: str | None = None, *, stream: bool = True,
                   given: Collection[str] | None = None, text: bool = True) -> ReqState:
        """Fill the model's defaults in, validate, tokenize and submit one request (raising
        as `generate` does); its output collects in the returned state: `take` it whenever
        its `event` is set or its `on_ready` is called (deltas with `stream`, else the
        whole output once). `text=False`: ids only. Every opened request must be
        `release`d."""
        arrival = time.monotonic()
        self._check_alive()
        if not text and params.stop:
            raise InvalidRequest("stop strings are matched in the text: with text=False, "
                                 "use stop_token_ids")
        limits = await self.wait_limits(self.cfg.ready_timeout)  # at once after the first
        rid = check_rid(rid) if rid is not None else uuid.uuid4().hex
        filled = self.sampling_defaults.apply(params, given) \
            if isinstance(params, SamplingParams) else set()
        input_ids = await prepare_prompt(prompt, params, self._prompts, self.spec.name,
                                         self.vocab_size, limits,
                                         fit_max_tokens="max_tokens" in filled)
        check_lora(params, self.lora_names)
        self._check_alive()  # the engine may have died while the prompt was tokenized
        if rid in self._by_rid:
            raise InvalidRequest(f"request id {rid!r} is already in flight")
        check_admission(len(self._reqs), 1, limits, self.cfg)
        detok = None
        if self.tokenizer is not None and text:
            detok = IncrementalDetokenizer(self.tokenizer, input_ids,
                                           params.skip_special_tokens, params.stop)
        key = format(next(self._keys), "x")
        state = ReqState(rid, detok, params.logprobs, input_ids, params.logprob_start_len,
                         stream, key=key, report_cached=self.cfg.cache_report)
        self._reqs[key] = state
        self._by_rid[rid] = state
        self.timings.start(key, arrival, rid)
        try:
            self._link.put(GenerateReq(key, input_ids, params, self._stop_ids(params)))
        except BaseException:
            self.release(state)
            raise
        return state

    async def admit(self, seqs: int) -> None:
        """Check that a request of `seqs` sequences (prompts x n) may be opened now:
        raise `InvalidRequest` if it never could, `Overloaded` if the queue is too full."""
        self._check_alive()
        limits = await self.wait_limits(self.cfg.ready_timeout)
        check_admission(len(self._reqs), seqs, limits, self.cfg)

    def release(self, state: ReqState) -> None:
        """Forget an opened request; if the scheduler still runs it, abort it there (its
        consumer is gone: free the KV now). Its rid may be used again at once."""
        if self._reqs.get(state.key) is state:
            del self._reqs[state.key]
        if self._by_rid.get(state.rid) is state:
            del self._by_rid[state.rid]
        if not state.scheduler_done and self.dead is None:
            self._link.put(AbortReq(state.key))
        outcome = FinishReason.ERROR if state.error is not None \
            else state.finish_reason or FinishReason.ABORT
        self.timings.finish(state.key, outcome, state.completion_tokens)

    async def tokenize(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """The token ids of prompt text, computed off the event loop when it is long;
        `InvalidRequest` without tokenizing when it is far longer than a prompt may be."""
        if self._prompts is None:
            raise InvalidRequest(f"model {self.spec.name!r} has no tokenizer: "
                                 "send the prompt as token ids (or serve it with --tokenizer)")
        return await self._prompts.encode(text, self._known_limits().max_req_input_len,
                                          add_special_tokens=add_special_tokens)

    async def chat_text(self, messages: list[ChatMessage], tools: list[dict] | None = None,
                        template_kwargs: dict | None = None, tools_text: int = 0) -> str:
        """The prompt text of chat `messages` (and `tools`, whose definitions take about
        `tools_text` characters) by the model's chat template with its options
        `template_kwargs`, rendered off the event loop when the conversation is long."""
        def render() -> str:
            return chat_prompt_text(self.tokenizer, messages, tools, template_kwargs)

        if self._prompts is None:
            return render()  # raises: no chat template
        return await self._prompts.run(render, conversation_chars(messages, tools_text))

    def model_info(self) -> ModelInfo:
        """The served model's name, context length, chat role markers, weight quantization
        and KV storage dtype."""
        limits = self._known_limits()
        if self._model_info is None or self._model_info[0] is not limits:
            info = ModelInfo(model=self.cfg.model, max_model_len=limits.max_context,
                             chat_roles=role_markers(self.tokenizer),
                             quantization=limits.quantization, kv_dtype=limits.kv_dtype,
                             default_sampling_params=self.sampling_defaults.values)
            self._model_info = (limits, info)
        return self._model_info[1]

    def abort(self, rid: str) -> None:
        """Stop a request: the scheduler frees it; its output ends with finish reason ABORT."""
        state = self._by_rid.get(rid)
        if state is None:
            return
        if not state.scheduler_done and self.dead is None:
            self._link.put(AbortReq(state.key))
            state.scheduler_done = True
        state.abort()

    def abort_all(self) -> None:
        """`abort` every request in flight."""
        for rid in list(self._by_rid):
            self.abort(rid)

    async def drain(self, grace: float) -> None:
        """Refuse new requests; give those in flight up to `grace` seconds to end, then
        fail the rest with `EngineDeadError` (the server is shutting down)."""
        self._refusing = EngineDeadError("the server is shutting down")
        log.info("shutting down: %d requests in flight get up to %.1f s", len(self._reqs), grace)
        deadline = time.monotonic() + grace
        while self._reqs and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        self._link.die(str(self._refusing), quiet=True)

    async def close(self, *, shutdown_scheduler: bool = False) -> None:
        """Fail in-flight requests, stop receiving, close the sockets.

        `shutdown_scheduler=True` first sends `Shutdown` (for an offline engine that owns
        the scheduler; under the launcher the supervisor stops the processes).
        """
        if not self._link.started:
            return
        await self._link.close(shutdown_scheduler=shutdown_scheduler)
        if self._prompts is not None:
            self._prompts.close()

    # ------------------------------------------------------------ internals
    def _stop_ids(self, params: SamplingParams) -> list[int]:
        ids = list(params.stop_token_ids)
        # under a grammar, EOS is only allowed once the match is complete: it always ends it
        if not params.ignore_eos or params.grammar is not None:
            ids += [e for e in self.spec.eos_token_ids if e not in ids]
        return ids

    def _dispatch(self, batch: BatchOut) -> None:
        for msg in apply_batch(batch, self._reqs, self.timings):
            self._link.put(msg)

    def _fail_all(self, error: EngineDeadError) -> None:
        for state in self._reqs.values():
            state.fail(error)
