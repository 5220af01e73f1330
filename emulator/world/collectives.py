"""The collective table: every kind of communication the virtual world records, in one place.

A row says what a recorded kind is to each stage: the kind a `CommEvent` carries
(`world.comm_events`), the kind the cost model prices it as (`costs.collectives`), for the
priced kinds nccl-tests' bus-bandwidth factor and how NCCL runs it (its tuner chooses ring /
tree / NVLS and a protocol; or point-to-point transfers, outside the tuner), and how the
execution graph joins it across ranks (`graph.build`: every rank of the group, or the k-th
send with the k-th recv of a peer). Adding a collective is adding a row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

NCCL_MODES = ("tuned", "point_to_point", "barrier", "priced_as_other")
# a recorded call's dtype where it moves no tensor (a barrier)
NO_TENSOR_DTYPE = "none"
JOINS = ("group", "peer")


@dataclass(frozen=True, kw_only=True)
class Collective:
    kind: str
    priced_as: str = ""  # "" : its own cost kind
    bus_factor: Callable[[int], float] | None = None  # nccl-tests PERFORMANCE.md: busbw/algbw
    nccl: str = "priced_as_other"
    joins: str = "group"
    recorded: bool = True  # False: a cost kind only (send_recv prices a send or a recv)

    def __post_init__(self) -> None:
        if self.nccl not in NCCL_MODES:
            raise ValueError(f"collective {self.kind}: nccl={self.nccl!r} not in {NCCL_MODES}")
        if self.joins not in JOINS:
            raise ValueError(f"collective {self.kind}: joins={self.joins!r} not in {JOINS}")
        if (self.nccl == "priced_as_other") != bool(self.priced_as):
            raise ValueError(f"collective {self.kind}: priced_as names another kind iff nccl is")

    @property
    def cost_kind(self) -> str:
        return self.priced_as or self.kind


def _ring(n: int) -> float:
    return (n - 1) / n


def _twice_ring(n: int) -> float:
    return 2 * (n - 1) / n


def _one(n: int) -> float:
    return 1.0


ROWS = (
    Collective(kind="all_reduce", bus_factor=_twice_ring, nccl="tuned"),
    Collective(kind="all_gather", bus_factor=_ring, nccl="tuned"),
    Collective(kind="reduce_scatter", bus_factor=_ring, nccl="tuned"),
    Collective(kind="broadcast", bus_factor=_one, nccl="tuned"),
    Collective(kind="reduce", bus_factor=_one, nccl="tuned"),
    Collective(kind="all_to_all", bus_factor=_ring, nccl="point_to_point"),
    # an all_to_all in which every rank sends its whole buffer to one other rank (torch's
    # `permute_tensor`: the ring attention's rotation): one transfer a rank, as a send/recv
    Collective(kind="permute", priced_as="send_recv"),
    Collective(kind="send_recv", bus_factor=_one, nccl="point_to_point", recorded=False),
    Collective(kind="barrier", nccl="barrier"),  # torch all-reduces one small tensor
    Collective(kind="send", priced_as="send_recv", joins="peer"),
    Collective(kind="recv", priced_as="send_recv", joins="peer"),
    # scatter/gather move all_gather's bytes (each rank's S/N shard crosses the group once);
    # an approximation: NCCL has no kernel of their own.
    Collective(kind="scatter", priced_as="all_gather"),
    Collective(kind="gather", priced_as="all_gather"),
    Collective(kind="all_reduce_coalesced", priced_as="all_reduce"),
    Collective(kind="all_gather_coalesced", priced_as="all_gather"),
    Collective(kind="reduce_scatter_coalesced", priced_as="reduce_scatter"),
)


def _index(rows: tuple[Collective, ...]) -> dict[str, Collective]:
    table: dict[str, Collective] = {}
    for row in rows:
        if row.kind in table:
            raise ValueError(f"collective kind {row.kind!r} has two rows")
        table[row.kind] = row
    for row in rows:
        if row.priced_as and table.get(row.priced_as, row).nccl == "priced_as_other":
            raise ValueError(
                f"collective {row.kind}: priced_as={row.priced_as!r} is not a cost kind"
            )
    return table


TABLE = _index(ROWS)
RECORDED_KINDS = frozenset(k for k, row in TABLE.items() if row.recorded)
COST_KINDS = tuple(k for k, row in TABLE.items() if row.nccl != "priced_as_other")
TUNED_KINDS = tuple(k for k, row in TABLE.items() if row.nccl == "tuned")


def all_to_all_kind(input_split_sizes, rank: int) -> str:
    """"permute" where an all_to_all's send splits put everything on one other rank (group rank
    `rank` sends to one peer: torch's `permute_tensor`), else "all_to_all"."""
    sizes = list(input_split_sizes or ())
    to = [peer for peer, size in enumerate(sizes) if size]
    return "permute" if len(to) == 1 and to[0] != rank else "all_to_all"


def collective(kind: str) -> Collective:
    """The row of `kind`; a clear error for a kind the table does not have."""
    if kind not in TABLE:
        raise ValueError(f"collective kind={kind!r} is not known; known: {sorted(TABLE)}")
    return TABLE[kind]
