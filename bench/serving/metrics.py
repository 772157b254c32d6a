"""Client-side serving metrics, defined as `vllm bench serve` defines them (pure functions).

Per request (all in seconds, from the moment the request was sent):
- TTFT: arrival of the first chunk carrying a token.
- E2E latency: arrival of the last chunk carrying a token.
- TPOT = (E2E - TTFT) / (output_len - 1), only for output_len > 1.
- ITL: the gaps between consecutive token-carrying chunks. A chunk may carry several tokens
  (the server coalesces output for a slow reader); like vLLM we count one gap per chunk, so
  sum(ITL) = E2E - TTFT and the mean ITL exceeds TPOT when chunks carry several tokens.

Per run: request throughput = completed / duration, output (and total) token throughput,
goodput = requests meeting every SLO / duration, and mean / P50 / P90 / P99 of each
distribution. Percentiles interpolate linearly between order statistics (numpy's default).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

QUANTILES = (50, 90, 99)
SLO_KEYS = ("ttft", "tpot", "e2e")  # goodput SLOs, in ms
CANCELLED = "unfinished at the deadline"  # the error of requests cut off by a deadline


@dataclass
class RequestResult:
    """What one request looked like from the client."""

    prompt_len: int
    start: float = 0.0  # when it was sent (the event loop's clock)
    ok: bool = False
    output_len: int = 0  # tokens received (the usage chunk's count when one came)
    ttft: float | None = None
    latency: float | None = None  # to the last token-carrying chunk
    itl: list[float] = field(default_factory=list)
    chunks: int = 0  # token-carrying chunks
    stopped_early: bool = False  # the client closed the stream at its stop length
    error: str = ""

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.output_len < 2 or self.ttft is None or self.latency is None:
            return None
        return (self.latency - self.ttft) / (self.output_len - 1)

    def on_chunk(self, now: float, tokens: int) -> None:
        """A chunk carrying `tokens` output tokens arrived at `now`."""
        if tokens <= 0:
            return
        t = now - self.start
        if self.ttft is None:
            self.ttft = t
        else:
            self.itl.append(t - self.latency)
        self.latency = t
        self.output_len += tokens
        self.chunks += 1


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def distribution(values: Sequence[float], scale: float = 1e3) -> dict[str, float]:
    """Mean, P50, P90, P99 of `values`, times `scale` (seconds to ms by default)."""
    out = {"mean": sum(values) / len(values) * scale if values else math.nan}
    for q in QUANTILES:
        out[f"p{q}"] = percentile(values, q) * scale
    return out


def meets_slo(r: RequestResult, slo_ms: dict[str, float]) -> bool:
    """Whether a completed request met every SLO given (`ttft`, `tpot`, `e2e`, in ms).
    A request with one output token has no TPOT, which then counts as met (as in vLLM)."""
    if not r.ok:
        return False
    measured = {"ttft": r.ttft, "tpot": r.tpot, "e2e": r.latency}
    for key, limit in slo_ms.items():
        value = measured[key]
        if value is not None and value * 1e3 > limit:
            return False
    return True


def summarize(results: Sequence[RequestResult], duration: float,
              slo_ms: dict[str, float] | None = None) -> dict:
    """Run-level metrics over `results` measured across `duration` seconds."""
    done = [r for r in results if r.ok]
    out_tokens = sum(r.output_len for r in done)
    in_tokens = sum(r.prompt_len for r in done)
    received = sum(r.output_len for r in results)  # partial streams of unfinished ones too
    chunks = sum(r.chunks for r in done)
    summary = {
        "requests": len(results),
        "completed": len(done),
        "failed": sum(1 for r in results if not r.ok and r.error != CANCELLED),
        "unfinished": sum(1 for r in results if r.error == CANCELLED),
        "stopped_early": sum(1 for r in done if r.stopped_early),
        "duration_s": duration,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(done) / duration if duration > 0 else math.nan,
        "output_throughput": out_tokens / duration if duration > 0 else math.nan,
        "total_token_throughput": (in_tokens + out_tokens) / duration if duration > 0
        else math.nan,
        "received_output_throughput": received / duration if duration > 0 else math.nan,
        "tokens_per_chunk": out_tokens / chunks if chunks else math.nan,
        "ttft_ms": distribution([r.ttft for r in done if r.ttft is not None]),
        "tpot_ms": distribution([t for r in done if (t := r.tpot) is not None]),
        "itl_ms": distribution([g for r in done for g in r.itl]),
        "e2e_ms": distribution([r.latency for r in done if r.latency is not None]),
    }
    if slo_ms:
        good = sum(1 for r in done if meets_slo(r, slo_ms))
        summary["slo_ms"] = dict(slo_ms)
        summary["good_requests"] = good
        summary["goodput"] = good / duration if duration > 0 else math.nan
    errors = sorted({r.error for r in results if r.error and r.error != CANCELLED})
    if errors:
        summary["errors"] = errors[:5]
    return summary



def parse_slo(text: str) -> dict[str, float]:
    """`ttft:500,tpot:50` -> {"ttft": 500.0, "tpot": 50.0} (ms), keys from SLO_KEYS."""
    slo: dict[str, float] = {}
    for part in filter(None, text.replace(" ", ",").split(",")):
        key, _, value = part.partition(":")
        if key not in SLO_KEYS or not value:
            raise ValueError(f"SLO {part!r}: want KEY:MS with KEY one of {SLO_KEYS}")
        slo[key] = float(value)
    return slo


def finite(obj):
    """`obj` with NaN and infinities (not JSON) replaced by None, recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj
