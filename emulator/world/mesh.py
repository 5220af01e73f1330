"""The world of a job: ranks <-> mesh coordinates, process groups, classes of ranks.

Mesh shape (dp, pp, cp, tp), row-major, tp fastest (job contract):
global rank = ((dp_i*PP + pp_i)*CP + cp_i)*TP + tp_i. Everything is vectorised numpy:
no function here loops in Python over the ranks of the world.

Slicing. Ranks with the same pp index run the same program: the same layers (the
virtual stages p, p+PP, p+2*PP, ... with vpp > 1), the same tensor shapes, the same
sequence of compute ops and collectives; dp, cp and tp coordinates change only WHICH
ranks sit in each group (group identities), not the sizes or order of anything. So one
class per pp index, represented by its lowest rank. Exceptions a user should know:
- the first stage also runs the embedding, the last the output layer and the loss,
  so classes differ in cost (they are different classes anyway);
- a program that branches on its dp/cp/tp coordinate breaks the claim: e.g. ALiBi
  slopes differ per tp rank (values only, same shapes and cost), data loading or
  logging done by one rank only, uneven sharding when a size does not divide the group
  (FSDP pads, so shapes stay equal; a hand-written uneven split would not);
- ranks that zero-fill where a source rank keeps data (broadcast) hold other values,
  which matters only to value-dependent control flow.
`normalise_trace` rewrites a recorded trace so that two members of a class compare equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

AXES = ("dp", "pp", "cp", "tp")  # mesh order, row-major (the job contract)
PIPELINE_AXIS = "pp"  # classes of ranks are cut along it: one class per index
# The axes a class's member ranks span: a class's lanes are shaped like them, in this order.
LANE_AXES = tuple(a for a in AXES if a != PIPELINE_AXIS)
LANE_POSITIONS = tuple(AXES.index(a) for a in LANE_AXES)  # their positions among AXES


class RankClass(NamedTuple):
    """One equivalence class: its representative (lowest) rank, size, stages held."""

    representative: int
    members: int
    virtual_stages: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class World:
    dp: int
    pp: int
    cp: int
    tp: int
    vpp: int = 1
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        for name in (*AXES, "vpp", "gpus_per_node"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}({value!r}) must be an int >= 1")
        if self.vpp > 1 and self.pp == 1:
            raise ValueError(f"vpp({self.vpp}) > 1 needs pp > 1, got pp({self.pp})")

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.dp, self.pp, self.cp, self.tp)

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.cp * self.tp

    # -- ranks <-> coordinates ---------------------------------------------------------
    def lane_of(self, rank: int) -> tuple[int, ...]:
        """The lane of `rank` within its class: its coordinates along LANE_AXES."""
        return tuple(self.coords(rank)[0][list(LANE_POSITIONS)].tolist())

    def pipeline_index(self, rank: int) -> int:
        return int(self.coords(rank)[0][AXES.index(PIPELINE_AXIS)])

    def coords(self, ranks) -> np.ndarray:
        """Coordinates (dp, pp, cp, tp) of `ranks`: int array [n, 4]."""
        r = self._check_ranks(ranks)
        return np.stack(np.unravel_index(r, self.shape), axis=-1).astype(np.int64)

    def rank_of(self, *, dp=0, pp=0, cp=0, tp=0):
        """Global rank(s) of coordinates; arrays broadcast. Out-of-range raises."""
        coords = np.broadcast_arrays(*(np.asarray(c, dtype=np.int64) for c in (dp, pp, cp, tp)))
        for name, c, n in zip(AXES, coords, self.shape, strict=True):
            if c.size and (c.min() < 0 or c.max() >= n):
                raise ValueError(f"{name} index out of range [0, {n}): {c.min()}..{c.max()}")
        ranks = np.ravel_multi_index(tuple(coords), self.shape)
        return int(ranks) if ranks.ndim == 0 else ranks

    def node_of(self, ranks):
        nodes = self._check_ranks(ranks) // self.gpus_per_node
        return int(nodes[0]) if np.ndim(ranks) == 0 else nodes

    # -- process groups -----------------------------------------------------------------
    def groups(self, axis) -> np.ndarray:
        """All groups over `axis` ("tp" or e.g. ("dp", "cp")): [n_groups, group_size].

        A combined axis orders its members row-major over the named axes (in mesh order),
        as DeviceMesh flattening does; groups are ordered by their lowest rank."""
        dims = self._axis_dims(axis)
        others = [d for d in range(4) if d not in dims]
        grid = np.arange(self.world_size, dtype=np.int64).reshape(self.shape)
        moved = np.transpose(grid, others + dims)
        size = int(np.prod([self.shape[d] for d in dims]))
        return moved.reshape(-1, size)

    def group_of(self, rank: int, axis) -> np.ndarray:
        """The global ranks of `rank`'s group over `axis`, in group-rank order."""
        dims = self._axis_dims(axis)
        c = self.coords(rank)[0]
        index = [slice(None) if d in dims else int(c[d]) for d in range(4)]
        grid = np.arange(self.world_size, dtype=np.int64).reshape(self.shape)
        return grid[tuple(index)].reshape(-1)

    # -- classes of ranks ---------------------------------------------------------------
    def class_of(self, ranks):
        """Class id of `ranks`: their pp index (see module docstring)."""
        classes = self.coords(ranks)[:, 1]
        return int(classes[0]) if np.ndim(ranks) == 0 else classes

    def virtual_stages(self, class_id: int) -> tuple[int, ...]:
        """Stages held by pp rank `class_id`: p, p+PP, ... (torch's interleaved order)."""
        return tuple(class_id + v * self.pp for v in range(self.vpp))

    def representative(self, class_id: int) -> int:
        if not 0 <= class_id < self.pp:
            raise ValueError(f"class_id({class_id}) must be in [0, pp({self.pp}))")
        return self.rank_of(pp=class_id)

    def classes(self) -> dict[int, RankClass]:
        members = self.world_size // self.pp
        return {
            p: RankClass(self.representative(p), members, self.virtual_stages(p))
            for p in range(self.pp)
        }

    # -- helpers ---------------------------------------------------------------------------
    def _check_ranks(self, ranks) -> np.ndarray:
        r = np.atleast_1d(np.asarray(ranks, dtype=np.int64))
        if r.size and (r.min() < 0 or r.max() >= self.world_size):
            raise ValueError(
                f"ranks must be in [0, world_size({self.world_size})): got {r.min()}..{r.max()}"
            )
        return r

    def _axis_dims(self, axis) -> list[int]:
        names = (axis,) if isinstance(axis, str) else tuple(axis)
        unknown = [n for n in names if n not in AXES]
        if unknown or not names or len(set(names)) != len(names):
            raise ValueError(f"axis({axis!r}) must be distinct names from {AXES}")
        return sorted(AXES.index(n) for n in names)


