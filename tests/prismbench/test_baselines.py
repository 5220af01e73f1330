"""Baselines: every shipped file loads, the generator reproduces them, hand-checked rows map right."""

import functools
import importlib.util
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

from prismbench.baselines import (
    BaselineError,
    Measured,
    baseline_from_dict,
    baseline_to_toml,
    load_baseline,
    load_baselines,
)
from prismbench.spec import job_spec_from_dict

ROOT = Path(__file__).resolve().parents[2]
BASELINES = ROOT / "results" / "baselines"
SHIPPED = sorted(BASELINES.glob("*.toml"))


@functools.cache
def _generator():
    spec = importlib.util.spec_from_file_location("make_baselines", BASELINES / "make_baselines.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script loads
    spec.loader.exec_module(module)
    return module


def _tables(name: str) -> dict:
    return tomllib.loads((BASELINES / f"{name}.toml").read_text())


def test_baselines_are_shipped():
    assert len(SHIPPED) > 100


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_baseline_loads_and_round_trips(path):
    baseline = load_baseline(path)
    assert baseline.name == path.stem
    assert f"__{baseline.job.world_size}g__r{baseline.provenance.csv_row:03d}" in path.stem
    assert job_spec_from_dict(baseline.to_dict()["job"]) == baseline.job
    assert baseline_from_dict(path.stem, tomllib.loads(baseline_to_toml(baseline))) == baseline


def test_load_baselines_reads_the_directory_sorted():
    baselines = load_baselines(BASELINES)
    assert [b.name for b in baselines] == [p.stem for p in SHIPPED]


def test_generator_is_deterministic(tmp_path):
    readme = tmp_path / "README.md"
    shutil.copy(BASELINES / "README.md", readme)
    _generator().write(tmp_path / "out", readme)
    written = sorted((tmp_path / "out").glob("*.toml"))
    assert [p.name for p in written] == [p.name for p in SHIPPED]
    assert all(p.read_bytes() == (BASELINES / p.name).read_bytes() for p in written)
    assert readme.read_bytes() == (BASELINES / "README.md").read_bytes()


def test_narayanan_529b_row_maps_to_interleaved_job():
    b = load_baseline(BASELINES / "narayanan2021__megatron-gpt-529.6b__2520g__r010.toml")
    p, job = b.job.parallel, b.job
    assert job.model.name == "megatron-gpt-529.6b" and job.model.vocab == 51200
    assert (p.tp, p.pp, p.dp, p.cp, p.vpp, p.schedule) == (8, 35, 9, 1, 3, "interleaved-1f1b")
    assert (p.zero, p.sequence_parallel) == (0, False)
    assert (job.batch.seq_len, job.batch.micro_batch, job.batch.global_batch) == (2048, 1, 2520)
    assert (job.train.precision, job.train.recompute) == ("fp16", "full")
    assert (job.cluster.gpu, job.cluster.intra_node, job.cluster.inter_node) == (
        "a100-sxm-80g", "nvlink3", "ib-hdr-8x200")  # fmt: skip
    assert b.measured == Measured(tflops_per_gpu=163.0, tflops_kind="hardware", mfu=0.52,
                                  mfu_kind="hardware")  # fmt: skip
    assert dict(b.provenance.derived) == {}


def test_megatron_readme_gpt3_175b_row_keeps_its_stated_figures():
    b = load_baseline(BASELINES / "megatron-readme2022__megatron-gpt-175b__1024g__r012.toml")
    p = b.job.parallel
    assert (p.tp, p.pp, p.dp, p.vpp, p.schedule, p.sequence_parallel) == (
        8,
        16,
        8,
        1,
        "1f1b",
        False,
    )
    assert b.job.num_microbatches == 1536 // 8
    assert (b.measured.iteration_time_s, b.measured.tflops_per_gpu, b.measured.mfu) == (
        32.0,
        138.0,
        0.44,
    )
    assert b.provenance.approximate
    assert any(a.startswith("model.vocab") for a in b.provenance.assumptions)


def test_torchtitan_fsdp_row_maps_to_fsdp_job_with_allocator_memory():
    b = load_baseline(BASELINES / "torchtitan2024__llama3.1-8b__8g__r033.toml")
    job = b.job
    assert job.model.name == "llama3.1-8b" and job.model.kv_heads == 8
    assert (job.parallel.dp, job.parallel.tp, job.parallel.zero) == (8, 1, 3)
    assert (job.batch.seq_len, job.batch.micro_batch, job.batch.global_batch) == (8192, 2, 16)
    assert (job.train.precision, job.train.recompute) == ("bf16", "selective")
    assert (job.cluster.gpu, job.cluster.inter_node) == ("h100-hbm2e-96g", "roce-8x400")
    assert b.measured.tokens_per_s_per_gpu == 5762.0
    assert b.measured.peak_mem_bytes == round(82.4 * 2**30)
    assert b.measured.peak_mem_kind == "allocator_reserved"


def test_korthikanti_selective_row_turns_sequence_parallelism_on():
    b = load_baseline(BASELINES / "korthikanti2022__megatron-gpt-175b__64g__r016.toml")
    full = load_baseline(BASELINES / "korthikanti2022__megatron-gpt-175b__64g__r015.toml")
    assert (b.job.parallel.sequence_parallel, b.job.train.recompute) == (True, "selective")
    assert (full.job.parallel.sequence_parallel, full.job.train.recompute) == (False, "full")
    assert (b.measured.iteration_time_s, b.measured.mfu_kind) == (13.75, "model")


def test_derived_iteration_time_is_marked_and_equals_the_arithmetic():
    b = load_baseline(BASELINES / "llmfoundry__mpt-30b__8g__r062.toml")
    assert b.measured.iteration_time_s == 168 * 8192 / (1384 * 8)
    assert "168*8192 / (1384*8)" in b.provenance.derived["iteration_time_s"]


def test_stated_iteration_time_is_not_marked_derived():
    b = load_baseline(BASELINES / "korthikanti2022__megatron-gpt-22b__8g__r013.toml")
    assert b.measured.iteration_time_s == 1.42 and "iteration_time_s" not in b.provenance.derived


@pytest.mark.parametrize(
    ("table", "key"),
    [("measured", "iteration_time"), ("provenance", "url"), ("job", "extra"), (None, "expected")],
)
def test_unknown_key_is_refused(table, key):
    tables = _tables("llmc__gpt2-124m__8g__r228")
    (tables[table] if table else tables)[key] = 1
    with pytest.raises(BaselineError, match=key):
        baseline_from_dict("x", tables)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"mfu": 44.0, "mfu_kind": "model"}, "mfu=44.0 must be a fraction"),
        ({"tflops_per_gpu": 138.0}, "tflops_kind=None must be one of"),
        (
            {"peak_mem_bytes": 1.5, "peak_mem_kind": "nvidia_smi"},
            "peak_mem_bytes=1.5 must be a positive integer",
        ),
        ({"iteration_time_s": -1.0}, "iteration_time_s=-1.0 must be a positive number"),
        ({"iteration_time_s": None, "mfu_kind": "model"}, "no figure given"),
        ({"device": "tpu"}, "measured.device='tpu' must be one of"),
        (
            {"peak_mem_bytes": 2**30, "peak_mem_kind": "cpu_max_rss"},
            "cpu_max_rss is a CPU run's figure.*add device = \"cpu\"",
        ),
        (
            {"peak_mem_bytes": 2**30, "peak_mem_kind": "nvidia_smi", "device": "cpu"},
            "the others a GPU's",
        ),
        (
            {"first_iteration_peak_memory_reserved_bytes": 2.5e9},
            "first_iteration_peak_memory_reserved_bytes=2500000000.0 must be a positive integer",
        ),
        (
            {"peak_memory_allocated_bytes": 2**30, "device": "cpu"},
            "peak_memory_allocated_bytes with measured.device='cpu': the caching allocator's",
        ),
        (  # validate would score the one figure twice
            {"peak_mem_bytes": 2**30, "peak_mem_kind": "allocator_allocated",
             "peak_memory_allocated_bytes": 2**30},
            "peak_memory_allocated_bytes and measured.peak_mem_bytes with "
            "peak_mem_kind='allocator_allocated' give one figure twice",
        ),  # fmt: skip
    ],
)
def test_measured_rules_name_the_field(changes, message):
    tables = _tables("llmc__gpt2-124m__8g__r228")
    measured = {**tables["measured"], **changes}
    tables["measured"] = {k: v for k, v in measured.items() if v is not None}
    with pytest.raises(BaselineError, match=message):
        baseline_from_dict("x", tables)


