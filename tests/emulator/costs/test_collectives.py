"""Tests for emulator.costs.collectives: limits, monotonicity, topology effects, NCCL choices."""

import numpy as np
import pytest

from emulator.costs.collectives import (
    COLLECTIVES,
    Topology,
    bus_bandwidth_factor,
    bus_bandwidth_GBps,
    choose_algorithm,
    collective_time_s,
    collective_times_s,
)
from emulator.costs.nccl_tuning import nvls_reduction_supported
from emulator.hardware import gpu_preset, inter_node_network, intra_node_link


def _topo(gpu="h100-sxm-80g", link="nvlink4", net="ib-ndr-8x400"):
    return Topology(
        gpu=gpu_preset(gpu),
        gpus_per_node=8,
        link=intra_node_link(link),
        network=inter_node_network(net),
    )


H100, A100 = _topo(), _topo("a100-sxm-80g", "nvlink3", "ib-hdr-8x200")
TP = np.arange(8)  # one node
DP = np.arange(0, 64, 8)  # one GPU in each of 8 nodes
SIZES = 2.0 ** np.arange(4, 34)


@pytest.mark.parametrize("kind", COLLECTIVES)
@pytest.mark.parametrize("ranks", [TP, DP, np.arange(32)], ids=["tp", "dp", "4nodes"])
def test_monotonic_in_size(kind, ranks):
    times = collective_times_s(kind, SIZES, ranks, H100)
    assert np.all(np.diff(times) >= 0) and np.all(times > 0)


@pytest.mark.parametrize("kind", ["all_reduce", "barrier"])
def test_a_slower_link_inside_nodes_never_speeds_a_group_with_one_member_a_node(kind):
    # NCCL's ring counts 2 x nodes network steps of an all-reduce against its 2 (n - 1) steps,
    # so with one member a node more hops cross the network than the ring takes: the intra-node
    # steps came out negative and an extra NVLink latency took time away, below zero at 20 us.
    # Such a group has no intra-node hop for that latency to lengthen.
    def times(latency_us):
        link = {"bandwidth_GBps": 370.8, "latency_us": latency_us, "nvls": True, "channels": 18}
        topo = Topology(gpu=gpu_preset("h100-sxm-80g"), gpus_per_node=8,
                        link=intra_node_link(link), network=inter_node_network("ib-ndr-8x400"))
        return collective_times_s(kind, SIZES, DP, topo)

    assert np.all(times(0.0) > 0)
    assert np.array_equal(times(0.0), times(20.0))


def test_small_messages_latency_bound():
    t_small = collective_times_s("all_reduce", [8, 64, 512], TP, H100)
    assert t_small.max() / t_small.min() < 1.1


def test_large_all_reduce_busbw_approaches_link_bandwidth_a100():
    busbw = bus_bandwidth_GBps("all_reduce", 8 * 2**30, TP, A100)[0]
    assert 0.9 * 240.0 < busbw <= 240.0


def test_large_all_gather_busbw_approaches_link_bandwidth_h100():
    busbw = bus_bandwidth_GBps("all_gather", 8 * 2**30, TP, H100)[0]
    assert 0.95 * 370.8 < busbw <= 370.8


def test_intra_node_faster_than_inter_node_same_group_size():
    assert collective_time_s("all_reduce", 2**28, TP, H100) < collective_time_s(
        "all_reduce", 2**28, DP, H100
    )


def test_dp_group_bound_by_one_nic():
    busbw = bus_bandwidth_GBps("all_gather", 8 * 2**30, DP, H100)[0]
    assert busbw <= 47.0 * 1.0001 and busbw > 0.8 * 47.0


def test_more_members_per_node_use_more_rails():
    two_per_node = np.array([r for node in range(8) for r in (8 * node, 8 * node + 1)])
    one_per_node = DP
    t2 = collective_time_s("all_gather", 2**30 * 16 / 8, two_per_node, H100)
    t1 = collective_time_s("all_gather", 2**30 * 8 / 8, one_per_node, H100)
    assert t2 < 1.2 * t1  # twice the data on twice the rails


def test_an_all_reduce_over_two_nodes_is_no_faster_than_their_nics():
    # every node must receive the other's S-byte partial sum, so S / (its NICs) is a floor;
    # NCCL's tuner prices a two-node tree at NVLink speed, as if the NICs kept up
    nbytes = 1.48e9
    nic = H100.network.nic_bandwidth_GBps * 1e9
    two_a_node = np.array([0, 4, 8, 12])  # tp 4 x dp 4 on two nodes: 2 rails a node
    assert collective_time_s("all_reduce", nbytes, two_a_node, H100) >= nbytes / (2 * nic)
    uneven = np.array([0, 4, 8])  # 6-GPU nodes: the lone member of node 1 has one NIC
    six = Topology(gpu=H100.gpu, gpus_per_node=6, link=H100.link, network=H100.network)
    assert collective_time_s("all_reduce", nbytes, uneven, six) >= nbytes / nic


def test_gpus_sharing_a_nic_share_its_bandwidth():
    # BLOOM's nodes: 8 A100s, 4 Omni-Path HFIs. Every GPU of a node reduces its own data-parallel
    # group at once, so two GPUs drive each NIC: a group with one member a node gets half a NIC.
    opa = _topo("a100-sxm-80g", "nvlink3", "opa-4x100")
    nic = opa.network.nic_bandwidth_GBps
    assert opa.network_share_GBps == nic / 2
    busbw = bus_bandwidth_GBps("all_gather", 8 * 2**30, DP, opa)[0]
    assert 0.8 * nic / 2 < busbw <= nic / 2 * 1.0001
    # a send between nodes likewise; with a NIC per GPU nothing is shared
    pair = np.array([0, 8])
    assert collective_time_s("send_recv", 2**30, pair, opa) == pytest.approx(
        2**30 / (nic / 2 * 1e9), rel=1e-3
    )
    assert H100.network_share_GBps == H100.network.nic_bandwidth_GBps


