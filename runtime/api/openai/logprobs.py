"""OpenAI logprobs objects from a `RequestOutput` (a whole output or a stream's delta).

Completions: `tokens`, `token_logprobs`, `text_offset` and, with `logprobs=N > 0`,
`top_logprobs` (per token, its N alternatives and itself, by text). With `echo`, the
prompt's tokens come first: its first token has no logprob (nothing precedes it), the
others are scored from the prompt's input logprobs, as lm-evaluation-harness reads
them for log-likelihoods. Chat: `content[{token, logprob, bytes, top_logprobs}]`.
A token's text is its own decoded text.
"""

from __future__ import annotations

from collections.abc import Callable

from runtime.api.openai.responses import ChatLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob
from runtime.wire.request_output import RequestOutput

# (token id, its logprob or None, its alternatives (id, logprob) or None)
Scored = tuple[int, float | None, list[tuple[int, float]] | None]


def output_tokens(out: RequestOutput) -> list[Scored]:
    """The output tokens of `out` with their logprobs and alternatives."""
    return [(t, lp, out.top(i)) for i, (t, lp) in enumerate(zip(out.token_ids, out.logprobs))]


def prompt_tokens(out: RequestOutput, first: int | None) -> list[Scored]:
    """The scored prompt tokens of `out` (its input logprobs), after the prompt's `first`
    token when this piece starts the echo (None otherwise)."""
    head: list[Scored] = [] if first is None else [(first, None, None)]
    return head + [(t, lp, out.top(i, prompt=True))
                   for i, (t, lp) in enumerate(zip(out.input_token_ids, out.input_logprobs))]


def completion_logprobs(tokens: list[Scored], token_text: Callable[[int], str], start: int,
                        top: int) -> CompletionLogprobs:
    """`text_offset[i]`: where token i starts in the choice's text (each token's own
    decoded text counted from `start`, the offset of the first one); `top`: the N of
    `logprobs=N` (0: no `top_logprobs`)."""
    texts = [token_text(t) for t, _, _ in tokens]
    offsets, at = [], start
    for text in texts:
        offsets.append(at)
        at += len(text)
    tops = None
    if top:
        tops = []
        for text, (_, lp, alts) in zip(texts, tokens):
            if alts is None:
                tops.append(None)
                continue
            entry = {token_text(a): a_lp for a, a_lp in alts}
            entry.setdefault(text, lp)  # the chosen token too, as OpenAI lists it
            tops.append(entry)
    return CompletionLogprobs(tokens=texts, token_logprobs=[lp for _, lp, _ in tokens],
                              text_offset=offsets, top_logprobs=tops)


def chat_logprobs(out: RequestOutput, token_text: Callable[[int], str]) -> ChatLogprobs:
    """The chat `logprobs` of `out`'s tokens, each with its alternatives (if asked)."""
    content = []
    for t, lp, alts in output_tokens(out):
        text = token_text(t)
        content.append(TokenLogprob(token=text, logprob=lp, bytes=list(text.encode()),
                                    top_logprobs=[_top(token_text(a), a_lp)
                                                  for a, a_lp in alts]))
    return ChatLogprobs(content=content)


def _top(text: str, logprob: float) -> TopLogprob:
    return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode()))
