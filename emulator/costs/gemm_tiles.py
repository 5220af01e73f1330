"""How much of the GPU a GEMM's output tiles keep busy: the one model of tile and wave
quantization, used by the roofline curves (`costs.compute`) and the kernel tables' interpolation
(`costs.kernel_table`).

cuBLAS and CUTLASS split a GEMM's m x n output into tiles, one per CTA, and run them in waves of
one CTA per SM. The last tile in m and in n is computed whole even where the matrix ends inside
it (padding), and the last wave leaves SMs idle when the tile count is not a multiple of the SM
count (wave quantization). The curves take the wave efficiency alone: with one fixed tile, the
padding would price a GEMV (m = 1) at 1/128 of the rate, where cuBLAS runs another kernel. The
tables' interpolation, between neighbours within a factor of 2, takes the whole utilisation.
"""

from __future__ import annotations

import math

# Output tile of one CTA: 128 x 128 is the common cuBLAS/CUTLASS tensor-core tile for large bf16
# GEMMs (CUTLASS default GEMM configurations); a DEFAULT.
GEMM_TILE = 128


def gemm_wave_efficiency(m: int, n: int, batch: int, sm_count: int) -> float:
    """Fraction of the last wave's SMs kept busy: tiles / (waves * SMs)."""
    tiles = math.ceil(m / GEMM_TILE) * math.ceil(n / GEMM_TILE) * batch
    waves = math.ceil(tiles / sm_count)
    return tiles / (waves * sm_count)


def gemm_tile_utilisation(m: int, n: int, batch: int, sm_count: int) -> float:
    """Fraction of the tile slots of all waves that compute the GEMM's own output: the wave
    efficiency times the padding of the last tile in m and in n."""
    padded = math.ceil(m / GEMM_TILE) * GEMM_TILE * math.ceil(n / GEMM_TILE) * GEMM_TILE
    return m * n / padded * gemm_wave_efficiency(m, n, batch, sm_count)
