"""The eight shared jobs' leave-one-out comparison (results/calibration/gpu_jobs.py): its
experimental host scale, which must leave the host model's own figures alone."""

import pytest

from emulator.costs.host_dispatch import HostDispatch
from tests.results.conftest import load_script


@pytest.fixture(scope="module")
def gpu_jobs():
    return load_script("calibration/gpu_jobs.py")


HOST = HostDispatch(
    per_op_s={"forward": 80e-6, "backward": 60e-6, "optimizer": 40e-6},
    entry_s={"forward": 100e-6, "backward": 2e-3, "optimizer": 60e-6},
    source="aten: 8 profile(s)",
)


def test_the_experimental_scale_multiplies_every_figure_and_says_so(gpu_jobs):
    scaled = gpu_jobs.scaled_host(HOST, 0.5)
    assert scaled.per_op_s == pytest.approx(
        {"forward": 40e-6, "backward": 30e-6, "optimizer": 20e-6}
    )
    assert scaled.entry_s == pytest.approx({"forward": 50e-6, "backward": 1e-3, "optimizer": 30e-6})
    assert scaled.source.endswith("EXPERIMENTAL x 0.5")
    assert HOST.per_op_s["forward"] == 80e-6  # the model's figures untouched


def test_without_the_flag_the_host_figures_are_the_models(gpu_jobs):
    assert gpu_jobs.scaled_host(HOST, None) is HOST
    assert gpu_jobs.scaled_host(None, 0.5) is None  # a job whose host binds nothing
