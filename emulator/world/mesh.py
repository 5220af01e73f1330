"""The world of a job: ranks <-> mesh coordinates, process groups, classes of ranks.

A world is a row-major grid of named axes, the last fastest. The job contract's mesh is
(dp, pp, cp, tp) (`World.grid`, JOB_AXES): global rank = ((dp_i*PP + pp_i)*CP + cp_i)*TP + tp_i.
A mesh we do not choose is the same data with other names and order, e.g. torchtitan's
(pp, dp_replicate, dp_shard, cp, tp): `World(axes=(("pp", 2), ("dp_replicate", 2), ...))`.
Flattened dimensions (torchtitan's dp_shard_cp) are groups over several axes
(`groups(("dp_shard", "cp"))`). A group carved out of a flattened dimension that is not a
full sub-grid of the named axes (an expert-parallel group of 4 out of dp x cp = 4 x 2) is
expressed by factoring an axis (`factor("dp", (("dp_mod_ep", 2), ("dp_in_ep", 2)))`, the way
torchtitan builds its EP mesh): rank numbering is unchanged, and the EP group is then the
sub-grid ("dp_in_ep", "cp"). Everything is vectorised numpy: no function here loops in
Python over the ranks of the world.

Slicing. Ranks with the same pipeline index run the same program: the same layers (the
virtual stages p, p+PP, p+2*PP, ... with vpp > 1), the same tensor shapes, the same
sequence of compute ops and collectives; the other coordinates (the lane axes) change only
WHICH ranks sit in each group (group identities), not the sizes or order of anything. So
one class per pipeline index, represented by its lowest rank. Exceptions a user should know:
- the first stage also runs the embedding, the last the output layer and the loss,
  so classes differ in cost (they are different classes anyway);
- a program that branches on a lane coordinate breaks the claim: e.g. ALiBi
  slopes differ per tp rank (values only, same shapes and cost), data loading or
  logging done by one rank only, uneven sharding when a size does not divide the group
  (FSDP pads, so shapes stay equal; a hand-written uneven split would not), experts
  routed unevenly (same shapes only with a fixed capacity per expert);
- ranks that zero-fill where a source rank keeps data (broadcast) hold other values,
  which matters only to value-dependent control flow.
`normalise_trace` rewrites a recorded trace so that two members of a class compare equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

JOB_AXES = ("dp", "pp", "cp", "tp")  # the job contract's mesh, in rank order
PIPELINE_AXIS = "pp"  # classes are cut along the axis of this name, when the world has one


class RankClass(NamedTuple):
    """One equivalence class: its representative (lowest) rank, size, stages held."""

    representative: int
    members: int
    virtual_stages: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class World:
    """A mesh of named axes, ((name, size), ...) in rank order, the last fastest."""

    axes: tuple[tuple[str, int], ...]
    vpp: int = 1
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        object.__setattr__(self, "axes", tuple((str(n), s) for n, s in self.axes))
        names = self.names
        if not names or len(set(names)) != len(names) or not all(n.isidentifier() for n in names):
            raise ValueError(f"axes({names!r}) must be distinct identifiers, at least one")
        for name, value in (*self.axes, ("vpp", self.vpp), ("gpus_per_node", self.gpus_per_node)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}({value!r}) must be an int >= 1")
        if self.vpp > 1 and self.pp == 1:
            raise ValueError(f"vpp({self.vpp}) > 1 needs pp > 1, got pp({self.pp})")

    @classmethod
    def grid(cls, *, dp: int, pp: int, cp: int, tp: int, vpp: int = 1, gpus_per_node: int = 8):
        """The job contract's world: axes JOB_AXES."""
        sizes = dict(dp=dp, pp=pp, cp=cp, tp=tp)
        return cls(
            axes=tuple((a, sizes[a]) for a in JOB_AXES), vpp=vpp, gpus_per_node=gpus_per_node
        )

    def factor(self, axis: str, into: tuple[tuple[str, int], ...]) -> World:
        """The same world with `axis` split into `into` (outer first): ranks keep their
        numbers, and groups over part of `axis` become sub-grids (see module docstring)."""
        size = self.size(axis)
        if int(np.prod([s for _, s in into])) != size:
            raise ValueError(f"factor({axis!r}): sizes of {into!r} must multiply to {size}")
        i = self.names.index(axis)
        return World(
            axes=(*self.axes[:i], *into, *self.axes[i + 1 :]),
            vpp=self.vpp,
            gpus_per_node=self.gpus_per_node,
        )

    # -- axes -------------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.axes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s for _, s in self.axes)

    @property
    def world_size(self) -> int:
        return int(np.prod(self.shape))

    def size(self, axis: str) -> int:
        return self.shape[self.axis_index(axis)]

    def axis_index(self, axis: str) -> int:
        if axis not in self.names:
            raise ValueError(f"axis({axis!r}) must be one of the world's axes {self.names}")
        return self.names.index(axis)

    @property
    def pipeline_position(self) -> int | None:
        """Position of the pipeline axis among the axes; None for a world without one."""
        return self.names.index(PIPELINE_AXIS) if PIPELINE_AXIS in self.names else None

    @property
    def pp(self) -> int:
        """Pipeline stages (physical): the size of the pipeline axis, 1 without one."""
        return 1 if self.pipeline_position is None else self.shape[self.pipeline_position]

    @property
    def lane_axes(self) -> tuple[str, ...]:
        """The axes a class's member ranks span: a class's lanes are shaped like them."""
        return tuple(n for n in self.names if n != PIPELINE_AXIS)

    @property
    def lane_shape(self) -> tuple[int, ...]:
        return tuple(s for n, s in self.axes if n != PIPELINE_AXIS)

    # -- ranks <-> coordinates ---------------------------------------------------------
    def lane_of(self, rank: int) -> tuple[int, ...]:
        """The lane of `rank` within its class: its coordinates along the lane axes."""
        keep = [i for i, n in enumerate(self.names) if n != PIPELINE_AXIS]
        return tuple(self.coords(rank)[0][keep].tolist())

    def pipeline_index(self, rank: int) -> int:
        return int(self.class_of(rank))

    def coords(self, ranks) -> np.ndarray:
        """Coordinates of `ranks` along the axes, in order: int array [n, len(axes)]."""
        r = self._check_ranks(ranks)
        return np.stack(np.unravel_index(r, self.shape), axis=-1).astype(np.int64)

    def rank_of(self, **coords):
        """Global rank(s) of coordinates (by axis name; absent ones 0); arrays broadcast."""
        unknown = sorted(set(coords) - set(self.names))
        if unknown:
            raise ValueError(f"rank_of: {unknown} not among the world's axes {self.names}")
        arrays = np.broadcast_arrays(
            *(np.asarray(coords.get(n, 0), dtype=np.int64) for n in self.names)
        )
        for name, c, n in zip(self.names, arrays, self.shape, strict=True):
            if c.size and (c.min() < 0 or c.max() >= n):
                raise ValueError(f"{name} index out of range [0, {n}): {c.min()}..{c.max()}")
        ranks = np.ravel_multi_index(tuple(arrays), self.shape)
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
        others = [d for d in range(len(self.axes)) if d not in dims]
        grid = np.arange(self.world_size, dtype=np.int64).reshape(self.shape)
        moved = np.transpose(grid, others + dims)
        size = int(np.prod([self.shape[d] for d in dims]))
        return moved.reshape(-1, size)

    def group_of(self, rank: int, axis) -> np.ndarray:
        """The global ranks of `rank`'s group over `axis`, in group-rank order."""
        dims = self._axis_dims(axis)
        c = self.coords(rank)[0]
        index = [slice(None) if d in dims else int(c[d]) for d in range(len(self.axes))]
        grid = np.arange(self.world_size, dtype=np.int64).reshape(self.shape)
        return grid[tuple(index)].reshape(-1)

    def lane_groups(self, ranks, axes) -> np.ndarray:
        """The group `ranks` (a group of the class's representative, spanning the lane axes
        `axes`) as every lane of the class holds it: [n_lanes, len(ranks)], `ranks` first.
        The members of a class run the same collective, each in its own group, shifted along
        the lane axes the group does not span."""
        ranks = self._check_ranks(ranks)
        others = [a for a in self.lane_axes if a not in axes]
        coords = np.meshgrid(*(np.arange(self.size(a)) for a in others), indexing="ij")
        offsets = np.asarray(self.rank_of(**dict(zip(others, coords, strict=True)))).reshape(-1)
        return ranks[None, :] + offsets[:, None]

    def placements(self, groups: np.ndarray) -> np.ndarray:
        """One group of each placement among `groups` ([n, size] global ranks), the first row
        first: which nodes, relative to the group's lowest, its members sit on. Groups placed
        alike cost the same; a layout whose groups do not tile the nodes (tp 3 on 8-GPU
        nodes) places some across two."""
        groups = np.asarray(groups)
        nodes = np.sort(self.node_of(groups), axis=1)
        _, first = np.unique(nodes - nodes[:, :1], axis=0, return_index=True)
        return groups[np.sort(first)]

    # -- classes of ranks ---------------------------------------------------------------
    def class_of(self, ranks):
        """Class id of `ranks`: their pipeline index (see module docstring)."""
        p = self.pipeline_position
        classes = (
            np.zeros(len(self._check_ranks(ranks)), np.int64)
            if p is None
            else self.coords(ranks)[:, p]
        )
        return int(classes[0]) if np.ndim(ranks) == 0 else classes

    def virtual_stages(self, class_id: int) -> tuple[int, ...]:
        """Stages held by pp rank `class_id`: p, p+PP, ... (torch's interleaved order)."""
        return tuple(class_id + v * self.pp for v in range(self.vpp))

    def representative(self, class_id: int) -> int:
        if not 0 <= class_id < self.pp:
            raise ValueError(f"class_id({class_id}) must be in [0, pp({self.pp}))")
        return self.rank_of() if self.pipeline_position is None else self.rank_of(pp=class_id)

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
        unknown = [n for n in names if n not in self.names]
        if unknown or not names or len(set(names)) != len(names):
            raise ValueError(f"axis({axis!r}) must be distinct names from {self.names}")
        return sorted(self.names.index(n) for n in names)


def group_axes(world: World, rank: int, ranks: np.ndarray) -> tuple[str, ...] | None:
    """The mesh axes a group spans, seen from member `rank`; None if it is no mesh group
    (not a full sub-grid of the world's axes: factor an axis to make it one)."""
    c = world.coords(ranks)
    varies = (c != c[0]).any(axis=0)
    axes = tuple(a for a, v in zip(world.names, varies, strict=True) if v)
    expected = world.group_of(rank, axes) if axes else np.array([rank])
    return axes if np.array_equal(np.sort(ranks), np.sort(expected)) else None


def normalise_trace(events, groups: dict, world: World, rank: int) -> list[tuple]:
    """Events as tuples with every rank identity replaced by a position-free one.

    group_id -> the axes the group spans (("tp",), ("dp", "cp"), () for a one-rank group);
    peer -> its mesh offset from `rank` (e.g. (0, 1, 0, 0) in the job mesh: next stage);
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
