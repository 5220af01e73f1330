"""Tests for emulator.hardware: every shipped preset loads; bad names and tables are refused."""

import pytest

from emulator.hardware import (
    ARCH_OF_COMPUTE_CAPABILITY,
    GPU_NAMES,
    LINK_NAMES,
    NETWORK_NAMES,
    GpuPreset,
    gpu_preset,
    gpu_presets_matching,
    inter_node_network,
    intra_node_link,
)


def test_contract_names_are_shipped():
    assert set(GPU_NAMES) == {"a100-sxm-40g", "a100-sxm-80g", "h100-sxm-80g", "h100-hbm2e-96g", "h200-141g"}
    assert set(LINK_NAMES) == {"nvlink3", "nvlink4"}
    assert set(NETWORK_NAMES) == {"ib-hdr-8x200", "ib-ndr-8x400", "roce-8x200", "roce-8x400", "opa-4x100"}


@pytest.mark.parametrize("name", GPU_NAMES)
def test_every_gpu_preset_loads(name):
    gpu = gpu_preset(name)
    assert gpu.name == name and gpu.peak_tflops("bf16") > gpu.peak_tflops("fp32")


def test_the_500w_h100_takes_one_clock_factor_for_every_dtype():
    # torchtitan brackets its 500 W part's peak between the H100 SXM's and NVL's (989 and 835
    # TFLOP/s bf16, the same 132 SMs): a clock bracket, so every dtype gets its midpoint
    sxm, capped = gpu_preset("h100-sxm-80g"), gpu_preset("h100-hbm2e-96g")
    midpoint = (989 + 835) / 2 / 989
    for dtype in ("fp32", "tf32", "bf16", "fp16", "fp8"):
        assert capped.peak_tflops(dtype) == pytest.approx(sxm.peak_tflops(dtype) * midpoint, rel=1e-3)
    assert capped.sm_count == sxm.sm_count


@pytest.mark.parametrize("name", LINK_NAMES)
def test_every_link_preset_loads(name):
    link = intra_node_link(name)
    assert 0 < link.bandwidth_GBps <= link.line_rate_GBps


@pytest.mark.parametrize("name", NETWORK_NAMES)
def test_every_network_preset_loads(name):
    net = inter_node_network(name)
    assert 0 < net.nic_bandwidth_GBps <= net.nic_Gbps / 8


def test_unknown_gpu_names_the_field_and_lists_known():
    with pytest.raises(ValueError, match=r"cluster.gpu='h100x' is not a known GPU preset; known: .*h100-sxm-80g"):
        gpu_preset("h100x")


def test_unknown_link_and_network_name_their_field():
    with pytest.raises(ValueError, match="cluster.intra_node='nvlink9'"):
        intra_node_link("nvlink9")
    with pytest.raises(ValueError, match="cluster.inter_node='ib-xdr'"):
        inter_node_network("ib-xdr")


def test_explicit_link_table():
    link = intra_node_link({"bandwidth_GBps": 100.0, "latency_us": 1.5})
    assert link.bandwidth_GBps == 100.0 and link.latency_us == 1.5 and not link.nvls


def test_explicit_network_table_is_per_nic():
    net = inter_node_network({"bandwidth_GBps": 20.0, "latency_us": 2.0, "nics_per_node": 4})
    assert net.nic_bandwidth_GBps == 20.0 and net.nics_per_node == 4


def test_explicit_table_missing_field_is_named():
    with pytest.raises(ValueError, match="lacks latency_us"):
        intra_node_link({"bandwidth_GBps": 100.0})


def test_bad_explicit_value_is_refused():
    with pytest.raises(ValueError, match=r"bandwidth_GBps=-1 must be a positive finite number"):
        inter_node_network({"bandwidth_GBps": -1, "latency_us": 1.0})


def test_a100_refuses_fp8_pricing():
    with pytest.raises(ValueError, match="no fp8 tensor cores"):
        gpu_preset("a100-sxm-80g").peak_tflops("fp8")


def test_gpu_efficiency_above_one_is_refused():
    fields = dict(name="x", arch="hopper", sm_count=132, hbm_bandwidth_GBps=1.0, hbm_capacity_bytes=1, usable_capacity_bytes=1,
                  power_W=1.0, intra_node="nvlink4", inter_node="ib-ndr-8x400", peak_dense_tflops={"fp32": 1.0, "bf16": 2.0, "fp16": 2.0},
                  gemm_efficiency=1.2, hbm_efficiency=0.5, attention_efficiency=0.5, attention_head_dim=128)
    with pytest.raises(ValueError, match=r"gemm_efficiency=1.2 must be a fraction"):
        GpuPreset(**fields)
    with pytest.raises(ValueError, match=r"intra_node='nvlink9' is not a link preset"):
        GpuPreset(**fields | {"gemm_efficiency": 0.8, "intra_node": "nvlink9"})


def test_each_gpu_s_own_board_is_its_generation_s_nvlink_and_its_network_its_reference_system_s():
    assert {name: gpu_preset(name).intra_node for name in GPU_NAMES} == {
        "a100-sxm-40g": "nvlink3", "a100-sxm-80g": "nvlink3", "h100-hbm2e-96g": "nvlink4",
        "h100-sxm-80g": "nvlink4", "h200-141g": "nvlink4",
    }  # fmt: skip
    assert {name: gpu_preset(name).inter_node for name in GPU_NAMES} == {
        "a100-sxm-40g": "ib-hdr-8x200", "a100-sxm-80g": "ib-hdr-8x200",
        "h100-hbm2e-96g": "roce-8x400", "h100-sxm-80g": "ib-ndr-8x400", "h200-141g": "ib-ndr-8x400",
    }  # fmt: skip


