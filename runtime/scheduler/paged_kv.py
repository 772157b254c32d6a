"""`PagedKV`: vLLM-style KV bookkeeping (`--kv paged`): fixed-size blocks, per-request block
tables, prefix caching by block-hash chains, preemption by recompute.

Block b covers worker slots b * block_size .. b * block_size + block_size - 1, so the same
slot-indexed kernels read a paged layout (page size = block size). Block 0 holds slot 0,
the padding sink, and is the pool's null block.

Caching follows vLLM V1: a full block is registered under hash(parent hash, its tokens)
once its KV has been scheduled (here: by an earlier batch, so its writes precede any
reader), it keeps that hash while free in the LRU queue, and a later request whose
prefix has the same chain takes it back. A preempted request frees its blocks without
registering new ones; its earlier full blocks stay cached, so recompute is mostly hits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from runtime.scheduler.block_pool import (
    Block,
    BlockHash,
    BlockPool,
    chain_block_hashes,
    hash_block_tokens,
)
from runtime.scheduler.req import Req
from runtime.scheduler.row_pool import RowPool


def block_slots(starts: list[int], block_size: int, pos: int, n: int) -> np.ndarray:
    """Slots of positions pos .. pos + n - 1 given each block's first slot: [n] int32."""
    p = np.arange(pos, pos + n)
    first = np.asarray(starts[pos // block_size:(pos + n - 1) // block_size + 1], np.int64)
    return (first[p // block_size - pos // block_size] + p % block_size).astype(np.int32)


@dataclass
class BlockTable:
    """One request's blocks in position order and the hash chain of its full blocks."""

    req: Req
    blocks: list[Block] = field(default_factory=list)
    hashes: list[BlockHash] = field(default_factory=list)  # may run ahead of `blocks`
    num_tokens: int = 0  # positions with a slot
    num_registered: int = 0  # leading blocks offered to the prefix cache


class PagedKV:
    """KV manager over a `BlockPool`: one `BlockTable` per admitted request."""

    def __init__(self, num_slots: int, num_rows: int, block_size: int) -> None:
        self.block_size = self.page_size = block_size
        self.pool = BlockPool((num_slots + 1) // block_size, block_size)
        self.rows = RowPool(num_rows)
        self.tables: dict[str, BlockTable] = {}  # by request id

    # ------------------------------------------------------------------ capacity
    @property
    def total(self) -> int:
        return self.pool.num_usable_blocks * self.block_size

    def available(self) -> int:
        """Slots of the free blocks, cached ones included (allocation evicts them)."""
        return self.pool.num_free_blocks * self.block_size

    def used(self) -> int:
        return self.total - self.available()

    def slots_needed(self, req: Req, n: int) -> int:
        table = self.tables.get(req.rid)
        held = len(table.blocks) if table else 0
        return max(0, -(-(req.kv_len + n) // self.block_size) - held) * self.block_size

    def decode_need(self, reqs: list[Req]) -> int:
        """A block for each request whose last block is full (or that holds none)."""
        tables, bs = self.tables, self.block_size
        return bs * sum(tables[r.rid].num_tokens % bs == 0 for r in reqs)

    def room(self, req: Req) -> int:
        table = self.tables[req.rid]
        return self.available() + len(table.blocks) * self.block_size - table.num_tokens

    # ------------------------------------------------------------------ lifecycle
    def admit(self, req: Req) -> bool:
        """A row and the longest cached run of full blocks of the first
        `req.max_prefix_len` tokens (at least one token is left to compute)."""
        row = self.rows.alloc()
        if row is None:
            return False
        key_len = req.max_prefix_len
        table = BlockTable(req, hashes=chain_block_hashes(req.tokens(0, key_len), self.block_size))
        hits = self.pool.match_prefix(table.hashes, key_len)
        self.pool.touch(hits)
        table.blocks = list(hits)
        table.num_tokens, table.num_registered = len(hits) * self.block_size, len(hits)
        self.tables[req.rid] = table
        req.row = row
        req.prefix_pages = [b.block_id for b in hits]
        req.cached_len = req.kv_len = table.num_tokens
        return True

    def alloc(self, req: Req, n: int) -> np.ndarray | None:
        """Ids of the blocks the next `n` positions start (taken as the last one fills)."""
        table = self.tables[req.rid]
        assert table.num_tokens == req.kv_len, (req, table.num_tokens)
        self._register(table, min(req.kv_len, req.known_len))
        end = table.num_tokens + n
        missing = -(-end // self.block_size) - len(table.blocks)
        new = []
        if missing > 0:
            new = self.pool.allocate(missing)
            if new is None:
                return None
            table.blocks += new
        table.num_tokens = end
        return np.array([b.block_id for b in new], dtype=np.int32)

    def alloc_decode(self, reqs: list[Req]) -> np.ndarray:
        """`alloc(req, 1)` for each of `reqs` (room was reserved): the new block ids of
        those whose last block is full, in order."""
        bs, new = self.block_size, []
        for req in reqs:
            table = self.tables[req.rid]
            pos = table.num_tokens
            if (done := min(pos, len(req.token_ids))) // bs > table.num_registered:
                self._register(table, done)
            if pos % bs == 0:
                block = self.pool.allocate(1)[0]
                table.blocks.append(block)
                new.append(block.block_id)
            table.num_tokens = pos + 1
        return np.array(new, dtype=np.int32)

    def release(self, req: Req, *, cache: bool) -> None:
        """Free `req`'s blocks, tail first into the LRU queue; with `cache`, register its
        remaining full, computed blocks first (without: only those registered already)."""
        table = self.tables.pop(req.rid, None)
        if table is not None:
            if cache:
                self._register(table, min(table.num_tokens, req.known_len))
            self.pool.free(table.blocks)
        if req.row is not None:
            self.rows.free(req.row)

    def _register(self, table: BlockTable, num_tokens: int) -> None:
        """Offer the full blocks among the first `num_tokens` positions to the cache."""
        full = num_tokens // self.block_size
        if full <= table.num_registered:
            return
        if (k := len(table.hashes)) < full:  # hash only the blocks not hashed yet
            tokens = table.req.tokens(k * self.block_size, full * self.block_size)
            table.hashes += chain_block_hashes(tokens, self.block_size, table.hashes)
        self.pool.cache_full_blocks(table.blocks, table.hashes[:full], table.num_registered)
        table.num_registered = full

    # ------------------------------------------------------------------ checks
    def check_invariants(self, live: list[Req]) -> None:
        """Pool invariants, plus: one table per live request, each block held exactly as
        often as tables list it, block tables cover `req.kv_len`, the hash chain's last link
        matches the tokens, registered blocks carry their own chain hash (or none: a
        duplicate of a block cached first)."""
        self.pool.check_invariants()
        assert {r.rid for r in live} == set(self.tables), "block tables and live requests differ"
        refs: dict[int, int] = {}
        bs = self.block_size
        for req in live:
            table = self.tables[req.rid]
            ids = [b.block_id for b in table.blocks]
            assert len(set(ids)) == len(ids), f"{req.rid} holds a block twice"
            assert len(ids) == -(-table.num_tokens // bs) and table.num_tokens == req.kv_len, (
                f"{req.rid}: {len(ids)} blocks for {table.num_tokens} tokens (kv_len {req.kv_len})")
            if k := len(table.hashes):  # the chain's last link (O(1): stats call this)
                parent = table.hashes[k - 2] if k > 1 else None
                tail = hash_block_tokens(parent, req.tokens((k - 1) * bs, k * bs))
                assert tail == table.hashes[-1], f"{req.rid}: stale hash chain"
            for block, block_hash in zip(table.blocks[:table.num_registered], table.hashes):
                assert block.block_hash in (None, block_hash), f"{block} caches another hash"
            for i in ids:
                refs[i] = refs.get(i, 0) + 1
        for block in self.pool.blocks[1:]:
            assert block.ref_cnt == refs.get(block.block_id, 0), (
                f"{block}: {refs.get(block.block_id, 0)} tables hold it")

    # ------------------------------------------------------------------ stats
    def occupancy(self) -> tuple[int, int]:
        """Only a request's last block can be partly empty, and it is never shared."""
        reserved = self.used()
        slack = sum(len(t.blocks) * self.block_size - t.num_tokens for t in self.tables.values())
        return reserved - slack, reserved

    def stats_fields(self) -> dict[str, int]:
        cached = sum(b.block_hash is not None for b in self.pool.free_queue) * self.block_size
        live, reserved = self.occupancy()
        return dict(kv_free=self.available() - cached, kv_cached=cached, kv_held=live,
                    prefix_hit_tokens=self.pool.hit_tokens,
                    prefix_query_tokens=self.pool.query_tokens)