def test_derived_field_must_be_given():
    tables = _tables("llmc__gpt2-124m__8g__r228")
    tables["provenance"]["derived"] = {"tokens_per_s_per_gpu": "made up"}
    with pytest.raises(BaselineError, match="tokens_per_s_per_gpu"):
        baseline_from_dict("x", tables)


@pytest.mark.parametrize("assumptions", ["model.vocab assumed", {"vocab": "assumed"}, ""])
def test_assumptions_that_are_not_a_list_are_refused(assumptions):
    # a string passed as its characters, a table as its keys: written back out, "model.vocab
    # assumed" became ["m", "o", "d", ...]
    tables = _tables("llmc__gpt2-124m__8g__r228")
    tables["provenance"]["assumptions"] = assumptions
    with pytest.raises(BaselineError, match=r"provenance.assumptions=.* must be a list of"):
        baseline_from_dict("x", tables)
    tables["provenance"]["assumptions"] = ["model.vocab assumed"]
    assert baseline_from_dict("x", tables).provenance.assumptions == ("model.vocab assumed",)


def test_invalid_job_names_the_job_field(tmp_path):
    path = tmp_path / "bad.toml"
    text = (BASELINES / "llmc__gpt2-124m__8g__r228.toml").read_text()
    path.write_text(text.replace("tp = 1\n", "tp = 5\n", 1))
    with pytest.raises(BaselineError, match=r"bad\.toml.*job: parallel\.tp\(5\) does not divide"):
        load_baseline(path)


