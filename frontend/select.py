"""`select` by token logprobs: which choice does the model find most likely after the text?

The score of a choice is the mean logprob of its tokens (SGLang's normalized prompt
logprob), where its tokens are those of `tokenize(text + choice)` past the longest
common prefix with `tokenize(text)`: when the choice merges with the text's last
token (e.g. "... is " + "Paris" -> " Paris"), the merged token counts as the choice's.

Requests, all prefill only (`max_tokens=0`):
1. the text alone: caches its KV in the radix tree and says its length k in tokens;
2. at once, the text and each text + choice with `logprob_start_len = s = max(k - 2, 1)`:
   the choices' prompts hit the cache up to s, and the scored tokens from s on show
   where each choice's tokens start (a merge reaching back past s is not detected).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from frontend.backends.base import Backend

WINDOW = 2  # text tokens re-scored before each choice, to find where the choice starts


@dataclass
class SelectResult:
    choice: str
    index: int
    scores: list[float]  # mean logprob of each choice's tokens
    token_logprobs: list[list[float]]  # each choice's token logprobs


def choice_logprobs(text_ids: list[int], choice_ids: list[int],
                    choice_lps: list[float]) -> list[float]:
    """The logprobs of the choice's own tokens: those past the common prefix of the
    scored tokens of text + choice (`choice_ids`, `choice_lps`) and of the text."""
    common = 0
    for a, b in zip(text_ids, choice_ids):
        if a != b:
            break
        common += 1
    return choice_lps[common:]


def run_select(backend: Backend, text: str, choices: tuple[str, ...]) -> SelectResult:
    """Score each choice after `text` and pick the best (the first among equals)."""
    k = backend.generate(text, {"max_tokens": 0}).prompt_tokens
    start = max(k - WINDOW, 1)
    params = {"max_tokens": 0, "logprob_start_len": start}
    text_out, *outs = backend.generate_batch([text] + [text + c for c in choices], params)
    token_lps = [choice_logprobs(text_out.input_token_ids, o.input_token_ids, o.input_logprobs)
                 for o in outs]
    scores = [sum(lps) / len(lps) if lps else -math.inf for lps in token_lps]
    best = max(range(len(choices)), key=lambda i: scores[i])
    return SelectResult(choices[best], best, scores, token_lps)
