"""Monte Carlo over the mesh-vectorized replay: the distribution of a job's step time.

`sample_step_times` replays the whole world N times at once (emulator.graph.replay's
`replay_samples`: every lane value carries a samples axis first), drawing each node's duration
as PRISM does (emulator.variability.model):

- compute: one draw per *segment* (the graph's run of compute ops between communication
  points) per rank per sample, not one per kernel: the segment's mean is the sum of its
  kernels' means (`duration_s`) and its variance the sum of their variances (`variance_s2`:
  independent kernels), drawn as a normal (a sum of many independent kernels), then times the
  rank's persistent speed factor: d = f_rank * (mean + sqrt(variance) * z). The spreads are
  the graph's (set when it was built: the model's `temporal_spreads_s`, or measured ones); a
  model without kernel noise (`has_kernel_noise`) turns it off without rebuilding the graph;
  the factor is the rank's persistent one times its per-step one (`step_cv`);
- collective: one draw per group instance per sample, shared by every member (it starts when
  the last member is ready and all end together); a collective spanning pipeline stages
  draws once for all of them: d = duration * network * (1 + collective_cv * z);
- pipeline transfer: one draw per pair of ranks, the same for the send and its recv, like a
  collective's (the transfer's own, no-bubble regime: the replay adds the waiting);
- network: one regime per sample for all communication.

With no variability every draw is the graph's duration times exactly 1, so the replay's
arithmetic is the deterministic replay's and the step time equals `replay`'s exactly.
Samples run in chunks small enough that a lane value stays a few MB (CHUNK_ELEMENTS).
"""

from __future__ import annotations

import numpy as np

from emulator.graph.execution_graph import COLLECTIVE, RECV, SEGMENT, SEND, ExecutionGraph
from emulator.graph.replay import replay_samples
from emulator.variability.model import VariabilityModel
from emulator.variability.sampling import NoisePool, network_factors, speed_factors

# Elements of one lane value per chunk: 2**19 float64 = 4 MiB, within a core's L2/L3 share
# here; larger chunks measured no faster (results/perf/variability.md).
CHUNK_ELEMENTS = 1 << 19


class _Durations:
    """duration(pp, node) for replay_samples: one chunk's draws (module docstring)."""

    def __init__(self, graph: ExecutionGraph, model: VariabilityModel, rng, samples: int):
        self.graph, self.variability, self.samples = graph, model, samples
        world = graph.world
        lanes = graph.lanes
        self.lane_shape = (samples, *lanes)
        factors = speed_factors(rng, model, world, samples)
        pos = world.pipeline_position
        self.factors = [
            None if factors is None else (factors if pos is None else np.take(factors, p, pos + 1))
            for p in range(world.pp)
        ]
        self.network = network_factors(rng, model, samples).reshape((samples,) + (1,) * len(lanes))
        self.pool = NoisePool(rng, int(np.prod(self.lane_shape)))
        self.cols = [
            {k: c[k].tolist() for k in ("kind", "duration_s", "axes", "join", "peer_class")}
            | {"std_s": np.sqrt(c["variance_s2"]).tolist()}
            for c in graph.classes
        ]
        self.joins: dict[int, np.ndarray] = {}  # pp-spanning collective -> its shared draw
        self.transfers: dict[tuple[int, int], np.ndarray] = {}  # (class, send node) -> draw

    def __call__(self, pp: int, node: int):
        c = self.cols[pp]
        kind = c["kind"][node]
        if kind == SEGMENT:
            return self._segment(pp, c["duration_s"][node], c["std_s"][node])
        if kind == COLLECTIVE:
            join = c["join"][node]
            if join < 0:
                return self._comm(c["duration_s"][node], c["axes"][node])
            if join not in self.joins:
                self.joins[join] = self._comm(c["duration_s"][node], c["axes"][node])
            return self.joins[join]
        if kind == SEND:
            d = self.transfers[(pp, node)] = self._comm(c["duration_s"][node], 0)
            return d
        if kind == RECV:
            return self.transfers.pop((c["peer_class"][node], c["join"][node]))
        raise ValueError(f"class {pp} node {node}: kind {kind} has no duration")

    def _segment(self, pp: int, mean: float, std: float):
        temporal = std > 0 and self.variability.has_kernel_noise
        d = mean + std * self.pool.window(self.lane_shape) if temporal else mean
        factors = self.factors[pp]
        return d if factors is None else d * factors

    def _comm(self, duration: float, axes_mask: int):
        d = duration * self.network
        if self.variability.collective_cv > 0 and duration > 0:
            shape = tuple(1 if (axes_mask >> a) & 1 else n for a, n in enumerate(self.graph.lanes))
            z = self.pool.window((self.samples, *shape))
            d = d * (1.0 + self.variability.collective_cv * z)
        return d


def chunk_samples(graph: ExecutionGraph, samples: int) -> int:
    """Samples per chunk: CHUNK_ELEMENTS over one class's lanes, at least 1."""
    return max(1, min(samples, CHUNK_ELEMENTS // int(np.prod(graph.lanes))))


def sample_step_times(
    graph: ExecutionGraph, model: VariabilityModel, *, samples: int = 1000, seed: int = 0
) -> np.ndarray:
    """Step times (s) of `samples` draws of `model` over `graph`: shape (samples,)."""
    if not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples={samples!r} must be an int >= 1")
    rng = np.random.default_rng(seed)
    chunk = chunk_samples(graph, samples)
    times = np.empty(samples)
    for lo in range(0, samples, chunk):
        n = min(chunk, samples - lo)
        times[lo : lo + n] = replay_samples(graph, n, _Durations(graph, model, rng, n))
    return times
