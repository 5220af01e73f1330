"""The noise sources of a Monte Carlo run, each as a NoiseMask that applies it alone.

A source is a family of draws the Monte Carlo makes (emulator.variability.monte_carlo):
- `compute <op class>` (emulator.costs.kernel_table.op_class: "gemm", "flash_attn_bwd",
  "norm", ...): the temporal noise of that class's kernels. A segment is drawn once, with
  the summed variance of its kernels (independent), so a class's part of a segment is the sum
  over the segment's rows of that class (emulator.graph.build.segment_rows);
- `<kind> on <group>` ("all_gather on dp", "all_reduce on tp", "all_reduce on pp" for one
  spanning stages): the collective noise of those calls;
- `send/recv on pp`: the pipeline transfers' noise;
- `per-GPU speed`: the per-GPU factors, persistent (spatial) and per-step (`step_cv`);
- `network regime`: the per-step regime of all communication, and `network regime on <kind>
  on <group>` (`... on send/recv on pp`): the regime on those calls alone (which calls the
  congestion hurts).
A source with no noise under the model (a CV of 0, free comm, one regime of factor 1) is
left out. `inert_reason` says why a source the model has provably applies no noise to one
graph (e.g. the network regime on tp calls that never leave a node): its run would give the
deterministic step in every sample, so the attribution does not make it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from emulator.capture.trace import RankTrace
from emulator.costs.kernel_table import op_class
from emulator.graph.build import segment_rows
from emulator.graph.execution_graph import COLLECTIVE, SEGMENT, SEND, ExecutionGraph
from emulator.variability.model import VariabilityModel
from emulator.variability.monte_carlo import NoiseMask

CATEGORIES = ("compute", "collective", "pipeline", "spatial", "network")


@dataclass(frozen=True, eq=False)
class NoiseSource:
    """One source: its name, its category (CATEGORIES) and the mask applying it alone;
    `op_class`: a compute source's op class (emulator.costs.kernel_table.op_class)."""

    name: str
    category: str
    mask: NoiseMask
    op_class: str | None = None


def no_noise(graph: ExecutionGraph) -> NoiseMask:
    """The mask applying nothing: every draw is made and none is used."""
    return NoiseMask(
        segment_std_s=tuple(np.zeros(len(c)) for c in graph.classes),
        comm=tuple(np.zeros(len(c), bool) for c in graph.classes),
        spatial=False,
        network=False,
    )


def variances_by_row_label(
    graph: ExecutionGraph,
    traces: dict[int, RankTrace],
    spreads_s: dict[int, np.ndarray],
    label: Callable[[RankTrace, np.ndarray], np.ndarray],
) -> dict[str, tuple[np.ndarray, ...]]:
    """Per label: per graph class, each node's variance (s^2) from its segment rows of that
    label; `label(trace, rows)` names each of a class's segment rows (None: left out)."""
    parts: dict[str, list[np.ndarray]] = {}
    for p, g in enumerate(graph.classes):
        trace = traces[p]
        rows, nodes = segment_rows(trace, g)
        labels = np.asarray(label(trace, rows), dtype=object)
        variances = np.asarray(spreads_s[p], float)[rows] ** 2
        for name in sorted({x for x in labels.tolist() if x is not None}):
            per_class = parts.setdefault(name, [np.zeros(len(c)) for c in graph.classes])
            sel = labels == name
            per_class[p] = np.bincount(nodes[sel], weights=variances[sel], minlength=len(g))
    return {name: tuple(v) for name, v in sorted(parts.items())}


def row_op_classes(trace: RankTrace, rows: np.ndarray) -> np.ndarray:
    """Each row's op class (emulator.costs.kernel_table.op_class)."""
    names = np.array([op_class(n) for n in trace.strings], dtype=object)
    return names[trace["name"][rows]]


def op_class_variances_s2(
    graph: ExecutionGraph, traces: dict[int, RankTrace], spreads_s: dict[int, np.ndarray]
) -> dict[str, tuple[np.ndarray, ...]]:
    """Per op class: per graph class, each node's variance (s^2) from that class's kernels;
    summed over op classes they give the graph's `variance_s2` (built from `spreads_s`)."""
    return variances_by_row_label(graph, traces, spreads_s, row_op_classes)


def _comm_signatures(graph: ExecutionGraph) -> dict[tuple[str, str], tuple[np.ndarray, ...]]:
    """(category, name) -> per class, per node: the comm nodes with that signature."""
    out: dict[tuple[str, str], list[np.ndarray]] = {}
    for p, g in enumerate(graph.classes):
        kinds, names, groups = g["kind"], g.text("name"), g.text("group")
        for node in np.flatnonzero((kinds == COLLECTIVE) | (kinds == SEND)).tolist():
            if g["duration_s"][node] <= 0:
                continue
            if kinds[node] == SEND:
                key = ("pipeline", "send/recv on pp")
            else:
                key = ("collective", f"{names[node]} on {groups[node]}")
            masks = out.setdefault(key, [np.zeros(len(c), bool) for c in graph.classes])
            masks[p][node] = True
    return {k: tuple(v) for k, v in out.items()}


