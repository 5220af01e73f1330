"""Tile and wave quantization of a GEMM's output."""

import pytest

from emulator.costs.gemm_tiles import gemm_tile_utilisation, gemm_wave_efficiency


def test_wave_quantization_penalises_one_tile_too_many():
    full = gemm_wave_efficiency(128 * 132, 128, 1, 132)
    spill = gemm_wave_efficiency(128 * 133, 128, 1, 132)
    assert full == 1.0 and spill < 0.51


def test_utilisation_counts_the_padding_of_the_last_tile():
    # 1 600 columns fill 13 tiles of 128 (1 664 computed): 132 x 13 tiles are 13 whole waves
    assert gemm_wave_efficiency(128 * 132, 1600, 1, 132) == 1.0
    assert gemm_tile_utilisation(128 * 132, 1600, 1, 132) == pytest.approx(1600 / 1664)


def test_utilisation_is_one_for_whole_tiles_in_whole_waves():
    assert gemm_tile_utilisation(128 * 132, 256, 2, 132) == 1.0