def test_a_file_that_is_not_utf8_text_is_refused_naming_it(tmp_path):
    # validate reads every *.toml of --baselines: a stray binary one was a UnicodeDecodeError's
    # traceback
    path = tmp_path / "binary.toml"
    path.write_bytes(b"\xff\xfe[job]\n")
    with pytest.raises(BaselineError, match=r"binary\.toml.*not UTF-8 text"):
        load_baseline(path)


def test_torchtitan_rows_say_torch_compile_and_async_tp_as_their_notes_do():
    made = {b.provenance.csv_row: b for b in load_baselines(BASELINES)}
    eager, compiled, async_tp = made[33].job.kernels, made[34].job.kernels, made[44].job.kernels
    assert (eager.compile, eager.async_tp) == (False, False)  # "Table 1: FSDP"
    assert (compiled.compile, compiled.async_tp) == (True, False)  # "FSDP + torch.compile"
    assert compiled.fp8_casts == "fused"  # "+ Float8": compiled, torchao's casts fuse
    assert (async_tp.compile, async_tp.async_tp) == (True, True)  # "2D + AsyncTP ..."
    assert made[44].job.parallel.sequence_parallel


def test_megatron_rows_run_unfused_attention_with_dropout_and_their_ddp_as_their_scripts_say():
    megatron = [
        b
        for b in load_baselines(BASELINES)
        if b.name.split("__")[0]
        in ("narayanan2021", "korthikanti2022", "megatron-readme2022", "bigscience")
    ]
    assert len(megatron) == 22
    for b in megatron:
        assert (b.job.kernels.attention, b.job.train.attention_dropout) == ("unfused", 0.1)
        # run_table_1.sh: --DDP-impl torch (overlapped) for 1.7B-18B, local for the rest
        torch_ddp = "DDP impl=torch" in b.provenance.notes
        assert b.job.kernels.grad_reduce == ("overlapped" if torch_ddp else "after-backward")
        # fp16 runs keep fp16 gradients (no --accumulate-allreduce-grads-in-fp32); BLOOM is bf16
        fp16 = b.job.train.precision == "fp16"
        assert b.job.kernels.grad_accumulation == ("model-dtype" if fp16 else "fp32")
    assert sum(b.job.train.precision == "fp16" for b in megatron) == 20
    # Megatron-LM's async input-gradient all-reduce came in 2022: not in Narayanan's code of
    # 2021 nor in BLOOM's Megatron-DeepSpeed fork
    overlapped = {b.name.split("__")[0] for b in megatron if b.job.kernels.tp_grad_overlap}
    assert overlapped == {"korthikanti2022", "megatron-readme2022"}
    assert sum("DDP impl=torch" in b.provenance.notes for b in megatron) == 4
    # only BLOOM's launch script set CUDA_LAUNCH_BLOCKING=1
    blocking = {
        b.name.split("__")[0] for b in load_baselines(BASELINES) if b.job.kernels.launch_blocking
    }
    assert blocking == {"bigscience"}


