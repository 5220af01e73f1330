"""Each caching-allocator rule on a hand-written sequence; expected values derived in comments
from c10/cuda/CUDACachingAllocator.cpp (see emulator/memory/allocator.py)."""

import pytest

from emulator.memory import CachingAllocator, allocation_size, parse_alloc_conf, round_size
from emulator.memory.config import AllocatorConfig
from emulator.units import MiB


def make(conf="", **kw):
    return CachingAllocator(parse_alloc_conf(conf), **kw)


def test_sizes_round_up_to_512_bytes():
    a = make()
    b1, b2 = a.malloc(1), a.malloc(513)
    # round_size: < 512 -> 512; else a multiple of 512.
    assert (b1.size, b2.size) == (512, 1024)
    assert (a.allocated, a.requested) == (1536, 514)


def test_small_requests_share_a_2MiB_segment_and_large_ones_do_not():
    a = make()
    a.malloc(1 * MiB)  # <= kSmallSize: small pool, 2 MiB segment, split (1 MiB >= 512 B left)
    assert a.reserved == 2 * MiB
    a.malloc(1 * MiB + 1)  # rounds to 1 MiB + 512 > kSmallSize: large pool, 20 MiB segment
    assert a.reserved == 22 * MiB and a.segments == 2


def test_allocation_size_rule():
    conf = AllocatorConfig()
    # get_allocation_size: <= 1 MiB -> 2 MiB; < 10 MiB -> 20 MiB; else round up to 2 MiB.
    assert allocation_size(4096, conf) == 2 * MiB
    assert allocation_size(5 * MiB, conf) == 20 * MiB
    assert allocation_size(10 * MiB, conf) == 10 * MiB
    assert allocation_size(11 * MiB, conf) == 12 * MiB


def test_1_to_10MiB_requests_are_packed_into_one_20MiB_segment():
    a = make()
    a.malloc(5 * MiB)  # 20 MiB segment; remainder 15 MiB > 1 MiB: split
    a.malloc(5 * MiB)  # fits the 15 MiB remainder
    assert (a.reserved, a.allocated, a.segments) == (20 * MiB, 10 * MiB, 1)


def test_best_fit_picks_the_smallest_block_and_keeps_a_1MiB_remainder_unsplit():
    a = make()
    x, y = a.malloc(14 * MiB), a.malloc(12 * MiB)  # segments of 14 and 12 MiB
    a.free(x)
    a.free(y)
    z = a.malloc(11 * MiB)
    # Best fit: the 12 MiB block. Remainder 1 MiB is not > kSmallSize: no split.
    assert z.size == 12 * MiB and a.allocated == 12 * MiB and a.reserved == 26 * MiB


def test_freed_neighbours_merge_back_into_one_block():
    a = make()
    x, y = a.malloc(5 * MiB), a.malloc(5 * MiB)  # one 20 MiB segment: [x 5][y 5][free 10]
    a.free(x)
    a.free(y)  # y merges with x and with the 10 MiB tail: one free 20 MiB block
    big = a.malloc(18 * MiB)  # needs the merged block; no new segment
    assert big.size == 18 * MiB and a.reserved == 20 * MiB and a.segments == 1


def test_blocks_are_not_merged_while_a_neighbour_is_allocated():
    a = make()
    x, y = a.malloc(5 * MiB), a.malloc(5 * MiB)
    a.free(x)  # [free 5][y 5][free 10]: 5 and 10 are not neighbours
    a.malloc(12 * MiB)  # fits neither: a new 12 MiB segment
    assert a.reserved == 32 * MiB and y.allocated


def test_max_split_size_keeps_oversize_blocks_from_smaller_requests():
    a = make("max_split_size_mb:40")
    a.free(a.malloc(100 * MiB))
    a.malloc(30 * MiB)  # 30 < 40 <= 100: the oversize block is refused; new 30 MiB segment
    assert a.reserved == 130 * MiB


def test_oversize_block_serves_requests_within_max_non_split_rounding():
    a = make("max_split_size_mb:40")
    a.free(a.malloc(100 * MiB))
    reused = a.malloc(90 * MiB)  # 100 < 90 + 20 (kLargeBuffer): reused whole, not split
    assert reused.size == 100 * MiB and a.reserved == 100 * MiB
    a.free(reused)
    a.malloc(70 * MiB)  # 100 >= 70 + 20: refused, new 70 MiB segment
    assert a.reserved == 170 * MiB