def group_axes(world: World, rank: int, ranks: np.ndarray) -> tuple[str, ...] | None:
    """The mesh axes a group spans, seen from member `rank`; None if it is no mesh group."""
    c = world.coords(ranks)
    axes = tuple(a for a, varies in zip(AXES, (c != c[0]).any(axis=0), strict=True) if varies)
    expected = world.group_of(rank, axes) if axes else np.array([rank])
    return axes if np.array_equal(np.sort(ranks), np.sort(expected)) else None


def normalise_trace(events, groups: dict, world: World, rank: int) -> list[tuple]:
    """Events as tuples with every rank identity replaced by a position-free one.

    group_id -> the axes the group spans (("tp",), ("dp", "cp"), () for a one-rank group);
    peer -> its mesh offset from `rank` (e.g. (0, 1, 0, 0): next pipeline stage);
    root -> its index in the group; a wait's comm_seq -> distance back to its collective.
    Any other event type (compute ops) passes through as its field tuple minus `seq`."""
    me = world.coords(rank)[0]
    axes_of: dict = {}
    out = []
    for e in events:
        fields = (
            dict(vars(e)) if hasattr(e, "__dict__") else {k: getattr(e, k) for k in e.__slots__}
        )
        seq = fields.pop("seq")
        if "group_id" in fields:
            gid = fields.pop("group_id")
            if gid not in axes_of:
                axes_of[gid] = group_axes(world, rank, groups[gid])
            fields["axes"] = axes_of[gid]
            if fields.get("peer") is not None:
                fields["peer"] = tuple((world.coords(fields["peer"])[0] - me).tolist())
            if fields.get("root") is not None:
                fields["root"] = int(np.flatnonzero(groups[gid] == fields["root"])[0])
        if "comm_seq" in fields:
            fields["comm_seq"] = seq - fields["comm_seq"]
        out.append((type(e).__name__, tuple(sorted(fields.items()))))
    return out
