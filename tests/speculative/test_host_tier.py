"""The host KV tier (`--host-kv-gib`) with a drafter on the device: the drafter's rows of a
slot (a draft model's KV; an EAGLE head's KV and feature row; n-gram lookup's token id) go
to the host and come back with the target's KV, byte for byte (`CheckedCopies`), on
prefixes loaded from the host and on requests swapped out and back in. The target drafting
for itself shows that the draft KV it read after a load was right: every draft is accepted
(without the draft KV in the tier, a third are)."""

from __future__ import annotations

from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.worker.worker import Worker
from tests.speculative.eagle_heads import target_checkpoint, write_copy_head
from tests.worker.test_host_tier import serve_turns, serve_with_copies, tier_configs, turns_of

BASE = dict(device="cpu", dtype="float32", kv_slots=4095, max_running=16, chunk_size=64,
            torch_threads=1, log_level="warning")
SPEC = dict(speculative_num_draft_tokens=3, speculative_off_window=0)


def check(model: str, vocab: int, **drafter) -> list:
    """Plain decoding's outputs with a host tier and with swapping (conversations of ids
    below `vocab`); returns the schedulers of those runs."""
    turns = [[[t % vocab for t in msg] for msg in turn] for turn in turns_of(8, 3, seed=7)]
    ref, _, _ = serve_turns(ServerConfig(model=model, **BASE), turns, 6)
    scheds = []
    # a pool of 383 slots (191 to swap in): verify steps, which wait for their results,
    # let fewer requests run at once than plain decoding's overlapped steps do
    for name, cfg in tier_configs(ServerConfig(model=model, **BASE, **drafter, **SPEC),
                                  383).items():
        got, sched, _ = serve_with_copies(cfg, turns)
        assert got == ref, name
        assert sched.spec.verify_steps > 0, name
        scheds.append(sched)
    return scheds


def test_a_draft_models_kv_goes_to_the_host_and_back():
    for sched in check("dummy:tiny", 1024, speculative_algorithm="draft",
                       speculative_draft_model="dummy:tiny"):
        assert sched.spec.accepted == sched.spec.drafted


def test_an_eagle_heads_rows_go_to_the_host_and_back(tmp_path):
    """Its pool and feature rows are members of the host tier's copies, so checked byte
    for byte (the copying head's drafts read no head KV, and a random head's are seldom
    kept: acceptance would not show a row left behind)."""
    target_checkpoint(tmp_path / "target")
    write_copy_head(tmp_path / "head")
    drafter = dict(speculative_algorithm="eagle", speculative_draft_model=str(tmp_path / "head"))
    check(str(tmp_path / "target"), 256, **drafter)
    cfg = ServerConfig(model=str(tmp_path / "target"), **BASE, **drafter, host_kv_gib=0.05)
    worker = Worker(cfg, resolve_model(cfg.model))
    copied = {t.data_ptr() for tensors, _ in worker.transfer.groups for t in tensors.tensors}
    head = worker.drafter
    assert {t.data_ptr() for t in [*head.pool.layer_tensors(), head.features]} <= copied


def test_ngram_token_ids_go_to_the_host_and_back():
    """With overlap n-gram lookup drafts in the worker from a token id a slot
    (`NgramOnDevice`): the ids go with their slot, so a prefix loaded from the host has
    its tokens to look up."""
    for sched in check("dummy:tiny", 1024, speculative_algorithm="ngram", overlap=True):
        assert sched.spec.chains
    cfg = ServerConfig(model="dummy:tiny", **BASE, speculative_algorithm="ngram", overlap=True,
                       host_kv_gib=0.05)
    worker = Worker(cfg, resolve_model(cfg.model))
    copied = {t.data_ptr() for tensors, _ in worker.transfer.groups for t in tensors.tensors}
    assert worker.drafter.tokens.data_ptr() in copied
