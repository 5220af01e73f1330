"""The caching allocator's blocks and size rules (c10/cuda/CUDACachingAllocator.cpp, torch 2.13).

`Block` (a piece of a segment, linked to its neighbours), `ExpandableSegment`, the rounding
of a request (`round_size`, with roundup_power2_divisions) and the size of a new segment
(`allocation_size`); the allocator itself is emulator.memory.allocator.
"""

from __future__ import annotations

from emulator.memory.config import (
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    AllocatorConfig,
)


class Block:
    """One block of a segment (CUDACachingAllocator's Block)."""

    __slots__ = (
        "addr", "size", "requested", "stream", "small", "prev", "next",
        "allocated", "mapped", "segment", "gc_base", "uses", "events",
    )  # fmt: skip

    def __init__(self, addr, size, stream, small, segment=None, mapped=True):
        self.addr, self.size, self.stream, self.small = addr, size, stream, small
        self.segment, self.mapped = segment, mapped
        self.requested, self.allocated, self.gc_base, self.events = 0, False, 0, 0
        self.prev = self.next = None
        self.uses: set[int] = set()

    def splice(self, before, after) -> None:
        if before is not None:
            before.next = self
        self.prev = before
        if after is not None:
            after.prev = self
        self.next = after

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class ExpandableSegment:
    __slots__ = ("base", "page", "size")

    def __init__(self, base: int, page: int, size: int):
        self.base, self.page, self.size = base, page, size


def round_size(size: int, config: AllocatorConfig) -> int:
    """DeviceCachingAllocator::round_size."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    divisions = config.divisions_for(size)
    if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
        return _roundup_power2_next_division(size, divisions)
    return -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


def allocation_size(size: int, config: AllocatorConfig) -> int:
    """get_allocation_size: the segment a rounded request gets when nothing cached fits."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return config.large_segment_size_bytes
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


def expandable_size(b: Block) -> int:
    nxt = b.next
    return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)


def allocatable(b: Block | None) -> bool:
    return b is not None and not b.allocated and not b.events and not b.uses


def has_space(b: Block | None, size: int) -> bool:
    total = 0
    while total < size and allocatable(b):
        total += b.size
        b = b.next
    return total >= size
