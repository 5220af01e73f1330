"""Tests for emulator.costs.overlap: interference factors and their limits."""

import pytest

from emulator.costs.overlap import (
    async_tp_exposed_s,
    compute_slowdown,
    memory_slowdown_per_Bps,
    traffic_bytes,
    weight_grad_overlap_exposed_s,
)
from emulator.hardware import gpu_preset

H100 = gpu_preset("h100-sxm-80g")


def test_no_comm_no_slowdown():
    assert compute_slowdown(H100, comm_channels=0, comm_GBps=0.0, memory_bound=False) == 1.0
    assert compute_slowdown(H100, comm_channels=0, comm_GBps=0.0, memory_bound=True) == 1.0


def test_compute_bound_loses_the_channels_sms():
    assert compute_slowdown(
        H100, comm_channels=32, comm_GBps=0.0, memory_bound=False
    ) == pytest.approx(132 / 100)


def test_memory_bound_slowdown_grows_with_comm_traffic():
    low = compute_slowdown(H100, comm_channels=16, comm_GBps=50.0, memory_bound=True)
    high = compute_slowdown(H100, comm_channels=16, comm_GBps=400.0, memory_bound=True)
    assert 1.0 < low < high


def test_the_memory_bound_factor_is_one_plus_its_slope_times_the_traffic():
    slope = memory_slowdown_per_Bps(H100)  # 2 / (3 350 GB/s x its efficiency)
    assert slope == pytest.approx(2.0 / (H100.hbm_bandwidth_GBps * 1e9 * H100.hbm_efficiency))
    factor = compute_slowdown(H100, comm_channels=16, comm_GBps=200.0, memory_bound=True)
    assert factor == pytest.approx(1.0 + slope * 200e9)


def test_traffic_is_the_bus_bytes_at_most_at_the_link_rate():
    # an all-gather of 1 GB over 8 ranks moves 7/8 GB a member; in 2 ms that is 437.5 GB/s,
    # above a 370.8 GB/s link: the link's rate bounds it
    assert traffic_bytes(1e9, 7 / 8, 4e-3, 370.8) == pytest.approx(0.875e9)
    assert traffic_bytes(1e9, 7 / 8, 2e-3, 370.8) == pytest.approx(370.8e9 * 2e-3)
    with pytest.raises(ValueError, match="duration_s=-1"):
        traffic_bytes(1e9, 1.0, -1, 370.8)


def test_channels_beyond_sms_refused():
    with pytest.raises(ValueError, match="comm_channels=200"):
        compute_slowdown(H100, comm_channels=200, comm_GBps=0.0, memory_bound=False)


@pytest.mark.parametrize(
    "comm_s, gemm_s, tp, exposed_s",
    [
        (4.0, 2.0, 2, 4.0 + 2.0 / 2 - 2.0),  # comm-bound: the comm plus one GEMM chunk
        (1.0, 4.0, 4, 1.0 / 4),  # GEMM-bound: one comm chunk left exposed
        (2.0, 2.0, 8, 2.0 / 8),
        (0.0, 3.0, 2, 0.0),
    ],
)
def test_async_tp_exposes_the_longer_plus_one_chunk_of_the_shorter_beyond_the_gemm(
    comm_s, gemm_s, tp, exposed_s
):
    assert async_tp_exposed_s(comm_s, gemm_s, tp) == pytest.approx(exposed_s)
    assert async_tp_exposed_s(comm_s, gemm_s, tp) <= comm_s  # never worse than no overlap


def test_async_tp_needs_a_group_of_two():
    with pytest.raises(ValueError, match="tp=1"):
        async_tp_exposed_s(1.0, 1.0, 1)


@pytest.mark.parametrize(
    "comm_s, gemm_s, slowdown, exposed_s",
    [
        (1.0, 4.0, 1.25, 1.0 - 1.0 / 1.25),  # GEMMs outlast it: only their slowdown shows
        (4.0, 1.0, 1.25, 3.0),  # the GEMMs finish inside it: the rest of it is exposed
        (2.0, 2.0, 1.0, 0.0),  # no slowdown, as long as the GEMMs: hidden
        (0.0, 3.0, 1.5, 0.0),
    ],
)
def test_megatron_weight_grad_overlap_exposes_what_the_slowed_gemms_do_not_cover(
    comm_s, gemm_s, slowdown, exposed_s
):
    assert weight_grad_overlap_exposed_s(comm_s, gemm_s, slowdown) == pytest.approx(exposed_s)
    assert 0.0 <= weight_grad_overlap_exposed_s(comm_s, gemm_s, slowdown) <= comm_s


def test_weight_grad_overlap_refuses_a_speed_up():
    with pytest.raises(ValueError, match="slowdown=0.5"):
        weight_grad_overlap_exposed_s(1.0, 1.0, 0.5)
