"""What the CUDA caching allocator would reserve for a step's allocations: allocated vs reserved.

``torch.cuda.max_memory_allocated`` counts each tensor's block: its bytes rounded up to a
multiple of 512 (``kMinBlockSize``; 512 for anything smaller).  The allocator *reserves* more:
it takes memory from the driver in segments — 2 MiB for blocks of at most 1 MiB (the small
pool), 20 MiB for blocks under 10 MiB, the block's size rounded up to 2 MiB above that — and
splits a segment's free blocks for later requests (best fit: the smallest free block that holds
the request), merging a freed block with free neighbours of its segment.  A segment is never
given back during a step (only ``empty_cache`` or an out-of-memory retry does), so what is
reserved at the step's peak can exceed what is allocated by the segments' unused tails and by
fragmentation: free blocks too small, or in the wrong pool, for the request that comes.

:class:`Simulator` replays a step's allocations and frees (in the order the fake step made
them, with the allocator's rules as in PyTorch 2.x without expandable segments and with the
default ``max_split_size``) and gives the peak reserved bytes; the estimate reports it next to
the allocated peak.  It is a replay in a fresh process: a real step also reuses the free space
of segments its parameters or an earlier step left, and other streams keep their own blocks.
A large block is split only when more than 1 MiB would be left over, so an allocated block can be
up to 1 MiB larger than its request: ``peak_allocated`` counts it as the allocator's statistics do.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

__all__ = ["BLOCK", "Simulator", "block_bytes"]

BLOCK = 512  # kMinBlockSize: every block is a multiple of this many bytes
_SMALL = 1 << 20  # kSmallSize: blocks up to this size come from the small pool
_SMALL_SEGMENT = 2 << 20  # kSmallBuffer
_LARGE_SEGMENT = 20 << 20  # kLargeBuffer, for blocks under _MIN_LARGE
_MIN_LARGE = 10 << 20  # kMinLargeAlloc
_ROUND_LARGE = 2 << 20  # kRoundLarge


def block_bytes(nbytes: int) -> int:
    """The block the caching allocator hands out for ``nbytes`` (0 for an empty storage)."""
    if nbytes <= 0:
        return 0
    return -(-nbytes // BLOCK) * BLOCK


def _segment_bytes(size: int) -> int:
    if size <= _SMALL:
        return _SMALL_SEGMENT
    if size < _MIN_LARGE:
        return _LARGE_SEGMENT
    return -(-size // _ROUND_LARGE) * _ROUND_LARGE


@dataclass(eq=False)
class _Block:
    segment: int
    offset: int
    size: int
    small: bool  # from the small pool (a 2 MiB segment)
    free: bool = True
    prev: _Block | None = field(default=None, repr=False)
    next: _Block | None = field(default=None, repr=False)

    def key(self) -> tuple[int, int, int]:
        return (self.size, self.segment, self.offset)


class Simulator:
    """Replays allocations and frees by key; ``reserved`` and ``peak_reserved`` are the driver
    memory the caching allocator would hold, ``allocated`` and ``peak_allocated`` its blocks'."""

    def __init__(self) -> None:
        self.reserved = 0
        self.peak_reserved = 0
        self.allocated = 0
        self.peak_allocated = 0
        self._free: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}  # small pool?: sorted keys
        self._blocks: dict[tuple[int, int, int], _Block] = {}  # free blocks by key
        self._used: dict[int, _Block] = {}  # allocated blocks by the caller's key
        self._segments = 0

    def allocate(self, key: int, nbytes: int) -> None:
        """Allocate ``nbytes`` for ``key`` (an empty storage takes no block)."""
        size = block_bytes(nbytes)
        if size == 0:
            return
        small = size <= _SMALL
        block = self._best_fit(small, size)
        if block is None:
            block = _Block(self._segments, 0, _segment_bytes(size), small)
            self._segments += 1
            self.reserved += block.size
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        remaining = block.size - size
        if remaining >= BLOCK if small else remaining > _SMALL:
            rest = _Block(block.segment, block.offset + size, remaining, small, True, block, block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._add_free(rest, small)
        block.free = False
        self._used[key] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key: int) -> None:
        """Free ``key``'s block (nothing when it has none), merged with free neighbours."""
        block = self._used.pop(key, None)
        if block is None:
            return
        self.allocated -= block.size
        small = block.small
        block.free = True
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                self._remove_free(neighbour, small)
                if neighbour is block.prev:
                    neighbour.size += block.size
                    neighbour.next = block.next
                    if block.next is not None:
                        block.next.prev = neighbour
                    block = neighbour
                else:
                    block.size += neighbour.size
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
        self._add_free(block, small)

    def _best_fit(self, small: bool, size: int) -> _Block | None:
        keys = self._free[small]
        i = bisect.bisect_left(keys, (size, -1, -1))
        if i == len(keys):
            return None
        block = self._blocks.pop(keys.pop(i))
        return block

    def _add_free(self, block: _Block, small: bool) -> None:
        key = block.key()
        bisect.insort(self._free[small], key)
        self._blocks[key] = block

    def _remove_free(self, block: _Block, small: bool) -> None:
        key = block.key()
        keys = self._free[small]
        keys.pop(bisect.bisect_left(keys, key))
        del self._blocks[key]
