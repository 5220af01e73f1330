"""Allocator options: `AllocatorConfig` and the parser of `PYTORCH_ALLOC_CONF` strings.

Source of every rule here: c10/core/AllocatorConfig.cpp (torch 2.13; the option names were
checked against the strings in this machine's libc10.so). Defaults are torch's: no
max_split_size (SIZE_MAX), max_non_split_rounding 20 MiB (kLargeBuffer), no roundup divisions,
no garbage collection, expandable segments off, large segments of 20 MiB.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from emulator.units import MiB

# c10/cuda/CUDACachingAllocator.cpp constants.
K_MIN_BLOCK_SIZE = 512  # all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 * MiB  # largest "small" allocation
K_SMALL_BUFFER = 2 * MiB  # small allocations are packed in 2 MiB segments
K_LARGE_BUFFER = 20 * MiB  # 1-10 MiB requests get a 20 MiB segment (default large_segment_size)
K_MIN_LARGE_ALLOC = 10 * MiB  # requests below this (and > 1 MiB) use a large_segment_size segment
K_ROUND_LARGE = 2 * MiB  # larger requests round up to 2 MiB
NO_MAX_SPLIT = (1 << 64) - 1  # std::numeric_limits<size_t>::max()
# AllocatorConfig.cpp: 16 power-of-two intervals from 1 MiB to 64 GiB for roundup_power2_divisions.
_ROUNDUP_INTERVALS = 16
_ROUNDUP_START_LOG2 = 20


@dataclass(frozen=True, kw_only=True)
class AllocatorConfig:
    """The caching-allocator options that change where blocks go (sizes in bytes)."""

    max_split_size_bytes: int = NO_MAX_SPLIT
    max_non_split_rounding_bytes: int = K_LARGE_BUFFER
    roundup_power2_divisions: tuple[int, ...] = field(default=(0,) * _ROUNDUP_INTERVALS)
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    large_segment_size_bytes: int = K_LARGE_BUFFER

    def __post_init__(self) -> None:
        if self.max_split_size_bytes < K_LARGE_BUFFER:
            raise ValueError(
                f"max_split_size_bytes({self.max_split_size_bytes}) must be >= {K_LARGE_BUFFER} "
                "(max_split_size_mb >= 20)"
            )
        if self.max_non_split_rounding_bytes < K_LARGE_BUFFER:
            raise ValueError(
                f"max_non_split_rounding_bytes({self.max_non_split_rounding_bytes}) must be >= "
                f"{K_LARGE_BUFFER} (max_non_split_rounding_mb >= 20)"
            )
        if len(self.roundup_power2_divisions) != _ROUNDUP_INTERVALS:
            raise ValueError(
                f"roundup_power2_divisions has {len(self.roundup_power2_divisions)} entries, "
                f"needs {_ROUNDUP_INTERVALS} (one per power of two from 1 MiB to 32 GiB)"
            )
        for d in self.roundup_power2_divisions:
            if d and d & (d - 1):
                raise ValueError(f"roundup_power2_divisions value {d} is not a power of 2 or 0")
        if not 0.0 <= self.garbage_collection_threshold < 1.0:
            raise ValueError(
                f"garbage_collection_threshold({self.garbage_collection_threshold}) must be in "
                "(0.0, 1.0), or 0 for off"
            )
        if self.large_segment_size_bytes <= K_MIN_LARGE_ALLOC:
            raise ValueError(
                f"large_segment_size_bytes({self.large_segment_size_bytes}) must be > "
                f"{K_MIN_LARGE_ALLOC} (large_segment_size_mb > 10)"
            )

    def divisions_for(self, size: int) -> int:
        """AcceleratorAllocatorConfig::roundup_power2_divisions(size)."""
        index = max(size.bit_length() - 1 - _ROUNDUP_START_LOG2, 0)
        return self.roundup_power2_divisions[min(index, _ROUNDUP_INTERVALS - 1)]


_MODELLED_OPTIONS = {
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "large_segment_size_mb",
    "garbage_collection_threshold",
    "expandable_segments",
    "roundup_power2_divisions",
}
# torch's AllocatorConfig options for pinned host memory: no effect on device memory
_HOST_ONLY_OPTIONS = {
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
}


def parse_alloc_conf(text: str) -> AllocatorConfig:
    """An `AllocatorConfig` from a `PYTORCH_ALLOC_CONF` string, e.g.
    "expandable_segments:True,max_split_size_mb:512,roundup_power2_divisions:[256:1,>:4]".
    Options that only concern host (pinned) memory are accepted and have no effect here; any
    other option the model does not implement (e.g. backend:cudaMallocAsync, a typo) is
    refused rather than silently ignored."""
    kwargs: dict = {}
    for key, value in _items(text):
        if key in _HOST_ONLY_OPTIONS:
            continue
        if key not in _MODELLED_OPTIONS:
            raise ValueError(
                f"allocator option {key!r} is not modelled; known: {sorted(_MODELLED_OPTIONS)}"
            )
        if key == "max_split_size_mb":
            kwargs["max_split_size_bytes"] = _mb(key, value)
        elif key == "max_non_split_rounding_mb":
            kwargs["max_non_split_rounding_bytes"] = _mb(key, value)
        elif key == "large_segment_size_mb":
            kwargs["large_segment_size_bytes"] = _mb(key, value)
        elif key == "garbage_collection_threshold":
            threshold = float(value)
            if not 0.0 < threshold < 1.0:
                raise ValueError(f"garbage_collection_threshold:{value} must be in (0.0, 1.0)")
            kwargs["garbage_collection_threshold"] = threshold
        elif key == "expandable_segments":
            if value not in ("True", "False"):
                raise ValueError(f"expandable_segments:{value} must be True or False")
            kwargs["expandable_segments"] = value == "True"
        elif key == "roundup_power2_divisions":
            kwargs["roundup_power2_divisions"] = _divisions(value)
    return AllocatorConfig(**kwargs)


def _items(text: str) -> list[tuple[str, str]]:
    """Split "a:1,b:[x:1,y:2]" into [("a", "1"), ("b", "[x:1,y:2]")], brackets kept whole."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text + ","):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            part = text[start:i].strip()
            start = i + 1
            if part:
                key, sep, value = part.partition(":")
                if not sep:
                    raise ValueError(f"allocator option {part!r} has no ':value'")
                items.append((key.strip(), value.strip()))
    return items


