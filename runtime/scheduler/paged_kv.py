"""`PagedKV`: block KV bookkeeping (`--kv paged`): fixed-size blocks, per-request block
tables, prefix caching by block-hash chains, preemption by recompute.

Block b covers worker slots b * block_size .. b * block_size + block_size - 1, so the same
slot-indexed kernels read a paged layout (page size = block size). Block 0 holds slot 0,
the padding sink, and is the pool's null block.

Caching: a full block is registered under hash(parent hash, its tokens)
once its KV has been scheduled (here: by an earlier batch, so its writes precede any
reader), it keeps that hash while free in the LRU queue, and a later request whose
prefix has the same chain takes it back. A preempted request frees its blocks without
registering new ones; its earlier full blocks stay cached, so recompute is mostly hits.
A request of a LoRA adapter chains its hashes from a seed of the adapter's name
(`space_seed`): its blocks are cached apart from every other adapter's and the base's.
With a host tier and `--preempt swap`, its full blocks are copied to
host slots first, and its re-admission loads those the device no longer caches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from runtime.scheduler.block_pool import (
    Block,
    BlockHash,
    BlockPool,
    chain_block_hashes,
    hash_block_tokens,
    space_seed,
)
from runtime.scheduler.host_tier import HostTier
from runtime.scheduler.kv_manager import KVManager
from runtime.scheduler.req import Req


@dataclass
class BlockTable:
    """One request's blocks in position order and the hash chain of its full blocks."""

    req: Req
    blocks: list[Block] = field(default_factory=list)
    hashes: list[BlockHash] = field(default_factory=list)  # may run ahead of `blocks`
    num_tokens: int = 0  # positions with a slot
    num_registered: int = 0  # leading blocks offered to the prefix cache


