"""CachingAllocator: a model of torch 2.x's CUDA caching allocator (one device).

Each rule follows c10/cuda/CUDACachingAllocator.cpp and its generic twin
c10/core/CachingDeviceAllocator.h (torch 2.13); the function names in comments are theirs.
- malloc: round_size (512 B, or a power-of-2 division), pool by size (<= 1 MiB small),
  get_free_block (best fit in the same stream: BlockComparatorSize orders stream, size,
  address), else alloc_block (new segment: get_allocation_size) -> release_available_cached_blocks
  -> release_cached_blocks -> alloc_block again, else OOM (returned as None, never raised).
- should_split: small pool or expandable segments split when >= 512 B remain; large pool when
  the request is < max_split_size and more than 1 MiB (kSmallSize) would remain.
- free: a block used on other streams (record_stream) waits for those streams' events
  (`sync`); else free_block merges it with free neighbours (try_merge_blocks).
- expandable_segments: one virtual segment per (pool, stream) that maps 2 MiB (small) /
  20 MiB (large) pages at its lowest free address; reserved = mapped pages.
- garbage_collection_threshold acts only under a memory fraction (`allowed_bytes`), as in torch.

Addresses are virtual: segments are handed out by a bump pointer, so best-fit ties between
equal sizes break by segment age (cudaMalloc's real addresses are not modelled).

One class over 400 lines on purpose: it mirrors DeviceCachingAllocator method for method, so
that a torch upgrade can be checked against the C++ side by side.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from emulator.memory.blocks import (
    Block,
    ExpandableSegment,
    allocatable,
    allocation_size,
    expandable_size,
    has_space,
    round_size,
)
from emulator.memory.config import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    NO_MAX_SPLIT,
    AllocatorConfig,
)

_SEGMENT_ALIGN = K_SMALL_BUFFER  # bump-pointer alignment of new segments (virtual addresses)


class CachingAllocator:
    """The allocator state; sizes in bytes. `capacity_bytes`: what cudaMalloc / cuMemCreate can
    hand out in all (GPU memory minus what lives outside the allocator), None = unlimited.
    `allowed_bytes`: torch.cuda.set_per_process_memory_fraction(f) * device total, or None."""

    def __init__(
        self,
        config: AllocatorConfig | None = None,
        *,
        capacity_bytes: int | None = None,
        allowed_bytes: int | None = None,
        device_total_bytes: int = 1 << 40,
        record_history: bool = False,
    ):
        self.config = config or AllocatorConfig()
        self.capacity_bytes, self.allowed_bytes = capacity_bytes, allowed_bytes
        self._device_total = device_total_bytes
        self.allocated = self.reserved = self.requested = self.active = 0
        self.peak_allocated = self.peak_reserved = self.peak_requested = 0
        self.segments = self.num_alloc_retries = self.num_ooms = 0
        self.history: list[dict] | None = [] if record_history else None
        self._free: dict[tuple[bool, int], list[tuple[int, int]]] = {}
        self._free_blocks: dict[int, Block] = {}
        self._unmapped: dict[tuple[bool, int], list[int]] = {}
        self._unmapped_blocks: dict[int, Block] = {}
        self._active: set[Block] = set()
        self._pending: list[Block] = []
        self._gc_calls = {True: 0, False: 0}
        self._next_addr = _SEGMENT_ALIGN
        self._gc_on = allowed_bytes is not None and self.config.garbage_collection_threshold > 0

    # ---- public API ------------------------------------------------------------------------

    def malloc(self, size: int, stream: int = 0) -> Block | None:
        """DeviceCachingAllocator::malloc; None on OOM (after the cache-release retries)."""
        orig, size = size, round_size(size, self.config)
        small = size <= K_SMALL_SIZE
        block = self._get_free_block(size, small, stream)
        if block is None:
            if self._gc_on:
                self._garbage_collect()
            alloc = allocation_size(size, self.config)
            block = self._alloc_block(size, alloc, small, stream)
            if block is None and self._release_available_cached_blocks(size, small, stream):
                block = self._alloc_block(size, alloc, small, stream)
            if block is None:
                self._release_cached_blocks()
                self.num_alloc_retries += 1
                block = self._alloc_block(size, alloc, small, stream)
            if block is None:
                self.num_ooms += 1
                self._record("oom", 0, alloc, stream)
                return None
        return self._alloc_found_block(block, size, orig, self._should_split(block, size))

    def free(self, block: Block) -> None:
        """DeviceCachingAllocator::free: deferred while streams recorded on it have not synced."""
        block.allocated = False
        self.allocated -= block.size
        self._record("free_requested", block.addr, block.requested, block.stream)
        if block.uses:
            block.events, block.uses = len(block.uses), block.uses
            self._pending.append(block)
        else:
            self._free_block(block)

    def record_stream(self, block: Block, stream: int) -> None:
        """Block::recordStream: a use on another stream delays the block's reuse."""
        if stream != block.stream:
            block.uses.add(stream)

    def sync(self, stream: int) -> None:
        """`stream` reached a sync point: its end-of-use events complete (process_events)."""
        still = []
        for block in self._pending:
            if stream in block.uses:
                block.uses.discard(stream)
                block.events -= 1
            if block.events == 0:
                self._free_block(block)
            else:
                still.append(block)
        self._pending = still

    def reset_peak_stats(self) -> None:
        """torch.cuda.reset_peak_memory_stats (resetPeakStats): peaks restart from now."""
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved
        self.peak_requested = self.requested

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache (emptyCache -> release_cached_blocks)."""
        self._release_cached_blocks()

    def blocks(self) -> list[Block]:
        """Every block the allocator knows (allocated, pending, free, unmapped)."""
        return [*self._active, *self._free_blocks.values(), *self._unmapped_blocks.values()]

    # ---- free lists ------------------------------------------------------------------------

    def _insert_free(self, b: Block) -> None:
        insort(self._free.setdefault((b.small, b.stream), []), (b.size, b.addr))
        self._free_blocks[b.addr] = b
        b.gc_base = self._gc_calls[b.small]

    def _remove_free(self, b: Block) -> None:
        entries = self._free[(b.small, b.stream)]
        del entries[bisect_left(entries, (b.size, b.addr))]
        del self._free_blocks[b.addr]

    def _insert_unmapped(self, b: Block) -> None:
        insort(self._unmapped.setdefault((b.small, b.stream), []), b.addr)
        self._unmapped_blocks[b.addr] = b

    def _remove_unmapped(self, b: Block) -> None:
        addrs = self._unmapped[(b.small, b.stream)]
        del addrs[bisect_left(addrs, b.addr)]
        del self._unmapped_blocks[b.addr]

    # ---- allocation ------------------------------------------------------------------------

    def _get_free_block(self, size: int, small: bool, stream: int) -> Block | None:
        if self._gc_on:
            self._gc_calls[small] += 1
        entries = self._free.get((small, stream))
        if not entries:
            return None
        i = bisect_left(entries, (size, -1))
        if i == len(entries):
            return None
        block = self._free_blocks[entries[i][1]]
        if block.segment is not None:
            # Best fit counts the unmapped space right after a block as part of it.
            while i + 1 < len(entries):
                nxt = self._free_blocks[entries[i + 1][1]]
                if expandable_size(nxt) >= expandable_size(block):
                    break
                i, block = i + 1, nxt
        max_split = self.config.max_split_size_bytes
        if size < max_split <= block.size:
            return None  # do not hand an oversize block to a smaller request
        if size >= max_split and block.size >= size + self.config.max_non_split_rounding_bytes:
            return None
        self._remove_free(block)
        return block

    def _should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.small or self.config.expandable_segments:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self.config.max_split_size_bytes and remaining > K_SMALL_SIZE

    def _alloc_block(self, size: int, alloc: int, small: bool, stream: int) -> Block | None:
        if self.allowed_bytes is not None and self.reserved + alloc > self.allowed_bytes:
            return None
        if self.config.expandable_segments:
            return self._try_allocate_expandable_block(size, small, stream)
        if self.capacity_bytes is not None and self.reserved + alloc > self.capacity_bytes:
            return None  # cudaMalloc fails
        block = Block(self._bump(alloc), alloc, stream, small)
        self.reserved += alloc
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.segments += 1
        self._record("segment_alloc", block.addr, alloc, stream)
        return block

    def _alloc_found_block(self, block: Block, size: int, orig: int, split: bool) -> Block:
        if split:
            remaining = block
            block = Block(
                remaining.addr, size, remaining.stream, remaining.small, remaining.segment
            )
            block.splice(remaining.prev, remaining)
            remaining.addr += size
            remaining.size -= size
            self._insert_free(remaining)
        block.allocated, block.requested = True, orig
        self._active.add(block)
        self.allocated += block.size
        self.active += block.size
        self.requested += orig
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_requested = max(self.peak_requested, self.requested)
        self._record("alloc", block.addr, orig, block.stream)
        return block

    def _free_block(self, block: Block) -> None:
        self._record("free_completed", block.addr, block.requested, block.stream)
        self.active -= block.size
        self.requested -= block.requested
        self._active.discard(block)
        self._try_merge(block, block.prev)
        self._try_merge(block, block.next)
        self._insert_free(block)

    def _try_merge(self, dst: Block, src: Block | None) -> int:
        """try_merge_blocks: absorb a free neighbour of the same mapping state."""
        if src is None or src.allocated or src.events or src.uses or src.mapped != dst.mapped:
            return 0
        if src.mapped:
            self._remove_free(src)
        else:
            self._remove_unmapped(src)
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    # ---- giving memory back ----------------------------------------------------------------

    def _release_block(self, block: Block) -> None:
        self._remove_free(block)
        self.reserved -= block.size
        self.segments -= 1
        self._record("segment_free", block.addr, block.size, block.stream)

    def _release_available_cached_blocks(self, size: int, small: bool, stream: int) -> bool:
        """Free oversize (>= max_split_size) cached blocks, only as many as the request needs."""
        max_split = self.config.max_split_size_bytes
        if max_split == NO_MAX_SPLIT:
            return False
        key = max(size, max_split)
        entries = self._free.get((small, stream), [])
        i = bisect_left(entries, (key, -1))
        if i < len(entries) and self._free_blocks[entries[i][1]].segment is None:
            self._release_block(self._free_blocks[entries[i][1]])
            return True
        released, j = 0, i - 1
        while released < key and j >= 0 and entries[j][0] >= max_split:
            block = self._free_blocks[entries[j][1]]
            if block.segment is None and not block.is_split:
                released += block.size
                self._release_block(block)
            j -= 1
        return released >= key

    def _release_cached_blocks(self) -> None:
        """Sync all streams' pending frees, then free every unsplit cached block and unmap the
        free pages of expandable segments."""
        for block in self._pending:
            block.events, block.uses = 0, set()
            self._free_block(block)
        self._pending = []
        to_unmap = []
        for block in list(self._free_blocks.values()):
            if block.segment is not None:
                to_unmap.append(block)
            elif not block.is_split:
                self._release_block(block)
        for block in to_unmap:
            self._unmap_block(block)
            if not block.mapped and not block.is_split:
                self._remove_unmapped(block)  # release_expandable_segment

    def _garbage_collect(self) -> None:
        """garbage_collect_cached_blocks: free unsplit large blocks older than the average age
        (in get_free_block calls) until reserved is back under threshold * allowed."""
        threshold = int(self.config.garbage_collection_threshold * self.allowed_bytes)
        if self.reserved <= threshold:
            return
        target, reclaimed = self.reserved - threshold, 0
        calls = self._gc_calls[False]
        candidates = sorted(
            (
                b
                for b in self._free_blocks.values()
                if not b.small and not b.is_split and b.segment is None
            ),
            key=lambda b: (b.stream, b.size, b.addr),
        )
        total_age = sum(calls - b.gc_base for b in candidates)
        count, freed = len(candidates), True
        while reclaimed < target and freed and count > 0:
            age_threshold, freed = total_age / count, False
            for block in list(candidates):
                age = calls - block.gc_base
                if age >= age_threshold:
                    freed = True
                    reclaimed += block.size
                    total_age -= age
                    count -= 1
                    candidates.remove(block)
                    self._release_block(block)

    # ---- expandable segments ---------------------------------------------------------------

    def _try_allocate_expandable_block(self, size: int, small: bool, stream: int) -> Block | None:
        candidate = self._find_expandable_block(size, small, stream)
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            nxt = candidate.next
            if not self._map_block(nxt, min(size - candidate.size, nxt.size)):
                return None
            candidate = nxt
        self._remove_free(candidate)
        return candidate

    def _find_expandable_block(self, size: int, small: bool, stream: int) -> Block:
        for addr in self._unmapped.get((small, stream), []):
            c = self._unmapped_blocks[addr]
            if allocatable(c.prev):
                c = c.prev
            if has_space(c, size):
                return c
        page = K_SMALL_BUFFER if small else K_LARGE_BUFFER
        # Virtual space for 1 1/8 of the device memory (ExpandableSegment's address reservation).
        pages = -(-(self._device_total + self._device_total // 8) // page)
        segment = ExpandableSegment(self._bump(pages * page), page, pages * page)
        block = Block(segment.base, segment.size, stream, small, segment, mapped=False)
        self._insert_unmapped(block)
        return block

    def _map_block(self, block: Block, size: int) -> bool:
        page = block.segment.page
        mapped = -(-size // page) * page
        if self.capacity_bytes is not None and self.reserved + mapped > self.capacity_bytes:
            return False  # cuMemCreate out of memory
        self._remove_unmapped(block)
        block.mapped = True
        if mapped < block.size:
            rest = Block(
                block.addr + mapped,
                block.size - mapped,
                block.stream,
                block.small,
                block.segment,
                False,
            )
            rest.splice(block, block.next)
            self._insert_unmapped(rest)
            block.size = mapped
        self._try_merge(block, block.prev)
        self._try_merge(block, block.next)
        self._insert_free(block)
        self.reserved += mapped
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self._record("segment_map", block.addr, mapped, block.stream)
        return True

    def _unmap_block(self, block: Block) -> None:
        seg = block.segment
        begin = -(-(block.addr - seg.base) // seg.page)
        end = (block.addr + block.size - seg.base) // seg.page
        if begin >= end:
            return
        self._remove_free(block)
        start, size = seg.base + begin * seg.page, (end - begin) * seg.page
        if start > block.addr:
            before = Block(block.addr, start - block.addr, block.stream, block.small, seg)
            before.splice(block.prev, block)
            self._insert_free(before)
        after_size = block.addr + block.size - (start + size)
        if after_size > 0:
            after = Block(start + size, after_size, block.stream, block.small, seg)
            after.splice(block, block.next)
            self._insert_free(after)
        block.addr, block.size, block.mapped = start, size, False
        self._try_merge(block, block.prev)
        self._try_merge(block, block.next)
        self._insert_unmapped(block)
        self.reserved -= size
        self._record("segment_unmap", start, size, block.stream)

    # ---- helpers ---------------------------------------------------------------------------

    def _bump(self, size: int) -> int:
        addr = self._next_addr
        self._next_addr += -(-size // _SEGMENT_ALIGN) * _SEGMENT_ALIGN
        return addr

    def _record(self, action: str, addr: int, size: int, stream: int) -> None:
        if self.history is not None:
            self.history.append({"action": action, "addr": addr, "size": size, "stream": stream})
