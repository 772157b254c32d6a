"""DeepSeek-V4 with `--kv-dtype fp8` (window rows and compressed entries as e4m3 codes with
a float32 scale a row, indexer keys and partial blocks in the model's dtype), a tiny random
checkpoint in fp32 on the CPU: the bytes a token costs; the logits against the fp32 pool,
teacher-forced, over prompts longer than the window and several compression blocks fed in
chunks (each chunk reads the rows and entries of the ones before from the pool, as a prefix
hit does), in the token (entry ids from the page table and from entry tables), paged and
contiguous layouts, and through the Triton kernels (interpreted) as through their torch
references; served with real prefix hits, the tokens of no hit; and the host tier moving
the rows' and entries' scales with them."""

from __future__ import annotations

import pytest
import torch

from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.worker.model_runner import ModelRunner
from runtime.worker.models.deepseek_v4_entries import v4_bytes_per_token
from runtime.worker.ops import TritonOps
from tests.worker.dsv4_checkpoints import interleave_entries, tiny_v4
from tests.worker.test_deepseek import LAYOUTS, run
from tests.worker.test_deepseek_v4_serving import config, prompts_of, serve_waves
from tests.worker.test_host_tier import serve_turns, serve_with_copies, tier_configs, turns_of

E4M3 = torch.float8_e4m3fn
# tokens per step of each sequence (window 8, entries every 4 and 8 tokens): 64 and 53
# tokens, chunks starting and ending inside windows and blocks, then decode steps
SCHEDULE = [[13, 7, 19, 11, 1, 1, 1, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
            [6, 11, 4, 9, 5, 1, 1, 1, 1, 3, 1, 1, 1, 1, 1, 1, 1, 1]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("dsv4_fp8")
    tiny_v4(folder)
    return str(folder)


def runner_of(folder: str, kv_dtype: str, table: bool = False) -> ModelRunner:
    return ModelRunner(resolve_model(folder), "cpu", torch.float32, kv_slots=1024,
                       max_rows=len(SCHEDULE), kv_dtype=kv_dtype, entry_table=table)


def test_fp8_pool_bytes_equal_the_formula(checkpoint):
    """Each layer's K=V row is 32 e4m3 codes and a 4-byte scale; an entry id holds its
    entry the same way (32 + 4) and, in a CSA layer, its indexer key in fp32 (16 x 4): in
    the token layout with entry tables one id a window, 2 CSA layers a 4 tokens and 1 HCA
    layer a 8; with ids following pages of 1, one id a slot. Against fp32: 0.37x."""
    rows = 4 * (32 + 4)
    per_window = 2 * (32 + 4 + 16 * 4) / 4 + (32 + 4) / 8  # 54.5
    table = runner_of(checkpoint, "fp8", table=True)
    assert table.kv_bytes_per_token == rows + 55 == 199
    paged = runner_of(checkpoint, "fp8")
    assert paged.kv_bytes_per_token == rows + 2 * (32 + 4 + 16 * 4) + (32 + 4) == 380
    assert runner_of(checkpoint, "auto").kv_bytes_per_token == 1024
    arch = paged.model.arch
    assert v4_bytes_per_token(arch, torch.float32, 1, True, "fp8") == 199 > rows + per_window
    pool, entries = paged.kv_pool, paged.model.entries
    assert [k.dtype for k in pool.k] == [E4M3] * 4 and pool.k_scale[0].shape == (1025, 1)
    assert entries.entry[1].dtype == entries.entry[2].dtype == E4M3
    assert entries.idx_key[1].dtype == torch.float32 and 2 not in entries.idx_key
    assert entries.entry_scale[2].shape == (entries.counts[8], 1)
    # what the host tier copies by id: entries, indexer keys and scales of each rate
    assert [(t.dtype, t.shape[1]) for t in entries.pools(4)] == [
        (E4M3, 32), (E4M3, 32), (torch.float32, 16), (torch.float32, 16),
        (torch.float32, 1), (torch.float32, 1)]


def logits_of(runner: ModelRunner, page_size: int, per_slot: bool,
              table: bool) -> list[torch.Tensor]:
    """Every position's logits of SCHEDULE's sequences (drawn from seed 1)."""
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 256, (sum(s),), generator=gen).tolist() for s in SCHEDULE]
    if table:
        interleave_entries(runner.model, len(seqs))
    return run(runner, seqs, page_size, per_slot, SCHEDULE)


@pytest.mark.parametrize("layout", [(*LAYOUTS[0], True), *[(*x, False) for x in LAYOUTS]],
                         ids=["token-table", "token", "paged", "contiguous"])
