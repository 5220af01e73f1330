"""Monte Carlo over the mesh-vectorized replay: the distribution of a job's step time.

`sample_step_times` replays the whole world N times at once (emulator.graph.replay's
`replay_samples`: every lane value carries a samples axis last), drawing each node's duration
as PRISM does (emulator.variability.model):

- compute: one draw per *segment* (the graph's run of compute ops between communication
  points) per rank per sample, not one per kernel: the segment's mean is the sum of its
  kernels' means (`duration_s`) and its variance the sum of their variances (`variance_s2`:
  independent kernels), drawn as a normal (a sum of many independent kernels), then times the
  rank's persistent speed factor: d = f_rank * (mean + sqrt(variance) * z). The spreads are
  the graph's (set when it was built: the model's `temporal_spreads_s`, or measured ones); a
  model without kernel noise (`has_kernel_noise`) turns it off without rebuilding the graph;
  the factor is the rank's persistent one (one draw per allocation, shared by the
  `steps_per_allocation` consecutive samples that stand for steps of one run) times its
  per-step one (`step_cv`);
- collective: one draw per group instance per sample, shared by every member (it starts when
  the last member is ready and all end together); a collective spanning pipeline stages
  draws once for all of them: d = duration * network * (1 + collective_cv * z);
- pipeline transfer: one draw per pair of ranks, the same for the send and its recv, like a
  collective's, with the model's `pipeline_transfer_cv`: d = duration * network * (1 + cv * z).
  The replay adds the wait for the peer, so the draw stands for PRISM's no-bubble regime (the
  transfer's own duration); its CV is the collectives' assumed one unless `transfer_cv` was
  measured on a real run's transfers (prismbench.pipeline_transfers);
- network: one regime per sample, on the communication the model's `network_scope` names
  (by default the calls and transfers whose group spans nodes: the graph's `crosses_nodes`).

With no variability every draw is the graph's duration times exactly 1, so the replay's
arithmetic is the deterministic replay's and the step time equals `replay`'s exactly.
Samples run in chunks small enough that a lane value stays a few MB (CHUNK_ELEMENTS), unless
one allocation (`steps_per_allocation` samples) is larger than that; each chunk draws from its
own generator, spawned from the seed (numpy's SeedSequence), so chunks can run on threads at
once and the answer does not depend on how many.

A `NoiseMask` switches sources off (variance attribution, emulator.variability.attribution):
every draw is still made, in the same order, and only its use is masked, so two runs with the
same seed share every draw (common random numbers) and an all-on mask reproduces the unmasked
run exactly.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from emulator.graph.execution_graph import COLLECTIVE, RECV, SEGMENT, SEND, ExecutionGraph
from emulator.graph.replay import replay_samples
from emulator.variability.model import VariabilityModel
from emulator.variability.sampling import NoisePool, network_factors, speed_factors
from emulator.variability.summary import check_allocations

# Elements of one lane value per chunk: 2**18 float64 = 2 MiB. On the README's 8 192-GPU example
# (250 samples, one thread, best of two on a loaded machine) 2**17, 2**18 and 2**19 took 11.4,
# 11.2 and 13.1 s of CPU: a chunk's working set (tens of lane values) stays nearer the cores,
# and smaller chunks pay Python's per-node cost more often.
CHUNK_ELEMENTS = 1 << 18


@dataclass(frozen=True, kw_only=True, eq=False)
class NoiseMask:
    """Which of a model's noise a run applies (module docstring); the defaults apply all.

    segment_std_s: per class, per node: the standard deviation (s) of the temporal noise
    applied, in place of the graph's sqrt(variance_s2) (e.g. the part of a segment's variance
    that some op classes contribute); the draw is made wherever the graph's is.
    comm: per class, per node: True where a collective's or transfer's noise applies (a
    transfer's draw is made at its send, a pp-spanning collective's at its first member).
    spatial: the per-GPU speed factors (drawn or fixed); network: the per-step regime, on
    the comm nodes of the model's `network_scope` where `network_comm` (per class, per node)
    is True (None: on all of them)."""

    segment_std_s: tuple[np.ndarray, ...] | None = None
    comm: tuple[np.ndarray, ...] | None = None
    spatial: bool = True
    network: bool = True
    network_comm: tuple[np.ndarray, ...] | None = None

    def check(self, graph: ExecutionGraph) -> None:
        for name in ("segment_std_s", "comm", "network_comm"):
            per_class = getattr(self, name)
            if per_class is None:
                continue
            shapes = [np.shape(a) for a in per_class]
            if shapes != [(len(c),) for c in graph.classes]:
                raise ValueError(f"NoiseMask.{name} shapes {shapes} do not match the graph")


class _Durations:
    """duration(pp, node) for replay_samples: one chunk's draws (module docstring)."""

    def __init__(
        self,
        graph: ExecutionGraph,
        model: VariabilityModel,
        rng,
        samples: int,
        mask: NoiseMask | None,
        steps_per_allocation: int,
        draws_per_sample: int,
    ):
        self.graph, self.variability, self.samples = graph, model, samples
        mask = mask or NoiseMask()
        world = graph.world
        lanes = graph.lanes
        self.lane_shape = (*lanes, samples)
        factors = speed_factors(rng, model, world, samples, steps_per_allocation)
        if not mask.spatial:
            factors = None
        elif factors is not None:  # samples last, as replay_samples' lane values
            factors = np.ascontiguousarray(np.moveaxis(factors, 0, -1))
        pos = world.pipeline_position
        self.factors = [
            None if factors is None else (factors if pos is None else np.take(factors, p, pos))
            for p in range(world.pp)
        ]
        network = network_factors(rng, model, samples)
        if not mask.network:
            network = np.ones(samples)
        self.network = network.reshape((1,) * len(lanes) + (samples,))
        self.pool = NoisePool(rng, int(np.prod(self.lane_shape)), draws_per_sample * samples)
        self.cols = [self._columns(p, c, mask, model) for p, c in enumerate(graph.classes)]
        self.joins: dict[int, np.ndarray] = {}  # pp-spanning collective -> its shared draw
        self.transfers: dict[tuple[int, int], np.ndarray] = {}  # (class, send node) -> draw

    @staticmethod
    def _columns(pp: int, c, mask: NoiseMask, model: VariabilityModel) -> dict[str, list]:
        """Class pp's node columns as lists: draw_s (the graph's std, where a draw is made),
        std_s (the std applied), noisy (comm noise applied) and regime (the network regime
        applied: in the model's scope and the mask's)."""
        cols = {k: c[k].tolist() for k in ("kind", "duration_s", "axes", "join", "peer_class")}
        cols["draw_s"] = np.sqrt(c["variance_s2"]).tolist()
        std = mask.segment_std_s
        cols["std_s"] = cols["draw_s"] if std is None else np.asarray(std[pp], float).tolist()
        noisy, regime = np.ones(len(c), bool), np.ones(len(c), bool)
        if mask.comm is not None:
            noisy &= np.asarray(mask.comm[pp], bool)
        if mask.network_comm is not None:
            regime &= np.asarray(mask.network_comm[pp], bool)
        regime &= model.regime_reaches(c)
        cols["noisy"], cols["regime"] = noisy.tolist(), regime.tolist()
        return cols

    def __call__(self, pp: int, node: int):
        c = self.cols[pp]
        kind = c["kind"][node]
        if kind == SEGMENT:
            return self._segment(pp, c["duration_s"][node], c["draw_s"][node], c["std_s"][node])
        if kind == COLLECTIVE:
            join = c["join"][node]
            cv = self.variability.collective_cv
            if join < 0:
                return self._comm(c, node, c["axes"][node], cv)
            if join not in self.joins:
                self.joins[join] = self._comm(c, node, c["axes"][node], cv)
            return self.joins[join]
        if kind == SEND:
            cv = self.variability.pipeline_transfer_cv
            d = self.transfers[(pp, node)] = self._comm(c, node, 0, cv)
            return d
        if kind == RECV:
            return self.transfers.pop((c["peer_class"][node], c["join"][node]))
        raise ValueError(f"class {pp} node {node}: kind {kind} has no duration")

    def _segment(self, pp: int, mean: float, draw: float, std: float):
        d = mean
        if draw > 0 and self.variability.has_kernel_noise:
            z = self.pool.window(self.lane_shape)
            if std > 0:
                d = mean + std * z
        factors = self.factors[pp]
        return d if factors is None else d * factors

    def _comm(self, c: dict[str, list], node: int, axes_mask: int, cv: float):
        duration = c["duration_s"][node]
        d = duration * self.network if c["regime"][node] else duration
        if cv > 0 and duration > 0:
            shape = tuple(1 if (axes_mask >> a) & 1 else n for a, n in enumerate(self.graph.lanes))
            z = self.pool.window((*shape, self.samples))
            if c["noisy"][node]:
                d = d * (1.0 + cv * z)
        return d


