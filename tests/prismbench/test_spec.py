"""Job-spec loading and validation: every rule refuses with the field name in the message."""

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

from emulator.hardware.presets import GPU_NAMES, LINK_NAMES, NETWORK_NAMES
from prismbench.spec import (
    ClusterSpec,
    JobSpec,
    SpecError,
    job_spec_from_dict,
    load_job_spec,
    moot_model_fields,
)
from workloads.config import ModelSpec
from workloads.job import PRECISIONS, BatchSpec, ParallelSpec, TrainSpec
from workloads.kernels import FRAMEWORKS, KernelsSpec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))


def example_tables() -> dict:
    return tomllib.loads((ROOT / "examples" / "jobspec.example.toml").read_text())


def with_change(section: str, **changes) -> dict:
    tables = example_tables()
    tables[section] = {**tables[section], **changes}
    return tables


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_shipped_example_loads(path):
    job = load_job_spec(path)
    assert job.world_size == job.parallel.tp * job.parallel.pp * job.parallel.cp * job.parallel.dp


def test_example_job_is_llama3_70b_on_8192_gpus():
    job = load_job_spec(ROOT / "examples" / "jobspec.example.toml")
    assert job.model.name == "llama3-70b"
    assert (job.model.layers, job.model.hidden, job.model.kv_heads) == (80, 8192, 8)
    assert job.world_size == 8192
    assert job.num_microbatches == 1024 // 256
    assert job.stage_layers == (20, 20, 20, 20)


def test_the_example_is_the_shared_contract_s_job():
    contract = ROOT.parent / "shared" / "data" / "jobspec.example.toml"
    if not contract.is_file():
        pytest.skip("../shared is not beside this checkout")
    example = load_job_spec(ROOT / "examples" / "jobspec.example.toml")
    assert example.to_dict() == load_job_spec(contract).to_dict()


def test_the_example_names_every_field_a_spec_takes():
    # the README sends readers to the example for the fields: each one must be there, at
    # least as a commented-out line with its choices
    text = (ROOT / "examples" / "jobspec.example.toml").read_text()
    sections = (ModelSpec, ParallelSpec, BatchSpec, TrainSpec, KernelsSpec, ClusterSpec)
    missing = [
        f"{cls.__name__}.{field.name}"
        for cls in sections
        for field in dataclasses.fields(cls)
        if not re.search(rf"\b{field.name}\b", text)
    ]
    assert missing == []
    choices = (*PRECISIONS, *FRAMEWORKS, *GPU_NAMES, *LINK_NAMES, *NETWORK_NAMES)
    assert [choice for choice in choices if f'"{choice}"' not in text] == []


def test_resolved_spec_round_trips_through_dict():
    job = load_job_spec(ROOT / "examples" / "jobspec.example.toml")
    assert job_spec_from_dict(job.to_dict()) == job


def test_explicit_dims_override_the_registry():
    job = job_spec_from_dict(with_change("model", layers=40))
    assert job.model.layers == 40 and job.model.hidden == 8192


def test_explicit_model_without_name():
    tables = example_tables()
    tables["model"] = dict(family="gpt", layers=4, hidden=256, ffn_hidden=1024, heads=8, vocab=1000,
                           max_seq_len=8192)
    job = job_spec_from_dict(tables)
    assert job.model.name == "custom" and job.model.kv_heads == 8 and job.model.positions == "learned"
    # what fit, record and the caches rebuild a job from: no flavor "custom" to look up
    assert job_spec_from_dict(job.to_dict()) == job


@pytest.mark.parametrize(
    ("model", "note"),
    [
        ({"name": "gpt-debug", "rope_theta": 5e5}, "model.rope_theta=500000.0 changes nothing"),
        ({"name": "llama-debug", "max_seq_len": 4096}, "model.max_seq_len=4096 changes nothing"),
        (
            {"family": "llama", "layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4,
             "vocab": 256, "max_seq_len": 8192},
            "only 'learned' positions read it (model.positions='rope')",
        ),
    ],
)  # fmt: skip
def test_a_model_field_its_positions_do_not_read_is_named(model, note):
    job = job_spec_from_dict({"model": model, "batch": {"seq_len": 64, "global_batch": 1}})
    (said,) = moot_model_fields(job.model)
    assert note in said