def test_fp8_pool_tracks_the_fp32_pool(checkpoint, layout):
    """Teacher-forced, 116 positions of 2 sequences (64 and 53 tokens). Measured, the same
    in every layout (max |logit| of the reference 3.87, median top-2 margin 0.21): mean abs
    logit error 0.096, max 2.89, top-1 agreement 0.828, its 20 flips all at top-2 margins
    of at most 0.457 (22 positions have more, none flips). For scale, the fp32 pool with its
    rows and entries rounded to bf16 instead: mean 0.025, max 2.74, top-1 0.948. The tiny
    random model's logits are flat and chaotic: a rounding that moves an indexer's top-k
    pick or a routed expert moves a logit far, in 16 bits too, so the max error says
    little; the mean error and the flips' margins carry the signal."""
    _, page_size, per_slot, table = layout
    want = torch.cat(logits_of(runner_of(checkpoint, "auto", table), page_size, per_slot,
                               table))  # [N, V]
    got = torch.cat(logits_of(runner_of(checkpoint, "fp8", table), page_size, per_slot,
                              table))
    err = (got - want).abs()
    assert 0 < err.mean() <= 0.15  # nonzero: the pool really quantizes
    assert err.max() <= 0.9 * want.abs().max()
    top2 = want.topk(2, dim=-1).values  # [N, 2]
    agree = got.argmax(-1) == want.argmax(-1)  # [N]
    assert agree.float().mean() >= 0.78
    assert agree[top2[:, 0] - top2[:, 1] > 0.5].all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter test")
def test_triton_kernels_read_the_fp8_pool_as_the_references_do(checkpoint):
    """The ops a GPU runs (interpreted) on the fp8 pool, paged: the references' logits (the
    rows are quantized by the same torch ops in both)."""
    want = logits_of(runner_of(checkpoint, "fp8"), 4, False, False)
    runner = runner_of(checkpoint, "fp8")
    runner.model.model.ops = TritonOps(None)
    for got, w in zip(logits_of(runner, 4, False, False), want):
        torch.testing.assert_close(got, w, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kv", [dict(kv="token"), dict(kv="paged", block_size="4")])
def test_fp8_prefix_hits_give_the_tokens_of_no_hit(checkpoint, kv):
    """Served prompts sharing 13, 17 and 24 tokens of an earlier one hit 8, 16 and 24 of
    them (the e4m3 rows and entries of the prefix, their scales with them) and continue as
    the same prompts served at once do (no hit, but the paged layout's of 24 on the
    first's blocks): a hit reads the codes its owner stored, as recomputing stores them."""
    first, *tails = prompts_of(3, 40, 9, 6, 11)
    shared = [first[:13] + tails[0], first[:17] + tails[1], first[:24] + tails[2]]
    cfg = config(checkpoint, kv_dtype="fp8", **kv)
    hits, cached, _ = serve_waves(cfg, [[first], shared])
    assert cached == [0, 8, 16, 24]
    fresh, cached, _ = serve_waves(cfg, [[first, *shared]])  # all at once: first computed
    assert sum(cached) < 48 and fresh == hits


def test_fp8_rows_entries_and_scales_go_to_the_host_and_back():
    """The host tier and swaps (token and paged) on an fp8 pool give the greedy tokens of
    an fp8 pool that keeps everything; every write-back and load of the rows, entries and
    their scale tensors lands byte for byte (`CheckedCopies`), the scales in groups of
    their own (the rows' 4, each rate's entries'); in the paged layout too under a pool
    that loads swapped blocks back, their entries by the ids their pages give."""
    base = ServerConfig(model="dummy:deepseek-v4-tiny", device="cpu", dtype="float32",
                        max_running=16, chunk_size=64, torch_threads=1, log_level="warning",
                        kv_dtype="fp8", kv_slots=4095)
    turns = turns_of(8, 3, seed=7)
    ref, _, _ = serve_turns(base, turns, 6)
    def scale_groups(groups) -> list[int]:
        """The sizes of the groups of scale tensors (`[slots or ids, 1]` each)."""
        return [len(g.tensors) for g, _ in groups if g.tensors[0].shape[1:] == (1,)]

    for name, cfg in tier_configs(base, 255).items():
        got, _, copies = serve_with_copies(cfg, turns)
        assert got == ref, name
        assert scale_groups(copies.xfer.groups) == [4], name
        assert {m: scale_groups(g) for m, g in copies.xfer.entry_groups.items()} == {
            4: [2], 16: [1]}, name  # CSA layers 1, 3 entry every 4 tokens, HCA layer 2 every 16
        assert copies.entry_ids > 0, name
    paged, turns = tier_configs(base, 254)["paged swap"], turns_of(6, 2, seed=7)
    got, sched, copies = serve_turns(paged, turns, 12)
    assert sched.num_swaps > 0 and copies.load_slots > 0 and copies.entry_loads > 0
    assert got == serve_turns(base.replace(kv="paged"), turns, 12)[0]