def noise_sources(
    graph: ExecutionGraph,
    model: VariabilityModel,
    traces: dict[int, RankTrace],
    spreads_s: dict[int, np.ndarray],
) -> tuple[NoiseSource, ...]:
    """Every source of `model`'s noise over `graph` (module docstring), compute first.

    `traces` and `spreads_s` are those the graph was built from (per class)."""
    off = no_noise(graph)
    nothing = dict(segment_std_s=off.segment_std_s, comm=off.comm, spatial=False, network=False)
    sources = []
    if model.has_kernel_noise:
        for name, variances in op_class_variances_s2(graph, traces, spreads_s).items():
            if any(v.any() for v in variances):
                std = tuple(np.sqrt(v) for v in variances)
                mask = NoiseMask(**(nothing | {"segment_std_s": std}))
                sources.append(NoiseSource(f"compute {name}", "compute", mask, op_class=name))
    signatures = sorted(_comm_signatures(graph).items(), key=lambda kv: kv[0])
    comm_cvs = {"collective": model.collective_cv, "pipeline": model.pipeline_transfer_cv}
    for (category, name), nodes in signatures:
        if comm_cvs[category] > 0:
            sources.append(NoiseSource(name, category, NoiseMask(**(nothing | {"comm": nodes}))))
    if model.spatial_cv > 0 or model.step_cv > 0 or model.speed_factors is not None:
        mask = NoiseMask(**(nothing | {"spatial": True}))
        sources.append(NoiseSource("per-GPU speed", "spatial", mask))
    if any(r.factor != 1.0 for r in model.network if r.probability > 0):
        regime = nothing | {"network": True}
        sources.append(NoiseSource("network regime", "network", NoiseMask(**regime)))
        for (_, name), nodes in signatures:
            mask = NoiseMask(**regime, network_comm=nodes)
            sources.append(NoiseSource(f"network regime on {name}", "network", mask))
    return tuple(sources)


# Why a source is left out of the attribution (inert_reason).
NO_CALL_CROSSES_NODES = (
    "none of its calls crosses nodes, and the network regime slows only calls that do "
    "(network_scope inter-node)"
)
NOTHING_NOISY = "its mask selects no draw that carries noise"


def _selected(per_class: tuple[np.ndarray, ...] | None, p: int, n: int) -> np.ndarray:
    return np.ones(n, bool) if per_class is None else np.asarray(per_class[p], bool)


def applies_noise(mask: NoiseMask, graph: ExecutionGraph, model: VariabilityModel) -> bool:
    """Whether a run with `mask` can differ from the deterministic replay: some segment drawn
    with a standard deviation above 0, some comm call drawn with a CV above 0 and selected, the
    per-GPU factors, or a slower network regime on a selected call in the model's scope (the
    rules of emulator.variability.monte_carlo's _Durations, read from the graph)."""
    if mask.spatial and (model.spatial_cv > 0 or model.step_cv > 0 or (
            model.speed_factors is not None and (model.speed_factors != 1).any())):  # fmt: skip
        return True
    slower = any(r.factor != 1.0 for r in model.network if r.probability > 0)
    for p, c in enumerate(graph.classes):
        kind, busy = c["kind"], c["duration_s"] > 0
        if model.has_kernel_noise:
            std = np.sqrt(c["variance_s2"]) if mask.segment_std_s is None else mask.segment_std_s[p]
            if ((kind == SEGMENT) & (c["variance_s2"] > 0) & (np.asarray(std) > 0)).any():
                return True
        drawn = ((kind == COLLECTIVE) & (model.collective_cv > 0)) | (
            (kind == SEND) & (model.pipeline_transfer_cv > 0)
        )
        if (drawn & busy & _selected(mask.comm, p, len(c))).any():
            return True
        if mask.network and slower and (_regime_nodes(mask, c, p, model) & busy).any():
            return True
    return False


def _regime_nodes(mask: NoiseMask, c, p: int, model: VariabilityModel) -> np.ndarray:
    """Class p's comm nodes that a run with `mask` applies the network regime to."""
    nodes = np.isin(c["kind"], (COLLECTIVE, SEND)) & _selected(mask.network_comm, p, len(c))
    return nodes & model.regime_reaches(c)


def inert_reason(source: NoiseSource, graph: ExecutionGraph, model: VariabilityModel) -> str | None:
    """Why `source` provably applies no noise to `graph` under `model` (None: it may apply
    some): NO_CALL_CROSSES_NODES where it is a network regime on calls that all stay inside
    a node, NOTHING_NOISY otherwise (`applies_noise`)."""
    mask = source.mask
    if applies_noise(mask, graph, model):
        return None
    if mask.network and model.network_scope == "inter-node":
        anywhere = replace(model, network_scope="all")
        if applies_noise(mask, graph, anywhere):
            return NO_CALL_CROSSES_NODES
    return NOTHING_NOISY
