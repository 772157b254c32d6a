"""Reference log-probabilities from HF transformers on the same SmolLM2 weights (fp32)."""

from __future__ import annotations

import torch

from tests.e2e.hf_reference import shared_reference


class HFScores:
    def __init__(self) -> None:
        hf = shared_reference()  # the model the other test files load
        self.tokenizer, self.model = hf.tokenizer, hf.model

    def encode(self, text: str) -> list[int]:
        """Tokenized as the server tokenizes a text prompt."""
        return self.tokenizer.encode(text)

    @torch.inference_mode()
    def prompt_logprobs(self, ids: list[int]) -> list[float]:
        """log P(ids[i] | ids[:i]) for i = 1 .. len(ids) - 1."""
        logits = self.model(torch.tensor([ids])).logits[0].float()  # [n, V]
        lps = torch.log_softmax(logits[:-1], dim=-1)  # [n - 1, V]
        return lps.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()

    def select_scores(self, text: str, choices: list[str]) -> list[float]:
        """Mean logprob of each choice's tokens: those of text + choice past the longest
        common prefix with the text's tokens."""
        text_ids = self.encode(text)
        scores = []
        for c in choices:
            ids = self.encode(text + c)
            k = 0
            while k < min(len(ids), len(text_ids)) and ids[k] == text_ids[k]:
                k += 1
            lps = self.prompt_logprobs(ids)[k - 1:]  # entry i scores token i + 1
            scores.append(sum(lps) / len(lps))
        return scores