def test_release_available_cached_blocks_frees_one_oversize_block_before_retrying():
    a = make("max_split_size_mb:40", capacity_bytes=150 * MiB)
    a.free(a.malloc(100 * MiB))
    # 60 MiB: the cached 100 MiB is refused (100 >= 60 + 20); 100 + 60 > 150 fails; the 100 MiB
    # oversize block is released (release_available_cached_blocks); the second try fits.
    a.malloc(60 * MiB)
    assert a.reserved == 60 * MiB and a.num_alloc_retries == 0 and a.num_ooms == 0


def test_roundup_power2_divisions():
    conf = parse_alloc_conf("roundup_power2_divisions:4")
    # 5 MiB + 1 lies in [4, 8) MiB cut in 4: 4, 5, 6, 7 MiB -> next division 6 MiB.
    assert round_size(5 * MiB + 1, conf) == 6 * MiB
    assert round_size(5 * MiB + 1, AllocatorConfig()) == 5 * MiB + 512
    assert round_size(1200, conf) == 1536  # not above 512 x 4: plain 512 rounding


def test_expandable_segment_grows_by_20MiB_pages_instead_of_new_segments():
    a = make("expandable_segments:True")
    a.malloc(5 * MiB)  # maps one 20 MiB page; splits (>= 512 B left): [5][free 15][unmapped]
    assert (a.reserved, a.allocated) == (20 * MiB, 5 * MiB)
    a.malloc(30 * MiB)  # free 15 + one more mapped page = 35 >= 30: [5][30][free 5][unmapped]
    assert (a.reserved, a.allocated) == (40 * MiB, 35 * MiB)
    b = make()
    b.malloc(5 * MiB)
    b.malloc(30 * MiB)  # without: a 20 MiB and a 30 MiB segment
    assert b.reserved == 50 * MiB


def test_expandable_small_pool_maps_2MiB_pages():
    a = make("expandable_segments:True")
    a.malloc(1000)
    assert a.reserved == 2 * MiB


def test_empty_cache_unmaps_free_pages_of_expandable_segments():
    a = make("expandable_segments:True")
    x = a.malloc(30 * MiB)  # two 20 MiB pages: [x 30][free 10]
    a.malloc(5 * MiB)  # [x 30][5][free 5]
    a.free(x)
    a.empty_cache()  # page 0 (0-20 MiB) is entirely free: unmapped; page 1 holds the 5 MiB block
    assert a.reserved == 20 * MiB


def test_streams_have_separate_pools():
    a = make()
    a.free(a.malloc(MiB, stream=0))
    a.malloc(MiB, stream=1)  # the cached block belongs to stream 0: new segment
    assert a.reserved == 4 * MiB
    a.malloc(MiB, stream=0)
    assert a.reserved == 4 * MiB


def test_record_stream_delays_reuse_until_the_stream_syncs():
    a = make()
    x, _ = a.malloc(MiB), a.malloc(MiB)  # fill one 2 MiB segment
    a.record_stream(x, 1)
    a.free(x)
    assert a.active == 2 * MiB and a.allocated == MiB  # pending free: active, not allocated
    a.malloc(MiB)  # x is not reusable yet: new segment
    assert a.reserved == 4 * MiB
    a.sync(1)
    a.malloc(MiB)  # x is back in the pool
    assert a.reserved == 4 * MiB


def test_garbage_collection_frees_old_blocks_above_the_threshold():
    # allowed 100 MiB, threshold 0.5 -> GC when reserved > 50 MiB before a new segment.
    # get_free_block calls: #1 (40 MiB), #2 (44), #3 (48). Ages at #3: 40 MiB block 3-1 = 2,
    # 44 MiB block 3-2 = 1; average 1.5 -> the 40 MiB block goes (40 >= 84 - 50); then 44 + 48.
    a = make("garbage_collection_threshold:0.5", allowed_bytes=100 * MiB)
    a.free(a.malloc(40 * MiB))
    a.free(a.malloc(44 * MiB))
    a.malloc(48 * MiB)
    assert a.reserved == 92 * MiB and a.num_alloc_retries == 0
    # Without GC: 84 + 48 > 100 fails, release_cached_blocks frees both, the retry fits.
    b = make(allowed_bytes=100 * MiB)
    b.free(b.malloc(40 * MiB))
    b.free(b.malloc(44 * MiB))
    b.malloc(48 * MiB)
    assert b.reserved == 48 * MiB and b.num_alloc_retries == 1