def test_peaks_are_read_only():
    with pytest.raises(TypeError):
        gpu_preset("h100-sxm-80g").peak_dense_tflops["bf16"] = 1.0


@pytest.mark.parametrize(
    ("table", "refusal"),
    [
        ({"latency_us": float("nan")}, "cluster.intra_node.latency_us=nan must be a finite number >= 0"),
        ({"latency_us": float("inf")}, "cluster.intra_node.latency_us=inf must be a finite number >= 0"),
        ({"latency_us": True}, "cluster.intra_node.latency_us=True must be a finite number >= 0"),
        ({"latency_us": "fast"}, "cluster.intra_node.latency_us='fast' must be a finite number >= 0"),
        ({"bandwidth_GBps": float("inf")}, "cluster.intra_node.bandwidth_GBps=inf must be a positive finite number"),
        ({"line_rate_GBps": float("nan")}, "cluster.intra_node.line_rate_GBps=nan must be a positive finite number"),
        ({"links": -3}, "cluster.intra_node.links=-3 must be a positive integer"),
        ({"channels": 0.5}, "cluster.intra_node.channels=0.5 must be a positive integer"),
        ({"channels": True}, "cluster.intra_node.channels=True must be a positive integer"),
        ({"nvls": "no"}, "cluster.intra_node.nvls='no' must be a boolean"),
        ({"name": 5}, "cluster.intra_node.name=5 must be a non-empty string"),
        ({"color": "red"}, r"cluster.intra_node: unknown key\(s\) \['color'\]"),
        # finite, and priced to inf or ~0 s: unit slips
        ({"bandwidth_GBps": 1e-320}, r"bandwidth_GBps=1e-320 GB/s is outside \[0.01, 10000\] GB/s"),
        ({"bandwidth_GBps": 9e11, "line_rate_GBps": 9e11},
         r"bandwidth_GBps=900000000000.0 GB/s is outside .* a unit slip\?"),
        ({"latency_us": 3e9}, r"latency_us=3000000000.0 is above 1e\+06 us"),
    ],
)
def test_explicit_link_table_refuses_what_is_not_a_link(table, refusal):
    with pytest.raises(ValueError, match=refusal):
        intra_node_link({"bandwidth_GBps": 100.0, "latency_us": 1.0, **table})


@pytest.mark.parametrize(
    ("table", "refusal"),
    [
        ({"latency_us": float("nan")}, "cluster.inter_node.latency_us=nan must be a finite number >= 0"),
        ({"latency_us": float("inf")}, "cluster.inter_node.latency_us=inf must be a finite number >= 0"),
        ({"bandwidth_GBps": float("inf")}, "cluster.inter_node.bandwidth_GBps=inf must be a positive finite number"),
        ({"nics_per_node": 2.5}, "cluster.inter_node.nics_per_node=2.5 must be a positive integer"),
        ({"nic_Gbps": "400"}, "cluster.inter_node.nic_Gbps='400' must be a positive finite number"),
        # the spec's table calls the per-NIC bandwidth bandwidth_GBps, and so does the message
        ({"bandwidth_GBps": 100.0, "nic_Gbps": 400.0},
         r"cluster.inter_node.bandwidth_GBps\(100.0\) exceeds the line rate nic_Gbps/8 \(50.0\)"),
        ({"nic_bandwidth_GBps": 20.0}, r"cluster.inter_node: unknown key\(s\) \['nic_bandwidth_GBps'\]"),
        ({"bandwidth_GBps": 400e9}, r"cluster.inter_node.bandwidth_GBps=400000000000.0 GB/s is outside"),
    ],
)
def test_explicit_network_table_refuses_what_is_not_a_network(table, refusal):
    with pytest.raises(ValueError, match=refusal):
        inter_node_network({"bandwidth_GBps": 50.0, "latency_us": 1.0, **table})


def test_a_gpu_name_that_is_not_a_string_is_refused_by_name():
    with pytest.raises(ValueError, match=r"cluster.gpu=\['h100-sxm-80g'\] is not a known GPU preset"):
        gpu_preset(["h100-sxm-80g"])


def test_a_real_gpu_is_the_preset_of_its_architecture_sms_and_capacity():
    # what torch reports on the shared H100 (compute capability 9.0, 132 SMs, 79.18 GiB total)
    h100 = gpu_preset("h100-sxm-80g").usable_capacity_bytes
    assert gpu_presets_matching(9, 132, h100) == ["h100-sxm-80g"]
    assert gpu_presets_matching(8, 108, h100) == ["a100-sxm-80g"]  # same capacity, Ampere
    assert gpu_presets_matching(9, 114, h100) == []  # an H100 PCIe: no preset
    assert gpu_presets_matching(9, 132, h100 // 7) == []  # a MIG slice
    assert gpu_presets_matching(12, 132, h100) == []  # an architecture no preset has
    for name in GPU_NAMES:
        preset = gpu_preset(name)
        major = next(m for m, arch in ARCH_OF_COMPUTE_CAPABILITY.items() if arch == preset.arch)
        assert gpu_presets_matching(major, preset.sm_count, preset.usable_capacity_bytes) == [name]
