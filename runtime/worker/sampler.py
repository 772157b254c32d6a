"""Batched sampling with per-row parameters, penalties and per-request seeds.

Each request is bound to a row (`init_row`); a step samples S rows at once, vectorized:
logit bias and allowed tokens (`TokenBias`) -> penalties -> grammar mask -> greedy argmax |
temperature -> top-k -> top-p -> min-p -> exponential race.
The race picks argmax(p / E) with E ~ Exp(1), which draws from p without a host sync. A
seeded row's noise is a counter-based hash of (seed, position, token id), so its samples
depend only on its own request, never on what else is in the batch.
"""

from __future__ import annotations

import numpy as np
import torch

from runtime.wire.sampling import SamplingParams
from runtime.worker.token_bias import TokenBias

MASK32 = 0xFFFFFFFF
# columns of the per-row float table
TEMP, TOP_P, MIN_P, FREQ, PRES, REP = range(6)
# columns of the per-row int table
TOP_K, SEED_LO, SEED_HI, SEEDED = range(4)
# columns of the per-row host flags: which sampling stages a row needs
PENALTIES, RANDOM, TOP_K_P, MIN_P_ON, RANDOM_SEEDED, LOGPROBS = range(6)


def hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer on int64 tensors holding values in [0, 2^32).

    Multipliers stay below 2^31 so products fit in int64 on every device.
    """
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & MASK32
    return x ^ (x >> 15)


class Sampler:
    """Samples next tokens for rows of a fixed table of `max_rows` requests."""

    def __init__(self, max_rows: int, vocab_size: int, device: torch.device | str,
                 seed: int = 0) -> None:
        self.max_rows, self.vocab_size = max_rows, vocab_size
        self.device = torch.device(device)
        # host flags per row, so a step decides which stages run without a per-row loop
        self._flags = np.zeros((max_rows, 6), dtype=bool)
        self._top_n = np.zeros(max_rows, dtype=np.int64)  # alternatives each row asks for
        # parameter tables, edited on the host, uploaded once per step when changed
        self._floats_cpu = torch.zeros(max_rows, 6)
        self._ints_cpu = torch.zeros(max_rows, 4, dtype=torch.int64)
        self._floats = self._floats_cpu.to(self.device)  # [rows, 6]
        self._ints = self._ints_cpu.to(self.device)  # [rows, 4]
        self._dirty = False
        # penalty state, allocated the first time a row needs it
        self.counts: torch.Tensor | None = None  # [rows, V] int32, output token counts
        self.prompt_mask: torch.Tensor | None = None  # [rows, V] bool, token in prompt
        self.bias = TokenBias(max_rows, vocab_size, self.device)
        self._gen = torch.Generator(device=self.device).manual_seed(seed)
        self._vocab_hash = hash32(torch.arange(vocab_size, device=self.device))  # [V]

    @torch.inference_mode()
    def init_row(self, row: int, params: SamplingParams, prompt_ids: list[int] | None = None,
                 output_ids: list[int] | None = None) -> None:
        """Bind a request to `row`, resetting its penalty state.

        `prompt_ids` matter only for repetition_penalty; `output_ids` are the tokens the
        request already produced (re-admission after a retraction).
        """
        top_k = params.top_k if 0 < params.top_k < self.vocab_size else self.vocab_size
        rand = not params.greedy
        self._flags[row] = (params.uses_penalties, rand, rand and top_k < self.vocab_size
                            or rand and params.top_p < 1.0, rand and params.min_p > 0,
                            rand and params.seed is not None,
                            params.logprobs or params.top_logprobs > 0)
        self._top_n[row] = min(params.top_logprobs, self.vocab_size)
        self._floats_cpu[row] = torch.tensor([
            params.temperature, params.top_p, params.min_p, params.frequency_penalty,
            params.presence_penalty, params.repetition_penalty])
        seed = params.seed or 0
        self._ints_cpu[row] = torch.tensor([top_k, seed & MASK32, (seed >> 32) & MASK32,
                                            params.seed is not None])
        self._dirty = True
        self.bias.init_row(row, params, self._upload)
        if params.uses_penalties and self.counts is None:
            self.counts = torch.zeros(self.max_rows, self.vocab_size, dtype=torch.int32,
                                      device=self.device)
        if params.repetition_penalty != 1.0 and self.prompt_mask is None:
            self.prompt_mask = torch.zeros(self.max_rows, self.vocab_size, dtype=torch.bool,
                                           device=self.device)
        if self.counts is not None:
            self.counts[row] = torch.bincount(self._ids(output_ids), minlength=self.vocab_size)
        if self.prompt_mask is not None:
            self.prompt_mask[row] = False
            self.prompt_mask[row, self._ids(prompt_ids)] = True

    def top_n(self, rows: np.ndarray) -> np.ndarray:
        """How many top alternatives each of table rows `rows` [S] asks for: [S] int64."""
        return self._top_n[rows]

    def _table(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The parameter tables' entries for `rows`, uploading host edits first."""
        if self._dirty:
            self._floats.copy_(self._upload(self._floats_cpu))
            self._ints.copy_(self._upload(self._ints_cpu))
            self._dirty = False
        return self._floats[rows], self._ints[rows]  # [S, 6], [S, 4]

    def _upload(self, host: torch.Tensor) -> torch.Tensor:
        """`host` on the device without a host sync (through a fresh pinned copy on CUDA,
        so later edits of `host` cannot race the transfer)."""
        if self.device.type != "cuda":
            return host.to(self.device)
        return host.pin_memory().to(self.device, non_blocking=True)

    def _ids(self, ids: list[int] | None) -> torch.Tensor:
        return self._upload(torch.tensor(ids or [], dtype=torch.int64))

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, rows: list[int] | np.ndarray,
               positions: list[int] | torch.Tensor, allowed: torch.Tensor | None = None,
               rows_dev: torch.Tensor | None = None,
               all_logprobs: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Sample one token per row of `logits` [S, V] float32 for table rows `rows` [S].

        `positions` [S] is the position each sampled token will take in its sequence;
        seeded rows hash it with their seed. `allowed` [S, V] bool (a grammar's mask; at
        least one token per row) restricts the choice. `rows_dev` is `rows` on the device
        when the caller has it there already. Returns ids [S] int64 and their logprobs [S]
        float32 under the raw logits (before bias, penalties, mask and temperature); with
        `all_logprobs=False`, logprobs are None unless a row asked for them.
        """
        rows_np = np.asarray(rows, dtype=np.int64)  # [S]
        rows_t = rows_dev if rows_dev is not None else self._upload(torch.from_numpy(rows_np))
        flags = self._flags[rows_np]  # [S, 6]
        needs = flags.any(axis=0)  # [6]: does any row need the stage

        x = self.bias.apply(logits, rows_np, rows_t)  # [S, V]
        if needs[PENALTIES]:
            x = self.apply_penalties(x, rows_t)  # [S, V]
        if allowed is not None:
            x = x.masked_fill(~allowed, float("-inf"))  # [S, V]
        ids = x.argmax(dim=-1)  # [S] greedy; ties -> lowest index
        if needs[RANDOM]:
            floats, ints = self._table(rows_t)  # [S, 6], [S, 4]
            temp = floats[:, TEMP]  # [S]
            probs = torch.softmax(x / torch.where(temp > 0, temp, 1.0)[:, None], dim=-1)
            if needs[TOP_K_P]:
                probs = self._top_k_top_p(probs, ints[:, TOP_K], floats[:, TOP_P])  # [S, V]
            if needs[MIN_P_ON]:
                floor = floats[:, MIN_P, None] * probs.amax(dim=-1, keepdim=True)  # [S, 1]
                probs = probs.masked_fill(probs < floor, 0.0)  # [S, V]
            unseeded = bool((flags[:, RANDOM] & ~flags[:, RANDOM_SEEDED]).any())
            noise = self._noise(ints, positions, unseeded, bool(needs[RANDOM_SEEDED]))
            ids = torch.where(temp > 0, (probs / noise).argmax(dim=-1), ids)  # [S]

        logprobs = None
        if all_logprobs or needs[LOGPROBS]:
            chosen = logits.gather(1, ids[:, None])[:, 0]  # [S]
            logprobs = chosen - torch.logsumexp(logits, dim=-1)  # [S]
        if self.counts is not None:
            ones = torch.ones_like(ids, dtype=self.counts.dtype)  # [S]
            self.counts.index_put_((rows_t, ids), ones, accumulate=True)
        return ids, logprobs

    def apply_penalties(self, logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Penalized copy of `logits` [S, V] for table rows `rows` [S] (device int64):
        repetition (HF: over prompt + output tokens, x / r if x > 0 else x * r), then
        frequency and presence (OpenAI: x - f * count - p * (count > 0), over output tokens)."""
        if self.counts is None:
            return logits
        floats, _ = self._table(rows)  # [S, 6]
        counts = self.counts[rows]  # [S, V] int32
        seen = counts > 0  # [S, V]
        x = logits
        if self.prompt_mask is not None:
            rep = floats[:, REP, None]  # [S, 1]
            penalized = torch.where(x > 0, x / rep, x * rep)  # [S, V]
            x = torch.where(seen | self.prompt_mask[rows], penalized, x)  # [S, V]
        return x - floats[:, FREQ, None] * counts - floats[:, PRES, None] * seen  # [S, V]

    def _top_k_top_p(self, probs: torch.Tensor, top_k: torch.Tensor,
                     top_p: torch.Tensor) -> torch.Tensor:
        """Zero tokens outside each row's top-k, then outside the smallest set whose
        (top-k renormalized) mass reaches top_p. The most likely token always survives."""
        sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)  # [S, V] x2
        ranks = torch.arange(probs.shape[1], device=probs.device)  # [V]
        sorted_p = sorted_p.masked_fill(ranks[None, :] >= top_k[:, None], 0.0)  # [S, V]
        cum = sorted_p.cumsum(dim=-1)  # [S, V]
        mass_before = (cum - sorted_p) / cum[:, -1:]  # [S, V], renormalized over the top-k
        cut = (mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0)  # [S, V]
        sorted_p = sorted_p.masked_fill(cut, 0.0)  # [S, V]
        return torch.zeros_like(probs).scatter_(1, order, sorted_p)  # [S, V]

    def _noise(self, ints: torch.Tensor, positions: list[int] | torch.Tensor,
               unseeded: bool, seeded: bool) -> torch.Tensor:
        """Exp(1) noise [S, V]: from the shared generator (if any sampled row is unseeded),
        or hashed for seeded rows (if any)."""
        rows, vocab = ints.shape[0], self.vocab_size
        noise = None
        if unseeded:
            noise = torch.empty(rows, vocab, device=self.device).exponential_(
                generator=self._gen)  # [S, V]
        if seeded:
            pos = torch.as_tensor(positions, dtype=torch.int64)
            pos = self._upload(pos) if pos.device.type == "cpu" else pos.to(self.device)
            pos = pos & MASK32  # [S]
            key = hash32(hash32(hash32(ints[:, SEED_LO]) ^ ints[:, SEED_HI]) ^ pos)  # [S]
            bits = hash32(key[:, None] ^ self._vocab_hash[None, :])  # [S, V]
            uniform = ((bits >> 8).float() + 0.5) * 2.0 ** -24  # [S, V] in (0, 1)
            hashed = -torch.log(uniform)  # [S, V]
            seeded_rows = ints[:, SEEDED, None].bool()  # [S, 1]
            noise = hashed if noise is None else torch.where(seeded_rows, hashed, noise)
        return noise.clamp_min_(1e-20)