def test_a_flavor_s_own_or_a_default_value_is_no_note():
    """A resolved spec written out whole (baselines, fit's probes) names every model field."""
    batch = {"seq_len": 64, "global_batch": 1}
    for name in ("gpt-debug", "llama-debug", "llama3-70b"):
        job = job_spec_from_dict({"model": {"name": name}, "batch": batch})
        assert moot_model_fields(job_spec_from_dict(job.to_dict()).model) == []


@pytest.mark.parametrize(
    ("section", "changes", "expected"),
    [
        ("parallel", dict(tp=128, dp=16), "parallel.tp(128) does not divide model.heads(64)"),
        ("parallel", dict(tp=3), "parallel.tp(3) does not divide model.heads(64)"),
        ("batch", dict(global_batch=1000), "batch.global_batch(1000) is not divisible"),
        ("batch", dict(seq_len=0), "batch.seq_len=0 must be a positive integer"),
        ("parallel", dict(pp=128, dp=8), "fewer than pipeline stages"),
        ("parallel", dict(zero=4), "parallel.zero=4"),
        ("parallel", dict(schedule="dualpipe"), "parallel.schedule='dualpipe'"),
        ("parallel", dict(vpp=2), "parallel.vpp(2) > 1 needs an interleaved schedule"),
        ("parallel", dict(tp=16, dp=128), "parallel.tp(16) does not divide model.kv_heads(8)"),
        ("parallel", dict(dp=512), "needs micro-batches per iteration(2) >= pp(4)"),
        ("batch", dict(seq_len=8188), "is not divisible by tp(8)"),
        ("parallel", dict(schedule="interleaved-1f1b"), "needs vpp >= 2"),
        ("train", dict(precision="fp4"), "train.precision='fp4'"),
        ("train", dict(recompute="some"), "train.recompute='some'"),
        ("cluster", dict(gpu="h100x"), "cluster.gpu"),
        ("cluster", dict(gpus_per_node=0), "cluster.gpus_per_node=0"),
        ("model", dict(name="llama9-1t"), "model.name"),
        ("model", dict(kv_heads=7), "model.kv_heads(7) does not divide model.heads(64)"),
    ],
)
def test_broken_rule_names_the_field(section, changes, expected):
    with pytest.raises(SpecError, match=None) as excinfo:
        job_spec_from_dict(with_change(section, **changes))
    assert expected in str(excinfo.value)


def test_tp16_with_40_heads_is_refused():
    tables = with_change("parallel", tp=16, dp=128)
    tables["model"] = {"name": "llama3-70b", "heads": 40, "kv_heads": 8, "hidden": 5120}
    with pytest.raises(SpecError, match=r"parallel\.tp\(16\) does not divide model\.heads\(40\)"):
        job_spec_from_dict(tables)


def test_cp_needs_twice_cp_to_divide_seq_len():
    tables = with_change("parallel", cp=4, dp=64, tp=1, sequence_parallel=False)
    tables["batch"]["seq_len"] = 8196  # divisible by 4, not by 8
    with pytest.raises(SpecError, match=r"batch.seq_len\(8196\) is not divisible by 2\*cp\(8\)"):
        job_spec_from_dict(tables)
    tables["batch"]["seq_len"] = 8200
    assert job_spec_from_dict(tables).parallel.cp == 4


def test_uneven_layers_split_like_llama3():
    tables = with_change("parallel", pp=16, dp=64)
    tables["model"] = {"name": "llama3-70b", "layers": 126}
    assert job_spec_from_dict(tables).stage_layers == (7,) + (8,) * 14 + (7,)


@pytest.mark.parametrize("section", ["model", "parallel", "batch", "train", "cluster"])
def test_unknown_key_is_refused(section):
    with pytest.raises(SpecError, match=rf"{section}: unknown key\(s\) \['typo_key'\]"):
        job_spec_from_dict(with_change(section, typo_key=1))


