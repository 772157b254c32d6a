"""Greedy reference outputs from HF transformers on the same SmolLM2 weights."""

from __future__ import annotations

import functools

import torch

from runtime.model_config import resolve_model

SHARED = ("You are a careful assistant. Answer in one short sentence. Here are some facts: "
          "the sky is blue, grass is green, water is wet, and fire is hot. ")

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "1, 2, 3, 4,",
    "def fibonacci(n):",
    "Hi",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    SHARED + "What colour is the sky?",
    SHARED + "What colour is grass?",
    SHARED + "Is fire cold?",
    "Translate to French: good morning",
    "List three fruits:",
    "Water boils at",
    "In 1969, the first person to walk on the moon was",
    "Write a haiku about autumn leaves falling slowly in the wind.",
    "The capital of France is",  # repeated: a full radix hit
    " ".join(f"word{i}" for i in range(90)) + " The next word is",  # longer than a chunk
]


class HFReference:
    """Greedy continuations and per-step top-2 logit gaps, one prompt at a time (no padding)."""

    def __init__(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = resolve_model("smollm2").path
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        # prompt -> the longest run asked for: (max_new_tokens, ids, gaps)
        self._cache: dict[tuple, tuple[int, list[int], list[float]]] = {}

    @torch.inference_mode()
    def greedy(self, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], list[float]]:
        """The continuation of `prompt_ids`; a shorter one is the start of a longer run's
        (greedy steps do not depend on how many follow)."""
        key = tuple(prompt_ids)
        if key not in self._cache or self._cache[key][0] < max_new_tokens:
            out = self.model.generate(
                torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False,
                output_scores=True, return_dict_in_generate=True, pad_token_id=2)
            ids = out.sequences[0, len(prompt_ids):].tolist()
            gaps = []
            for scores in out.scores:
                top2 = torch.topk(scores[0].float(), 2).values
                gaps.append(float(top2[0] - top2[1]))
            self._cache[key] = (max_new_tokens, ids, gaps)
        _, ids, gaps = self._cache[key]
        return ids[:max_new_tokens], gaps[:max_new_tokens]


@functools.cache
def shared_reference() -> HFReference:
    """The one HFReference of this test process: the model loads once, and a continuation
    asked for by several test files is computed once (its results depend on nothing else)."""
    return HFReference()


def assert_matches(ours: list[int], ref: list[int], gaps: list[float], what: str) -> None:
    """Token-for-token equality; a divergence is accepted only at a near-tie (gap < 1e-4)."""
    if ours == ref:
        return
    k = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
    gap = gaps[k] if k < len(gaps) else float("inf")
    assert gap < 1e-4, (f"{what}: first difference at token {k}: ours {ours[k:k + 5]} vs HF "
                        f"{ref[k:k + 5]}, HF top-2 logit gap {gap:.3g} (not a near-tie)")