def network_regime_nodes(graph: ExecutionGraph, model: VariabilityModel) -> int:
    """How many communication nodes of the graph's classes the model's network regime slows
    (`network_scope`): none, and the regime drawn for a sample changes nothing."""
    mask = NoiseMask()
    return sum(
        sum(
            regime and kind in (COLLECTIVE, SEND)
            for regime, kind in zip(cols["regime"], cols["kind"], strict=True)
        )
        for cols in (_Durations._columns(p, c, mask, model) for p, c in enumerate(graph.classes))
    )


def draws_per_sample(graph: ExecutionGraph, model: VariabilityModel) -> int:
    """Normals one sample takes from the NoisePool: a lane each per noisy segment, and per comm
    draw one per group instance (the lanes outside its axes; a pp-spanning collective once):
    collectives where the model's collective_cv is above 0, transfers where its
    pipeline_transfer_cv is."""
    lanes = graph.lanes
    draws, joins = 0, set()
    for c in graph.classes:
        kind = c["kind"]
        if model.has_kernel_noise:
            draws += int(np.prod(lanes)) * int(((kind == SEGMENT) & (c["variance_s2"] > 0)).sum())
        drawn = ((kind == COLLECTIVE) & (model.collective_cv > 0)) | (
            (kind == SEND) & (model.pipeline_transfer_cv > 0)
        )
        for node in np.flatnonzero(drawn & (c["duration_s"] > 0)).tolist():
            join = int(c["join"][node]) if kind[node] == COLLECTIVE else -1
            if join in joins:
                continue
            if join >= 0:
                joins.add(join)
            axes = int(c["axes"][node])
            draws += int(np.prod([1 if (axes >> a) & 1 else n for a, n in enumerate(lanes)]))
    return draws