def test_unknown_section_is_refused():
    tables = example_tables() | {"extras": {}}
    with pytest.raises(SpecError, match=r"^top level: unknown key\(s\) \['extras'\]"):
        job_spec_from_dict(tables)


def test_missing_required_key():
    tables = example_tables()
    del tables["batch"]["seq_len"]
    with pytest.raises(SpecError, match=r"batch: required key\(s\) \['seq_len'\]"):
        job_spec_from_dict(tables)


def test_sequence_parallel_defaults_on_with_tp_and_refused_without():
    tables = example_tables()
    del tables["parallel"]["sequence_parallel"]
    assert job_spec_from_dict(tables).parallel.sequence_parallel is True
    with pytest.raises(SpecError, match="sequence_parallel=true needs tp > 1"):
        job_spec_from_dict(with_change("parallel", tp=1, dp=2048))


def test_fp8_is_refused_on_a100():
    tables = with_change("train", precision="fp8")
    tables["cluster"] = {**tables["cluster"], "gpu": "a100-sxm-80g", "intra_node": "nvlink3",
                         "inter_node": "ib-hdr-8x200"}
    with pytest.raises(SpecError, match="train.precision='fp8' needs fp8 tensor cores"):
        job_spec_from_dict(tables)


def test_where_the_model_is_built_defaults_by_world_size_and_is_refused_when_unknown():
    assert job_spec_from_dict(with_change("parallel", tp=8, dp=256)).builds_on_meta
    one_gpu = with_change("parallel", tp=1, dp=1, pp=1, sequence_parallel=False)
    one_gpu["batch"] = {**one_gpu["batch"], "global_batch": one_gpu["batch"]["micro_batch"]}
    assert not job_spec_from_dict(one_gpu).builds_on_meta
    one_gpu["train"] = {**one_gpu["train"], "model_init": "meta"}
    assert job_spec_from_dict(one_gpu).init_device == "meta"
    with pytest.raises(SpecError, match="train.model_init='cpu' must be one of"):
        job_spec_from_dict(with_change("train", model_init="cpu"))


def test_explicit_link_table_is_accepted():
    job = job_spec_from_dict(with_change("cluster", intra_node={"bandwidth_GBps": 300.0, "latency_us": 1.0}))
    assert job.cluster.intra_node["bandwidth_GBps"] == 300.0


def test_the_intra_node_link_defaults_to_the_gpu_s_own_board_and_is_held_to_it():
    # an A100 job without intra_node was priced on NVLink 4 with NVLink SHARP, Hopper's fabric,
    # and without inter_node on DGX H100's 400 Gb/s NICs
    a100 = {"model": {"name": "gpt-debug"}, "batch": {"seq_len": 32, "global_batch": 1},
            "cluster": {"gpu": "a100-sxm-80g"}}  # fmt: skip
    cluster = job_spec_from_dict(a100).to_dict()["cluster"]
    assert (cluster["intra_node"], cluster["inter_node"]) == ("nvlink3", "ib-hdr-8x200")
    a100["cluster"]["inter_node"] = "ib-ndr-8x400"  # NICs are not on the board: any network
    assert job_spec_from_dict(a100).cluster.inter_node == "ib-ndr-8x400"
    a100["cluster"]["intra_node"] = "nvlink4"
    with pytest.raises(SpecError, match=r"cluster.intra_node='nvlink4' is not the fabric of "
                       r"cluster.gpu='a100-sxm-80g', whose board has 'nvlink3'"):  # fmt: skip
        job_spec_from_dict(a100)
    a100["cluster"]["intra_node"] = {"bandwidth_GBps": 300.0, "latency_us": 1.0, "nvls": True}
    with pytest.raises(SpecError, match=r"cluster.intra_node.nvls=true: NVLink SHARP needs"):
        job_spec_from_dict(a100)
    a100["cluster"]["intra_node"]["nvls"] = False  # any other fabric, as a table
    assert job_spec_from_dict(a100).cluster.intra_node["bandwidth_GBps"] == 300.0
    a100["cluster"] = {"gpu": "h100-sxm-80g"}
    assert job_spec_from_dict(a100).cluster.intra_node == "nvlink4"


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        load_job_spec(tmp_path / "absent.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\nname = 1")
    with pytest.raises(SpecError, match="invalid TOML"):
        load_job_spec(bad)