def test_out_of_memory_frees_the_cache_and_retries_before_failing():
    a = make(capacity_bytes=50 * MiB)
    a.free(a.malloc(30 * MiB))
    a.malloc(40 * MiB)  # 30 + 40 > 50: cached 30 MiB segment released, retry fits
    assert (a.reserved, a.num_alloc_retries, a.num_ooms) == (40 * MiB, 1, 0)
    assert a.malloc(30 * MiB) is None  # 40 live + 30 > 50 with nothing cached: OOM, as data
    assert a.num_ooms == 1


def test_expandable_segments_map_pages_up_to_the_capacity_and_no_further():
    a = make("expandable_segments:True", capacity_bytes=60 * MiB)
    a.free(a.malloc(30 * MiB))  # two 20 MiB pages mapped, now one free 40 MiB block
    a.malloc(50 * MiB)  # the free 40 MiB and one more page: 60 MiB mapped, 10 MiB free
    assert (a.reserved, a.num_alloc_retries) == (60 * MiB, 0)
    # 15 MiB: the free 10 MiB plus a page would be 80 MiB mapped; freeing the cache unmaps
    # nothing (no free page is whole) and the retry fails: OOM (_map_block's capacity check)
    assert a.malloc(15 * MiB) is None
    assert (a.reserved, a.num_alloc_retries, a.num_ooms) == (60 * MiB, 1, 1)


@pytest.mark.parametrize("capacity, fits", [(62 * MiB, True), (62 * MiB - 1, False)])
def test_expandable_segments_unmap_free_pages_before_failing(capacity, fits):
    a = make("expandable_segments:True", capacity_bytes=capacity)
    a.free(a.malloc(40 * MiB))  # two large pages mapped, both free
    a.malloc(1000)  # one 2 MiB small page: 42 MiB mapped
    # 45 MiB: the free 40 MiB and one more page would be 62 MiB; at 62 MiB - 1 that fails, the
    # retry unmaps the two free pages (2 MiB left) and maps three for the request: 62 MiB again
    block = a.malloc(45 * MiB)
    assert (block is not None, a.num_alloc_retries) == (fits, 1 if not fits else 0)
    assert a.reserved == (62 * MiB if fits else 2 * MiB)


@pytest.mark.parametrize(
    "conf, message",
    [
        ("max_split_size_mb:10", "max_split_size_mb >= 20"),
        ("garbage_collection_threshold:1.5", "garbage_collection_threshold"),
        ("expandable_segments:yes", "True or False"),
        ("large_segment_size_mb:8", "large_segment_size_mb > 10"),
    ],
)
def test_bad_options_are_refused_with_the_rule(conf, message):
    with pytest.raises(ValueError, match=message):
        parse_alloc_conf(conf)


def test_alloc_conf_parses_every_option():
    conf = parse_alloc_conf(
        "expandable_segments:True,max_split_size_mb:512,garbage_collection_threshold:0.6,"
        "roundup_power2_divisions:[256:1,512:2,>:8],max_non_split_rounding_mb:64,pinned_use_background_threads:True"
    )
    assert conf.expandable_segments and conf.max_split_size_bytes == 512 * MiB
    assert (
        conf.garbage_collection_threshold == 0.6 and conf.max_non_split_rounding_bytes == 64 * MiB
    )
    # [256:1,...]: intervals are log2(MB); 256 MB -> 8 (and below), 512 -> 9, ">" -> 10..15.
    assert conf.roundup_power2_divisions == (1,) * 9 + (2,) + (8,) * 6
    assert conf.divisions_for(300 * MiB) == 1 and conf.divisions_for(600 * MiB) == 2
    assert conf.divisions_for(5 << 30) == 8


def test_an_option_the_model_does_not_implement_is_refused():
    with pytest.raises(ValueError, match="allocator option 'backend' is not modelled"):
        parse_alloc_conf("backend:cudaMallocAsync")
    with pytest.raises(ValueError, match="allocator option 'bogus' is not modelled"):
        parse_alloc_conf("expandable_segments:True,bogus:1")
    assert parse_alloc_conf("pinned_use_cuda_host_register:True") == parse_alloc_conf("")
