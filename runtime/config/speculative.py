"""Speculative decoding: the drafter and how many tokens a verify step checks."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.config.checks import ConfigError, require_at_least

SPECULATIVE_ALGORITHMS = ("none", "ngram", "draft", "eagle", "mtp")
WORKER_DRAFTERS = ("draft", "eagle", "mtp")  # drafted by the worker, on the device
DRAFT_MODEL_DRAFTERS = ("draft", "eagle")  # their weights: `speculative_draft_model`


def worker_drafts(algorithm: str, overlap: bool) -> bool:
    """Whether the worker writes the drafts of `algorithm` in the verify step itself (the
    scheduler plans placeholders): a model drafts there always; n-gram lookup there with
    overlap, so that its verify steps chain behind the step in flight, and on the host
    otherwise, where the whole sequence is known when a step is planned."""
    return algorithm in WORKER_DRAFTERS or (algorithm == "ngram" and overlap)


@dataclass(frozen=True)
class SpeculativeOptions:
    """Whether and how requests draft tokens for the target model to verify."""

    speculative_algorithm: str = "none"
    """Speculative decoding: `none`, `ngram` (prompt lookup: draft the tokens that
    followed the latest earlier occurrence of the sequence's last few tokens; no second
    model; with overlap it looks up in the worker, so its verify steps chain), `draft` (a
    smaller model with the same vocabulary, `speculative_draft_model`, drafts greedily in
    the worker), `eagle` (a released EAGLE or EAGLE-3 head for the
    target, `speculative_draft_model`, drafts greedily in the worker from the target's
    hidden states) or `mtp` (the multi-token-prediction layer of the target's own
    checkpoint, DeepSeek-V3 family or DeepSeek-V4, drafts as an EAGLE head does). The
    target verifies every draft exactly: greedy outputs are the same tokens, sampled
    outputs keep its distribution."""
    speculative_draft_model: str = ""
    """draft: the draft model, named as `model` is; its vocabulary must be the target's.
    eagle: the local folder of an EAGLE head trained for the target. (mtp reads the
    target's own checkpoint: not set.)"""
    speculative_num_draft_tokens: int = 4
    """Speculative decoding: draft tokens a request's verify step checks (k; the step
    yields 1 to k + 1 tokens)."""
    speculative_ngram_min: int = 2
    """ngram: the shortest suffix of the sequence looked up in its history."""
    speculative_ngram_max: int = 4
    """ngram: the longest suffix of the sequence looked up in its history (tried first)."""
    speculative_off_window: int = 8
    """A request stops speculating (and decodes plainly, overlapped again) once its last
    this many drafting steps kept fewer than `speculative_off_accept` drafts on average;
    0: never."""
    speculative_off_accept: float = 0.5
    """See `speculative_off_window`: the mean accepted drafts per step below which a
    request stops speculating."""

    def check_speculative(self) -> None:
        """A known algorithm and sane draft sizes (the KV layout: `ServerConfig`)."""
        algo = self.speculative_algorithm
        if algo not in SPECULATIVE_ALGORITHMS:
            raise ConfigError(f"speculative_algorithm must be one of {SPECULATIVE_ALGORITHMS}, "
                              f"got {algo!r}")
        require_at_least(self, ("speculative_num_draft_tokens",), 1)
        if not 1 <= self.speculative_ngram_min <= self.speculative_ngram_max:
            raise ConfigError(f"speculative_ngram_min and speculative_ngram_max must satisfy "
                              f"1 <= min <= max, got {self.speculative_ngram_min} and "
                              f"{self.speculative_ngram_max}")
        if self.speculative_off_window < 0 or not self.speculative_off_accept >= 0:
            raise ConfigError(f"speculative_off_window and speculative_off_accept must be "
                              f">= 0, got {self.speculative_off_window} and "
                              f"{self.speculative_off_accept}")
        if (algo in DRAFT_MODEL_DRAFTERS) != bool(self.speculative_draft_model):
            raise ConfigError("speculative_draft_model is set exactly when "
                              f"speculative_algorithm is one of {DRAFT_MODEL_DRAFTERS} (got "
                              f"{algo!r} and {self.speculative_draft_model!r})")