def test_job_spec_is_frozen():
    job = load_job_spec(ROOT / "examples" / "jobspec.example.toml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.parallel.tp = 4  # type: ignore[misc]
    assert isinstance(job, JobSpec)


def test_nccl_channels_must_leave_the_gpu_some_sms():
    # each NCCL channel runs one CUDA block on an SM: an H100 SXM has 132
    link = {"bandwidth_GBps": 100.0, "latency_us": 1.0, "channels": 132}
    with pytest.raises(SpecError, match=r"cluster.intra_node.channels=132 must be below the 132 SMs "
                                        r"of cluster.gpu='h100-sxm-80g'"):
        job_spec_from_dict(with_change("cluster", intra_node=link))
    link["channels"] = 131
    assert job_spec_from_dict(with_change("cluster", intra_node=link)).cluster.intra_node == link


@pytest.mark.parametrize("gpu", [["h100-sxm-80g"], 100])
def test_a_gpu_that_is_not_a_name_is_refused(gpu):
    with pytest.raises(SpecError, match=r"cluster.gpu=.* is not a known GPU preset"):
        job_spec_from_dict(with_change("cluster", gpu=gpu))


PARAMETERS = "fp32 bytes of the model's parameters"


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        ({"model": {"name": "llama-debug", "vocab": 2**62}}, PARAMETERS),
        ({"model": {"name": "gpt-debug", "max_seq_len": 2**62}}, PARAMETERS),
        ({"kernels": {"vocab_multiple": 2**62}}, PARAMETERS),
        ({"batch": {"seq_len": 2**28, "global_batch": 1}}, "FLOPs of .* attention backward"),
        ({"batch": {"seq_len": 64, "global_batch": 2**62}}, "int64 bytes of a rank's token ids"),
    ],
)
def test_a_tensor_or_op_beyond_int64_is_refused_before_the_capture(change, refused):
    # each ran into torch's "Storage size calculation overflowed" or an OverflowError in the
    # capture's FLOP column: a traceback from deep inside `emulate`, exit 1
    spec = {"model": {"name": "llama-debug"}, "batch": {"seq_len": 64, "global_batch": 8}} | change
    with pytest.raises(SpecError, match=rf"{refused} would be .*, beyond 2\*\*63 - 1"):
        job_spec_from_dict(spec)


def test_a_long_sequence_whose_ops_fit_int64_is_kept():
    # 2**26 tokens (emulated: 69 705 s an iteration, out of memory): its attention backward
    # counts 10 * 2**26 * 2**26 * 64 FLOPs, below 2**63
    spec = {"model": {"name": "llama-debug"}, "batch": {"seq_len": 2**26, "global_batch": 1}}
    assert job_spec_from_dict(spec).batch.seq_len == 2**26


def test_a_world_beyond_the_emulators_ranks_is_refused_naming_the_degrees():
    # dp = 10**9 ran explain out of memory (a numpy traceback, exit 1); 2**20 ranks emulate
    def job(dp: int) -> dict:
        return {"model": {"name": "gpt-debug"}, "parallel": {"tp": 2, "dp": dp},
                "batch": {"seq_len": 64, "global_batch": dp}}  # fmt: skip

    with pytest.raises(SpecError, match=r"parallel.tp\(2\) \* pp\(1\) \* cp\(1\) \* dp\(524289\) "
                                        r"= 1,048,578 GPUs is more than the 1,048,576"):  # fmt: skip
        job_spec_from_dict(job(2**19 + 1))
    assert job_spec_from_dict(job(2**19)).world_size == 2**20