def test_a_group_with_a_member_on_each_gpu_of_the_node_uses_every_nic():
    opa = _topo("a100-sxm-80g", "nvlink3", "opa-4x100")
    whole_nodes = np.arange(16)
    busbw = bus_bandwidth_GBps("all_gather", 8 * 2**30, whole_nodes, opa)[0]
    assert busbw > 0.8 * 4 * opa.network.nic_bandwidth_GBps


def test_nvls_chosen_for_large_all_reduce_on_h100_node():
    assert choose_algorithm("all_reduce", 2**30, TP, H100)[:2] == ("nvls", "Simple")


@pytest.mark.parametrize(
    "reduce_op, dtype, supported",
    [("SUM", "bfloat16", True), ("", "bfloat16", True), ("MAX", "bfloat16", True),
     ("SUM", "float32", True), ("MAX", "float32", False), ("AVG", "float32", False),
     ("AVG", "bfloat16", False), ("PREMUL_SUM", "bfloat16", False),
     ("SUM", "float8_e4m3fn", False), ("", "none", True)],
)  # fmt: skip
def test_nvls_runs_sums_and_min_max_of_the_types_nccl_lists(reduce_op, dtype, supported):
    # device.h ncclNvlsSupported after enqueue.cc turns AVG into a pre-multiplied sum
    assert nvls_reduction_supported(reduce_op, dtype) is supported


def test_an_averaging_reduce_scatter_in_one_node_never_runs_on_nvls():
    # FSDP2 reduce-scatters float32 gradients with AVG: the tuner is offered no NVLS
    sizes = 2.0 ** np.arange(16, 32)
    summed = [choose_algorithm("reduce_scatter", s, TP, H100)[0] for s in sizes]
    averaged = [choose_algorithm("reduce_scatter", s, TP, H100, nvls_reduction=False)[0] for s in sizes]
    assert "nvls" in summed and "nvls" not in averaged
    assert np.all(
        collective_times_s("reduce_scatter", sizes, TP, H100, nvls_reduction=False)
        >= collective_times_s("reduce_scatter", sizes, TP, H100)
    )


def test_nvls_needs_more_than_two_gpus_of_the_group_on_a_node():
    # nvls.cc ncclNvlsInit: no NVLS where the communicator has <= 2 GPUs on a node
    two_a_node = np.array([0, 1, 8, 9])
    three_a_node = np.array([0, 1, 2, 8, 9, 10])
    algos = {n: {choose_algorithm("all_reduce", s, r, H100)[0] for s in 2.0 ** np.arange(10, 32)}
             for n, r in (("two", two_a_node), ("three", three_a_node))}  # fmt: skip
    assert "nvls_tree" not in algos["two"] and "nvls_tree" in algos["three"]


def test_no_nvls_on_a100():
    assert choose_algorithm("all_reduce", 2**30, TP, A100)[0] == "ring"


def test_ll_protocol_for_tiny_messages():
    assert choose_algorithm("all_reduce", 1024, TP, A100)[1] == "LL"


def test_single_rank_group_costs_nothing():
    assert collective_time_s("all_reduce", 2**20, np.array([5]), H100) == 0.0


def test_bus_factors_match_nccl_tests():
    assert bus_bandwidth_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_bandwidth_factor("all_gather", 8) == pytest.approx(0.875)
    assert bus_bandwidth_factor("broadcast", 8) == 1.0


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="collective kind='allreduce'"):
        collective_time_s("allreduce", 1.0, TP, H100)


def test_duplicate_ranks_are_refused():
    with pytest.raises(ValueError, match="distinct"):
        collective_time_s("all_reduce", 1.0, np.array([0, 0]), H100)


# The latency floor: a 4-byte call costs NCCL's own predicted latency (tuning.cc baseLat plus
# hwLat per step, at commit b6475625), whichever algorithm and protocol is cheapest there.
@pytest.mark.parametrize(
    ("kind", "ranks", "floor_us", "algo"),
    [
        # ring LL in one node: baseLat 6.6 + 2 (8 - 1) steps x NVLink hwLat 0.6
        ("all_reduce", TP, 6.6 + 14 * 0.6, ("ring", "LL")),
        # across 2 nodes tree LL wins: 6.8 + 2 ((8 - 1) x 0.6 + log2(2) x NET hwLat 5.0)
        ("all_reduce", np.arange(16), 6.8 + 2 * (7 * 0.6 + 5.0), ("tree", "LL")),
        # all_gather ring LL in one node: 6.6 + (8 - 1) x 0.6
        ("all_gather", TP, 6.6 + 7 * 0.6, ("ring", "LL")),
    ],
)
def test_latency_floor_per_size_and_algorithm(kind, ranks, floor_us, algo):
    algorithm, protocol, seconds = choose_algorithm(kind, 4, ranks, H100)
    assert (algorithm, protocol) == algo
    assert seconds == pytest.approx(floor_us * 1e-6, rel=1e-3)
    assert collective_time_s(kind, 4, ranks, H100) == pytest.approx(seconds)
    # the floor holds until the bytes matter: 4 KiB costs under 5 % more
    assert collective_time_s(kind, 4096, ranks, H100) < 1.05 * seconds