def test_llm_foundry_rows_run_learned_positions_and_triton_attention_as_their_runs_did():
    import re

    from workloads.flavors import parameter_count

    mpt = [b for b in load_baselines(BASELINES) if b.name.startswith("llmfoundry__")]
    assert len(mpt) == 92
    for b in mpt:
        model = b.job.model
        assert (model.positions, model.max_seq_len) == ("learned", b.job.batch.seq_len)
        assert b.job.kernels.attention == "triton"
        # the published parameter count is this model's, position table included
        assert parameter_count(model) == int(re.search(r"NumParams=(\d+)", b.provenance.notes)[1])


def test_a_stated_parameter_count_the_spec_does_not_build_stops_the_generator():
    gen = _generator()
    model = load_baselines(BASELINES)[0].job.model
    row = {"source": "x", "model": "m", "seq_len": "2048", "notes": "NumParams=12345"}
    with pytest.raises(SystemExit, match="NumParams=12345 but the spec's model has"):
        gen.check_parameter_count(model, row)


def test_rows_the_spec_cannot_say_are_refused_with_reasons():
    made, refused = _generator().convert_all(BASELINES / "published_baselines.csv")
    reasons = {line: [key for key, _ in why] for line, _, why in refused}
    assert reasons[22][:2] == ["zero_stage not stated", "micro_batch not stated"]
    # every torchtitan row is expressible: the pipelined ones take torchtitan's own batch split
    assert not [line for line, row, _ in refused if row["source"].startswith("pytorch/torchtitan")]
    # BLOOM's ramp-up row (one micro-batch on 12 stages) runs Megatron's 1F1B, as it did
    assert 163 not in reasons
    assert any(b.name.endswith("__r163") for b in made)
    assert len(made) + len(refused) == 230 and len(made) == len(SHIPPED)


def test_torchtitan_pipelined_rows_take_the_batch_split_torchtitan_makes_when_unset():
    # Table 5: local batch 32 in pp = 8 micro-batches; the interleaved run, 2 stages per rank
    one_f_one_b = load_baseline(BASELINES / "torchtitan2024__llama3.1-405b__512g__r045.toml")
    interleaved = load_baseline(BASELINES / "torchtitan2024__llama3.1-405b__512g__r046.toml")
    for b in (one_f_one_b, interleaved):
        assert (b.job.batch.micro_batch, b.job.batch.global_batch) == (4, 256)
        assert b.job.num_microbatches == 8
    assert (one_f_one_b.job.parallel.vpp, interleaved.job.parallel.vpp) == (1, 2)
    assert interleaved.job.parallel.schedule == "interleaved-1f1b"
    # Table 6 (FSDP 4, CP 2): local batch 8, one sequence a micro-batch, global = 8 x FSDP
    cp2 = load_baseline(BASELINES / "torchtitan2024__llama3.1-405b__512g__r048.toml")
    assert (cp2.job.parallel.dp, cp2.job.parallel.cp) == (4, 2)
    assert (cp2.job.batch.micro_batch, cp2.job.batch.global_batch) == (1, 32)
    assert any("9dec370" in a and "32 / 8" in a for a in one_f_one_b.provenance.assumptions)


