"""The OOM-pair runner's plumbing (results/fidelity/oom_pairs_gpu.py): how a real run is classed
and reported. Its predictions and real runs need captures and a GPU (the script's --dry-run)."""

import pytest


@pytest.mark.parametrize(
    ("returncode", "output", "outcome"),
    [
        (0, "oom_pairs_gpu result: {}", "fits"),
        (1, "RuntimeError: rank 0:\ntorch.OutOfMemoryError: CUDA out of memory. Tried ...", "oom"),
        (1, "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom"),
        (1, "RuntimeError: NCCL error", "error"),
        (-9, "", "error"),
    ],
)
def test_a_run_is_classed_by_its_exit_status_and_torch_s_message(runner, returncode, output, outcome):
    assert runner.outcome_of(returncode, output) == outcome


def test_every_case_has_a_recorded_spec_on_each_measured_gpu(runner):
    for gpu in runner.RECORDED_PREFIX:
        for name, _ in runner.CASES:
            assert runner.recorded_job(name, gpu).cluster.gpu == gpu


def test_the_table_sets_each_prediction_beside_what_happened(runner):
    row = {"case": "c", "vary": "micro_batch", "fits": 33, "does_not_fit": 34,
           "runs": [{"value": 33, "outcome": "fits"}, {"value": 34, "outcome": "oom"}]}  # fmt: skip
    assert runner.table([row]).splitlines()[-1] == "| c | micro_batch | 33 | fits | 34 | oom |"
    assert runner.table([row | {"runs": []}]).splitlines()[-1].endswith("| 33 | - | 34 | - |")


def test_the_committed_predictions_name_every_case_on_their_own_gpu(runner):
    folder = runner.ROOT / "results" / "fidelity" / "oom_pairs_predicted"
    for gpu in runner.RECORDED_PREFIX:
        pairs = runner.load_predicted(folder / f"{gpu}.json", gpu)
        for name, _ in runner.CASES:
            assert pairs[name]["does_not_fit"] == pairs[name]["fits"] + 1


def test_predictions_for_another_gpu_are_refused(runner):
    folder = runner.ROOT / "results" / "fidelity" / "oom_pairs_predicted"
    with pytest.raises(ValueError, match="on h100-sxm-80g"):
        runner.load_predicted(folder / "h200-141g.json", "h100-sxm-80g")