class PagedKV(KVManager[BlockTable]):
    """KV manager over a `BlockPool`: one `BlockTable` per admitted request."""

    prefix_cache = True

    def __init__(self, num_slots: int, num_rows: int, block_size: int,
                 host: HostTier | None = None) -> None:
        super().__init__(num_rows)
        self.block_size = self.page_size = block_size
        self.pool = BlockPool((num_slots + 1) // block_size, block_size)
        self.host = host  # only swapped-out requests live there
        self.swapped: dict[str, tuple[np.ndarray, int]] = {}  # rid -> (host slots, tokens)

    @property
    def total(self) -> int:
        return self.pool.num_usable_blocks * self.block_size

    def room(self, req: Req) -> int:
        table = self.tables[req.rid]
        return self._available() + len(table.blocks) * self.block_size - table.num_tokens

    # ------------------------------------------------------------------ layout
    def _match(self, req: Req) -> tuple[BlockTable, np.ndarray]:
        """The longest cached run of full blocks of the first `req.max_prefix_len` tokens
        that the model's rule allows (`aligned`; at least one token is left to compute)."""
        hashes = chain_block_hashes(req.tokens(0, req.max_prefix_len), self.block_size,
                                    space_seed(req.lora))
        hits = self.pool.match_prefix(hashes)
        hits = hits[: self._aligned_blocks(len(hits))]
        self.pool.touch(hits)
        if req.rid in self.swapped:
            hits = self._swap_in(req, hits, len(hashes))
            self.pool.cache_full_blocks(hits, hashes[: len(hits)])
        table = BlockTable(req, list(hits), hashes, len(hits) * self.block_size, len(hits))
        return table, np.array([b.block_id for b in hits], dtype=np.int32)

    def _swap_in(self, req: Req, hits: list[Block], usable: int) -> list[Block]:
        """`hits` extended with fresh blocks loaded from the host copy of a swapped-out
        `req`, up to `usable` blocks (unchanged if none are free); the host copy goes."""
        host, tokens = self.swapped.pop(req.rid)
        self.host.release(host)
        bs, k = self.block_size, len(hits)
        m = self._aligned_blocks(min(tokens // bs, usable))
        new = self.pool.allocate(m - k) if m > k else None
        if new is None:
            return hits
        self.host.load(host[k * bs : m * bs], _slots_of(new, bs), start=k * bs)
        return hits + new

    def _aligned_blocks(self, n: int) -> int:
        """The most blocks, at most `n`, whose tokens are an `aligned` prefix hit."""
        step = self.prefix_align // math.gcd(self.prefix_align, self.block_size)
        return self.aligned((n - n % step) * self.block_size) // self.block_size

    def swap_out(self, req: Req) -> bool:
        """Copy its full, computed blocks to the host, then free them (they stay cached
        here too until reused)."""
        table = self.tables.get(req.rid)
        full = min(req.kv_len, req.known_len - 1) // self.block_size
        if self.host is None or table is None or full == 0:
            return False
        host = self.host.swap_out(_slots_of(table.blocks[:full], self.block_size))
        if host is None:
            return False
        self.swapped[req.rid] = (host, full * self.block_size)
        self.release(req, cache=False)
        return True

    def forget(self, req: Req) -> None:
        if (swapped := self.swapped.pop(req.rid, None)) is not None:
            self.host.release(swapped[0])

    def _grow(self, req: Req, table: BlockTable, n: int) -> np.ndarray | None:
        """Ids of the blocks the next `n` positions start (taken as the last one fills)."""
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

    def _grow_decode(self, reqs: list[Req]) -> np.ndarray:
        """The new block ids of those of `reqs` whose last block is full, in order."""
        bs, tables, new = self.block_size, self.tables, []
        for req in reqs:
            table = tables[req.rid]
            pos = table.num_tokens
            if (done := min(pos, len(req.token_ids))) // bs > table.num_registered:
                self._register(table, done)
            if pos % bs == 0:
                block = self.pool.allocate(1)[0]
                table.blocks.append(block)
                new.append(block.block_id)
            table.num_tokens = pos + 1
        return np.array(new, dtype=np.int32)

    def _shrink(self, req: Req, table: BlockTable, kv_len: int) -> None:
        """Free the blocks past the one holding position kv_len - 1 (never registered:
        only blocks of known tokens are, and these held drafts)."""
        keep = -(-kv_len // self.block_size)
        assert keep >= table.num_registered, (req, keep, table.num_registered)
        self.pool.free(table.blocks[keep:])
        del table.blocks[keep:]
        table.num_tokens = kv_len

    def _free(self, req: Req, table: BlockTable, cache: bool) -> None:
        """Free the blocks, tail first into the LRU queue; with `cache`, register the
        remaining full, computed blocks first (without: only those registered already)."""
        if cache:
            self._register(table, min(table.num_tokens, req.known_len))
        self.pool.free(table.blocks)

    def _register(self, table: BlockTable, num_tokens: int) -> None:
        """Offer the full blocks among the first `num_tokens` positions to the cache."""
        full = num_tokens // self.block_size
        if full <= table.num_registered:
            return
        if (k := len(table.hashes)) < full:  # hash only the blocks not hashed yet
            tokens = table.req.tokens(k * self.block_size, full * self.block_size)
            table.hashes += chain_block_hashes(tokens, self.block_size,
                                               table.hashes or space_seed(table.req.lora))
        self.pool.cache_full_blocks(table.blocks, table.hashes[:full], table.num_registered)
        table.num_registered = full

    def flush_cache(self) -> int:
        return self.pool.uncache_free_blocks() * self.block_size

    def _available(self) -> int:
        """Slots of the free blocks, cached ones included (allocation evicts them)."""
        return self.pool.num_free_blocks * self.block_size

    def _cached(self) -> int:
        return sum(b.block_hash is not None for b in self.pool.free_queue) * self.block_size

    def _slots_needed(self, req: Req, n: int) -> int:
        table = self.tables.get(req.rid)
        held = len(table.blocks) if table else 0
        return max(0, -(-(req.kv_len + n) // self.block_size) - held) * self.block_size

    def _decode_need(self, reqs: list[Req]) -> int:
        """A block for each request whose last block is full (or that holds none)."""
        tables, bs = self.tables, self.block_size
        return bs * sum(tables[r.rid].num_tokens % bs == 0 for r in reqs)

    def _occupancy(self, used: int) -> tuple[int, int]:
        """Only a request's last block can be partly empty, and it is never shared."""
        slack = sum(len(t.blocks) * self.block_size - t.num_tokens for t in self.tables.values())
        return used - slack, used

    def _check(self, live: list[Req]) -> None:
        """Pool invariants, plus: each block held exactly as often as tables list it, block
        tables cover `req.kv_len`, the hash chain's last link matches the tokens,
        registered blocks carry their own chain hash (or none: a duplicate of a block
        cached first)."""
        self.pool.check_invariants()
        if self.host is not None:
            self.host.check_invariants()
            held = sum(len(h) for h, _ in self.swapped.values())
            assert held <= self.host.swapped, f"{held} slots swapped, {self.host.swapped} held"
        refs: dict[int, int] = {}
        bs = self.block_size
        for req in live:
            table = self.tables[req.rid]
            ids = [b.block_id for b in table.blocks]
            assert len(set(ids)) == len(ids), f"{req.rid} holds a block twice"
            assert len(ids) == -(-table.num_tokens // bs) and table.num_tokens == req.kv_len, (
                f"{req.rid}: {len(ids)} blocks for {table.num_tokens} tokens (kv_len {req.kv_len})"
            )
            if k := len(table.hashes):  # the chain's last link (O(1): stats call this)
                parent = table.hashes[k - 2] if k > 1 else (space_seed(req.lora) or [None])[0]
                tail = hash_block_tokens(parent, req.tokens((k - 1) * bs, k * bs))
                assert tail == table.hashes[-1], f"{req.rid}: stale hash chain"
            for block, block_hash in zip(table.blocks[: table.num_registered], table.hashes):
                assert block.block_hash in (None, block_hash), f"{block} caches another hash"
            for i in ids:
                refs[i] = refs.get(i, 0) + 1
        for block in self.pool.blocks[1:]:
            assert block.ref_cnt == refs.get(block.block_id, 0), (
                f"{block}: {refs.get(block.block_id, 0)} tables hold it"
            )


def _slots_of(blocks: list[Block], block_size: int) -> np.ndarray:
    """The slots of `blocks`, block by block: [len(blocks) * block_size] int32."""
    ids = np.array([b.block_id for b in blocks], dtype=np.int32)
    return (ids[:, None] * block_size + np.arange(block_size, dtype=np.int32)).ravel()