def test_torchtitan_generated_split_is_checked_against_the_spec_split():
    gen = _generator()
    # torchtitan gives the remainder to the middle stages from the second on
    assert gen.torchtitan_stage_layers(126, 16) == (7,) + (8,) * 14 + (7,)
    assert gen.torchtitan_stage_layers(10, 4) == (2, 3, 3, 2)
    assert gen.torchtitan_stage_layers(13, 4) == (3, 4, 3, 3)
    row = {"notes": "local batch 8", "pp": "4", "dp": "2", "layers": "13", "vpp": "",
           "micro_batch": "", "global_batch": ""}  # fmt: skip
    # the spec splits 13 layers 3, 3, 4, 3: another program, so nothing is filled (refused)
    assert gen.stage_layer_counts(13, 4) == (3, 3, 4, 3)
    assert gen.torchtitan_unstated(row) == ({}, [])
    filled, why = gen.torchtitan_unstated(row | {"layers": "10"})
    assert filled == {"micro_batch": "2", "global_batch": "16"} and len(why) == 3


RECORDED = BASELINES / "recorded"
SHARED_GPU = ROOT.parent / "shared" / "data" / "gpu"


def _recorded_generator():
    spec = importlib.util.spec_from_file_location("make_recorded", BASELINES / "make_recorded.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(
    not (SHARED_GPU / "h100-sxm-80g").is_dir() or not (SHARED_GPU / "h200-141g").is_dir(),
    reason="../shared/data/gpu/{h100-sxm-80g,h200-141g} are not beside the repo",
)
def test_recorded_baselines_are_what_the_generator_writes(tmp_path):
    generator = _recorded_generator()
    (tmp_path / "h100frameworks__kept.toml").write_text("")  # a `record` run: not the generator's
    generator.write(tmp_path, SHARED_GPU)
    written = sorted(p for p in tmp_path.glob("*.toml") if p.name != "h100frameworks__kept.toml")
    committed = sorted(p for prefix in generator.MACHINES for p in RECORDED.glob(f"{prefix}__*.toml"))
    assert [p.name for p in written] == [p.name for p in committed]
    assert all(p.read_bytes() == (RECORDED / p.name).read_bytes() for p in written)
    assert (tmp_path / "h100frameworks__kept.toml").exists()


def test_recorded_baselines_load_with_their_spread_and_provenance():
    baselines = {b.name: b for b in load_baselines(RECORDED)}
    shared = [name for name in baselines if name.split("__")[0] in ("h100shared", "h200shared")]
    assert len(shared) == 16  # the eight shared jobs on the H100 and on the H200
    for gpu in ("h100", "h200"):
        b = baselines[f"{gpu}shared__gpt3-125m-s2048-mb8-none"]
        assert b.provenance.kind == "recorded" and b.provenance.commit == "86a4f47"
        assert gpu.upper() in b.provenance.machine and b.job.cluster.gpu.startswith(gpu)
        assert b.measured.iterations == 8 and b.measured.peak_mem_kind == "allocator_reserved"
        assert 0 < b.measured.iteration_time_relative_spread < 0.01
        assert baseline_from_dict(b.name, tomllib.loads(baseline_to_toml(b))) == b


