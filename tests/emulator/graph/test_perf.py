"""Speed of building and replaying the execution graph, measured by pytest-benchmark (`-m slow`,
`nox -s bench`), never asserted. results/perf/replay_bench.py measures the 405B-scale case."""

import pytest

from emulator.graph.build import build_graph
from emulator.graph.replay import replay
from prismbench.capture import capture_job
from prismbench.emulate import cost_context
from prismbench.spec import job_spec_from_dict

JOB = job_spec_from_dict(
    {
        "model": {"name": "llama-debug"},
        "parallel": {"tp": 2, "pp": 2, "dp": 2, "sequence_parallel": True},
        "batch": {"seq_len": 64, "global_batch": 16},
    }
)


@pytest.mark.slow
def test_benchmark_build_and_replay(benchmark):
    capture = capture_job(JOB)
    cost = cost_context(JOB)

    def build_and_replay():
        return replay(build_graph(capture.traces, capture.world, cost))

    result = benchmark(build_and_replay)
    assert result.iteration_time_s > 0