def _mb(key: str, value: str) -> int:
    if not value.isdigit():
        raise ValueError(f"{key}:{value} must be a whole number of MiB")
    return int(value) * MiB


def _divisions(value: str) -> tuple[int, ...]:
    """AcceleratorAllocatorConfig::parseRoundUpPower2Divisions: one number for all sizes, or
    [MB:div,...,>:div] where each MB boundary (a power of 2) sets its interval, the first one
    also every interval below it, and ">" every interval after the last boundary."""
    table = [0] * _ROUNDUP_INTERVALS
    if not value.startswith("["):
        table = [int(value)] * _ROUNDUP_INTERVALS
        if table[0] & (table[0] - 1) or table[0] == 0:
            raise ValueError(f"roundup_power2_divisions:{value} must be a power of 2")
        return tuple(table)
    first, last_index = True, 0
    for entry in value.strip("[]").split(","):
        boundary, _, div_text = entry.partition(":")
        div = int(div_text)
        if boundary.strip() == ">":
            table[last_index + 1 :] = [div] * (_ROUNDUP_INTERVALS - last_index - 1)
            continue
        mb = int(boundary)
        if mb <= 0 or mb & (mb - 1):
            raise ValueError(f"roundup_power2_divisions boundary {mb} is not a power of 2")
        index = min(mb.bit_length() - 1, _ROUNDUP_INTERVALS - 1)
        if first:
            table[:index] = [div] * index
            first = False
        table[index] = div
        last_index = index
    return tuple(table)
