"""`BlockPool`: fixed-size KV blocks with hash-based prefix caching (the `paged` KV mode).

A block is either held (`ref_cnt > 0`) or sits in the `FreeBlockQueue`; a free
block keeps its KV and its hash until it is reallocated, so a later request with the
same prefix can take it back (`touch`). Allocation pops the least recently freed block.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence

import numpy as np

from runtime.scheduler.row_pool import AllocatorError

BlockHash = bytes


def hash_block_tokens(parent_hash: BlockHash | None, tokens: Sequence[int]) -> BlockHash:
    """Hash of a full block given the hash of the block before it (None for the first).

    A 128-bit BLAKE2b digest rather than Python's `hash`: a collision would silently serve
    another prompt's KV. Parent digests are 16 bytes and a first block has none, so the
    input bytes are unambiguous.
    """
    digest = hashlib.blake2b(digest_size=16)
    if parent_hash is not None:
        digest.update(parent_hash)
    digest.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return digest.digest()


def space_seed(space: str | None) -> tuple[BlockHash, ...]:
    """What a request's hash chain starts from: nothing for the base model; for a LoRA
    adapter, a digest of its name (its first block's parent), so the same tokens computed
    under another adapter, or none, never match."""
    if space is None:
        return ()
    return (hashlib.blake2b(b"lora:" + space.encode(), digest_size=16).digest(),)


def chain_block_hashes(
    tokens: Sequence[int], block_size: int, known: Sequence[BlockHash] = ()
) -> list[BlockHash]:
    """Hashes of the full blocks of `tokens`, the tokens that follow the blocks already
    hashed in `known` (a request extends its chain with `hashes += chain_block_hashes(...)`,
    passing only its new tokens)."""
    hashes: list[BlockHash] = []
    parent = known[-1] if known else None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, tokens[start : start + block_size])
        hashes.append(parent)
    return hashes


class Block:
    """One KV block: `[block_size, kv_heads, head_dim]` per layer on the worker."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0  # requests holding it
        self.block_hash: BlockHash | None = None  # set while it caches a full block
        self.prev_free: Block | None = None  # links while in the FreeBlockQueue
        self.next_free: Block | None = None

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_cnt}, cached={self.block_hash is not None})"


class FreeBlockQueue:
    """Doubly linked list of free blocks in eviction order: allocation pops the head, a
    freed block is appended at the tail; `remove` takes a block out of the middle in O(1)."""

    def __init__(self, blocks: Sequence[Block]) -> None:
        self._head = Block(-1)  # sentinels: every real block has both links set
        self._tail = Block(-1)
        self._head.next_free, self._tail.prev_free = self._tail, self._head
        self._len = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Block]:
        block = self._head.next_free
        while block is not self._tail:
            yield block
            block = block.next_free

    def append(self, block: Block) -> None:
        last = self._tail.prev_free
        last.next_free, block.prev_free = block, last
        block.next_free, self._tail.prev_free = self._tail, block
        self._len += 1

    def popleft(self) -> Block:
        if not self._len:
            raise AllocatorError("no free blocks")
        block = self._head.next_free
        self.remove(block)
        return block

    def remove(self, block: Block) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise AllocatorError(f"block {block.block_id} is not in the free queue")
        prev.next_free, nxt.prev_free = nxt, prev
        block.prev_free = block.next_free = None
        self._len -= 1