def test_recorded_provenance_and_spread_are_checked():
    tables = tomllib.loads((RECORDED / "h100shared__gpt3-125m-s2048-mb8-none.toml").read_text())
    no_machine = tables | {"provenance": tables["provenance"] | {"machine": ""}}
    with pytest.raises(
        BaselineError, match="provenance.machine must be a non-empty string for a recorded"
    ):
        baseline_from_dict("x", no_machine)
    half_spread = tables | {
        "measured": {k: v for k, v in tables["measured"].items() if k != "iterations"}
    }
    with pytest.raises(BaselineError, match="go together"):
        baseline_from_dict("x", half_spread)
    inverted = tables | {"measured": tables["measured"] | {"iteration_time_s_min": 1.0}}
    with pytest.raises(BaselineError, match="iteration_time_s_min <= iteration_time_s"):
        baseline_from_dict("x", inverted)


@pytest.mark.parametrize(
    ("recorded", "field", "value"),
    [(True, "csv_row", 5), (True, "approximate", True), (False, "machine", "a GPU box"),
     (False, "commit", "abc1234")],
)  # fmt: skip
def test_a_provenance_field_of_the_other_kind_is_refused(recorded, field, value):
    # it loaded, and writing the baseline back out dropped it: read by nothing
    if recorded:
        tables = tomllib.loads((RECORDED / "h100shared__gpt3-125m-s2048-mb8-none.toml").read_text())
    else:
        tables = _tables("llmc__gpt2-124m__8g__r228")
    tables["provenance"][field] = value
    kind = "recorded" if recorded else "published"
    with pytest.raises(BaselineError, match=rf"\['{field}'\] are not fields of a {kind} baseline"):
        baseline_from_dict("x", tables)


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_recorded_production_kernel_runs_name_their_framework_and_machine(gpu):
    """The eight shared jobs run again with their families' production kernels
    (results/calibration/reprofile_gpu.py) on an H100 (2026-11-28) and on an H200 (2026-11-30):
    `record`'s own files, kept as written."""
    runs = [b for b in load_baselines(RECORDED) if b.name.startswith(f"{gpu}frameworks__")]
    assert len(runs) == 8
    frameworks = {b.job.model.name.split("-")[0]: b.job.kernels.framework for b in runs}
    assert frameworks == {"gpt2": "nemo", "gpt3": "nemo", "llama2": "torchtitan",
                          "llama3": "torchtitan", "mpt": "llm-foundry"}  # fmt: skip
    for b in runs:
        assert b.provenance.kind == "recorded" and b.provenance.source == "prismbench record"
        assert gpu.upper() in b.provenance.notes and b.job.cluster.gpu.startswith(gpu)
        assert b.measured.iterations == 5 and b.measured.peak_mem_kind == "allocator_reserved"


def _peaks_script():
    spec = importlib.util.spec_from_file_location("peaks_from_notes", BASELINES / "peaks_from_notes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recorded_baselines_hold_every_allocator_peak_their_notes_give():
    """The `*frameworks__` recordings (record at 6a9c814) had the peaks in their notes only."""
    _peaks_script().main(["--check"])
    mpt = load_baseline(RECORDED / "h200frameworks__mpt-7b-l4-s2048-mb4-none.toml").measured
    assert mpt.first_iteration_peak_memory_allocated_bytes == 22329433600


def test_peaks_from_notes_adds_the_three_peaks_and_keeps_the_rest(tmp_path):
    script = _peaks_script()
    recorded = (RECORDED / "h100frameworks__gpt3-125m-s2048-mb8-none.toml").read_text()
    lines = [line for line in recorded.splitlines(keepends=True)
             if not line.startswith(("peak_memory_allocated_bytes", "first_iteration_peak"))]  # fmt: skip
    old = tmp_path / "old.toml"
    old.write_text("".join(lines))
    assert load_baseline(old).measured.peak_memory_allocated_bytes is None
    assert script.with_peaks(old) == recorded
    old.write_text("".join(lines).replace("peak_mem_bytes = 21267218432", "peak_mem_bytes = 21267218433"))
    with pytest.raises(SystemExit, match="is not its peak_mem_bytes 21267218433"):
        script.with_peaks(old)
