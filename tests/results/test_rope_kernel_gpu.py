"""results/calibration/rope_kernel_gpu.py: the RoPE variants a GPU times, checked on CPU to
compute what `prism::rope` computes (the table variant compiled by Inductor here too)."""

import torch

from tests.results.conftest import load_script


def test_every_variant_rotates_as_the_op_does():
    script = load_script("calibration/rope_kernel_gpu.py")
    script.check()  # raises where a variant's values differ from the op's


def test_the_tables_hold_the_op_s_angles():
    script = load_script("calibration/rope_kernel_gpu.py")
    positions = torch.arange(5)
    cos, sin = script.angle_tables(positions, 8, 10000.0)
    assert cos.shape == sin.shape == (5, 4)
    torch.testing.assert_close(cos[:, 0], positions.float().cos())  # pair 0 turns by the position
    torch.testing.assert_close(sin[3, 1], torch.tensor(3 * 10000.0 ** -0.25).sin())
