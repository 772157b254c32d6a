"""The host KV tier (`--host-kv-gib`) served end to end: multi-turn conversations on a
device pool that holds a fraction of their history give the greedy tokens of a pool that
holds it all, while later turns load their history back from the host.

(The copies' bytes and the tier under swap preemption are checked in-process in
tests/worker/test_host_tier.py; this checks the served path: flags, processes, stats.)
"""

from __future__ import annotations

from runtime import Engine, SamplingParams
from tests.worker.test_host_tier import turns_of

OPTIONS = dict(model="dummy:tiny", device="cpu", dtype="float32", max_running=16,
               chunk_size=64, torch_threads=1, log_level="warning")
MAX_TOKENS = 6


def converse(**options) -> tuple[list[list[list[int]]], object]:
    """Eight conversations of three turns, each turn one batch whose prompts are the
    conversations so far plus a new message; the outputs per turn, and the stats."""
    turns = turns_of(8, 3, seed=7)
    history: list[list[int]] = [[] for _ in turns[0]]
    outputs = []
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    with Engine(**OPTIONS, **options) as eng:
        for user in turns:
            prompts = [h + m for h, m in zip(history, user)]
            ids = [o.token_ids for o in eng.generate(prompts, params)]
            history = [p + i for p, i in zip(prompts, ids)]
            outputs.append(ids)
        stats = eng.stats()
    assert stats.invariant_error is None and stats.kv_used == 0
    return outputs, stats


def test_served_host_tier_gives_the_outputs_of_a_pool_that_holds_everything():
    ref, ref_stats = converse(kv_slots=4095)
    got, stats = converse(kv_slots=255, host_kv_gib=0.05)
    assert got == ref
    assert ref_stats.host_kv_total == 0 and stats.host_kv_total > 0
    # history evicted from the device went to the host and came back for later turns
    assert stats.writeback_bytes > 0 and stats.load_bytes > 0
    assert 0 < stats.host_hit_tokens <= stats.prefix_hit_tokens