class BlockPool:
    """Blocks 1..num_blocks-1 for requests; block 0 is the null block (padding), never
    handed out. Full blocks are cached by the hash chain of their tokens."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 2 or block_size < 1:
            raise ValueError(
                f"need num_blocks >= 2 and block_size >= 1, got {num_blocks}, {block_size}"
            )
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.free_queue = FreeBlockQueue(self.blocks[1:])  # iterate: next allocated first
        self._cached: dict[BlockHash, Block] = {}

    @property
    def num_usable_blocks(self) -> int:
        return len(self.blocks) - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks allocatable now (free, cached or not)."""
        return len(self.free_queue)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by requests."""
        return 1.0 - len(self.free_queue) / self.num_usable_blocks

    # ------------------------------------------------------------------ prefix cache
    def get_cached_block(self, block_hash: BlockHash) -> Block | None:
        """The block caching `block_hash`, held or free, or None."""
        return self._cached.get(block_hash)

    def match_prefix(self, block_hashes: Sequence[BlockHash]) -> list[Block]:
        """Cached blocks for the longest run of leading `block_hashes`. The blocks are not
        held yet: `touch` them before the next `allocate`, which may reuse free ones."""
        hits: list[Block] = []
        for block_hash in block_hashes:
            block = self._cached.get(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def touch(self, blocks: Sequence[Block]) -> None:
        """Take one more reference on each block (a prefix hit); a cached block that was
        free leaves the free queue, keeping its hash and KV."""
        for block in blocks:
            self._check_not_null(block)
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def cache_full_blocks(
        self, blocks: Sequence[Block], block_hashes: Sequence[BlockHash], start: int = 0
    ) -> None:
        """Register `blocks[i]` as caching `block_hashes[i]` for `start <= i <
        len(block_hashes)`: pass only the hashes of full blocks whose KV is computed (or in
        a batch already sent). A block already cached keeps its hash; a hash already cached
        by another block leaves this duplicate uncached (reused like a plain block)."""
        if len(block_hashes) > len(blocks):
            raise ValueError(f"{len(block_hashes)} hashes for {len(blocks)} blocks")
        for block, block_hash in zip(
            blocks[start : len(block_hashes)], block_hashes[start:], strict=True
        ):
            if block.block_hash is not None:
                if block.block_hash != block_hash:
                    raise ValueError(f"block {block.block_id} already caches another hash")
                continue
            if block_hash not in self._cached:
                block.block_hash = block_hash
                self._cached[block_hash] = block

    def uncache_free_blocks(self) -> int:
        """Forget the hashes of the free blocks (held ones keep theirs); return how many
        blocks stopped caching."""
        dropped = 0
        for block in self.free_queue:
            if block.block_hash is not None:
                del self._cached[block.block_hash]
                block.block_hash = None
                dropped += 1
        return dropped

    # ------------------------------------------------------------------ alloc / free
    def allocate(self, n: int) -> list[Block] | None:
        """`n` blocks with one reference each, least recently freed first, or None (nothing
        taken) if fewer are free. A reused block loses its cached hash."""
        if n > len(self.free_queue):
            return None
        blocks = [self.free_queue.popleft() for _ in range(n)]
        for block in blocks:
            if block.block_hash is not None:
                del self._cached[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
        return blocks

    def free(self, blocks: Sequence[Block]) -> None:
        """Drop one reference on each of a request's blocks (given in sequence order).
        Blocks reaching zero go to the free queue tail in reverse order, so the request's
        last blocks, the least likely to be shared, are reallocated first."""
        for block in reversed(blocks):
            self._check_not_null(block)
            if block.ref_cnt == 0:
                raise AllocatorError(f"double free of block {block.block_id}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def _check_not_null(self, block: Block) -> None:
        if block is self.null_block:
            raise AllocatorError("the null block is never held or freed")

    # ------------------------------------------------------------------ checks
    def check_invariants(self) -> None:
        """Assert each usable block is held xor free (once), the null block is neither, and
        the hash map and block hashes agree. Raises AssertionError."""
        free = list(self.free_queue)
        free_ids = {b.block_id for b in free}
        assert len(free_ids) == len(free) == len(self.free_queue), (
            "a block is in the free queue twice"
        )
        assert self.null_block.block_id not in free_ids and self.null_block.ref_cnt == 0, (
            "the null block is in use"
        )
        for block in self.blocks[1:]:
            held, queued = block.ref_cnt > 0, block.block_id in free_ids
            assert held != queued, (
                f"block {block.block_id}: ref_cnt {block.ref_cnt}, in free queue {queued}"
            )
        for block_hash, block in self._cached.items():
            assert block.block_hash == block_hash, f"block {block.block_id} hash mismatch"
        hashed = sum(b.block_hash is not None for b in self.blocks)
        assert hashed == len(self._cached), (
            f"{hashed} blocks carry a hash, {len(self._cached)} are in the cache map"
        )