def chunk_samples(graph: ExecutionGraph, samples: int) -> int:
    """Samples per chunk: CHUNK_ELEMENTS over one class's lanes, at least 1."""
    return max(1, min(samples, CHUNK_ELEMENTS // int(np.prod(graph.lanes))))


def sample_step_times(
    graph: ExecutionGraph,
    model: VariabilityModel,
    *,
    samples: int = 1000,
    seed: int = 0,
    mask: NoiseMask | None = None,
    steps_per_allocation: int = 1,
    threads: int | None = None,
    progress: Callable[[int], None] | None = None,
    network_out: np.ndarray | None = None,
) -> np.ndarray:
    """Step times (s) of `samples` draws of `model` over `graph`: shape (samples,); `mask`
    applies only part of the model's noise (NoiseMask). `steps_per_allocation` consecutive
    samples share one draw of the persistent per-GPU factors: steps of one run on the same
    GPUs (1: every sample on a fresh allocation); emulator.variability.summary splits them.

    The samples run in chunks (`chunk_samples`), each with its own generator spawned from
    `seed`, on `threads` threads at once (None: one per core): numpy releases the GIL in the
    replay's array arithmetic, where the time goes. The chunks and their draws do not depend
    on `threads`, so neither does the answer. `progress(done)` hears the samples finished
    after each chunk. `network_out`, an array of `samples` floats, is given each sample's
    network regime factor (1 where the mask leaves the network off)."""
    if not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples={samples!r} must be an int >= 1")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads={threads!r} must be an int >= 1 or None")
    check_allocations(samples, steps_per_allocation)
    if mask is not None:
        mask.check(graph)
    if network_out is not None and np.shape(network_out) != (samples,):
        raise ValueError(f"network_out has shape {np.shape(network_out)}, not ({samples},)")
    # whole allocations per chunk, so that none straddles two chunks' draws: an allocation of
    # more samples than CHUNK_ELEMENTS / lanes holds (64 at 8 192 GPUs, pp 1) makes chunks,
    # and their memory, that many samples large
    chunk = max(1, chunk_samples(graph, samples) // steps_per_allocation) * steps_per_allocation
    starts = range(0, samples, chunk)
    seeds = np.random.SeedSequence(seed).spawn(len(starts))
    times = np.empty(samples)
    per_sample = draws_per_sample(graph, model)

    finished = 0
    lock = threading.Lock()

    def run(lo: int, chunk_seed: np.random.SeedSequence) -> None:
        nonlocal finished
        n = min(chunk, samples - lo)
        rng = np.random.default_rng(chunk_seed)
        durations = _Durations(graph, model, rng, n, mask, steps_per_allocation, per_sample)
        times[lo : lo + n] = replay_samples(graph, n, durations)
        if network_out is not None:
            network_out[lo : lo + n] = durations.network.ravel()
        if progress is not None:
            with lock:
                finished += n
                progress(finished)

    with ThreadPoolExecutor(min(len(starts), threads or os.cpu_count() or 1)) as pool:
        for done in [pool.submit(run, lo, s) for lo, s in zip(starts, seeds, strict=True)]:
            done.result()
    return times
