"""`prismbench emulate` end to end on small jobs: the JSON contract, the trace file, OOM."""

import json

import pytest

from emulator.graph.results import BREAKDOWN_FIELDS
from prismbench.cli import main
from prismbench.emulate import RESULT_SCHEMA_VERSION, emulate, job_title
from prismbench.spec import SpecError, job_spec_from_dict

CONTRACT_KEYS = {
    "iteration_time_s",
    "tokens_per_s",
    "tflops_per_gpu",
    "mfu",
    "peak_memory_allocated_bytes",
    "peak_memory_reserved_bytes",
    "per_class",
    "breakdown",
    "world_size",
    "ranks_executed",
    "wall_s",
    "oom",
}


def write_job(tmp_path, parallel: dict, model: str = "llama-debug") -> str:
    lines = [f'[model]\nname = "{model}"', "[parallel]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in parallel.items()]
    lines += ["[batch]\nseq_len = 64\nglobal_batch = 8", '[train]\nprecision = "bf16"']
    path = tmp_path / "job.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_the_title_names_the_model_once_when_the_job_is_named_after_it():
    assert job_title("llama2-7b", "llama2-7b") == "llama2-7b"  # was "llama2-7b (llama2-7b)"
    assert job_title("run3", "llama2-7b") == "run3 (llama2-7b)"


@pytest.mark.integration
def test_emulate_json_holds_the_design_contract(tmp_path, capsys):
    job = write_job(tmp_path, {"tp": 2, "pp": 2, "dp": 2, "zero": 1})
    assert main(["emulate", job, "--json", "--workers", "1"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert CONTRACT_KEYS <= set(result)
    assert result["schema_version"] == RESULT_SCHEMA_VERSION
    assert result["world_size"] == 8 and result["ranks_executed"] == 2
    assert len(result["per_class"]) == 2
    assert set(result["breakdown"]) >= {"compute_s", "exposed_comm_s", "bubble_s"}
    assert result["iteration_time_s"] > 0 and 0 < result["mfu"] < 1
    assert result["tokens_per_s"] == pytest.approx(8 * 64 / result["iteration_time_s"])
    assert result["peak_memory_reserved_bytes"] >= result["peak_memory_allocated_bytes"] > 0
    assert result["oom"] is False
    for c in result["per_class"]:  # the total counts the first and the last steady iteration too
        retries = c["first_iteration_alloc_retries"] + c["steady_alloc_retries"]
        assert c["alloc_retries"] >= retries
    assert "capture" in err  # progress goes to stderr, the JSON alone to stdout


@pytest.fixture(scope="module")
def pipelined():
    """A debug Llama in two pipeline stages over two replicas, emulated once for the module."""
    job = job_spec_from_dict(
        {
            "model": {"name": "llama-debug"},
            "parallel": {"pp": 2, "dp": 2},
            "batch": {"seq_len": 64, "global_batch": 8},
        }
    )
    return emulate(job, workers=1)


@pytest.mark.integration
def test_each_class_has_the_job_figures_for_one_of_its_gpus(pipelined):
    result = pipelined
    first, last = result.per_class
    for c in result.per_class:  # every class ends with the step
        assert (c.iteration_time_s, c.tokens_per_s) == (result.iteration_time_s, result.tokens_per_s)
        assert c.mfu == pytest.approx(c.tflops_per_gpu / result.peak_tflops)
        assert c.hardware_tflops_per_gpu == pytest.approx(
            c.hardware_flops / c.iteration_time_s / 1e12
        )
    assert last.tflops_per_gpu > first.tflops_per_gpu  # the same layers, and the logits
    assert (first.tflops_per_gpu + last.tflops_per_gpu) / 2 == pytest.approx(result.tflops_per_gpu)
    assert (first.mfu + last.mfu) / 2 == pytest.approx(result.mfu)


@pytest.mark.integration
def test_the_job_figures_are_the_old_ones_to_the_bit_on_any_world():
    """The job's TFLOP/s and MFU as they were before per-class figures, on a world whose
    pipeline ranks hold 3 GPUs each (a mean of per-stage quotients differs in the last bit)."""
    from prismbench.explain import explain

    job = job_spec_from_dict(
        {
            "model": {"name": "llama-debug"},
            "parallel": {"pp": 4, "dp": 3},
            "batch": {"seq_len": 64, "global_batch": 12},
        }
    )
    result = emulate(job, workers=1)
    model_flops = explain(job).flops.model_flops_per_iteration
    tflops = model_flops / result.iteration_time_s / job.world_size / 1e12
    assert (result.tflops_per_gpu, result.mfu) == (tflops, tflops / result.peak_tflops)


@pytest.mark.integration
def test_a_rank_of_several_built_on_the_device_keeps_its_fp32_build_cached():
    """`train.model_init = "device"`: the whole fp32 model built on the GPU, then cast and
    sharded, leaves its freed segments cached; the iteration's live bytes do not change."""

    def emulated(model_init):
        tables = {
            "model": {"name": "llama-debug"},
            "parallel": {"tp": 2},
            "batch": {"seq_len": 64, "global_batch": 2},
            "train": {"model_init": model_init},
        }
        return emulate(job_spec_from_dict(tables), workers=1)

    on_meta, on_device = emulated("auto"), emulated("device")
    assert (on_meta.model_built_on, on_device.model_built_on) == ("meta", "device")
    assert on_device.peak_memory_allocated_bytes == on_meta.peak_memory_allocated_bytes
    assert on_device.peak_memory_reserved_bytes > on_meta.peak_memory_reserved_bytes
    assert on_device.to_dict()["model_built_on"] == "device"


@pytest.mark.integration
def test_breakdown_of_each_class_sums_to_the_iteration(pipelined):
    result = pipelined
    for c in result.per_class:
        total = sum(getattr(c, name) for name in BREAKDOWN_FIELDS)
        assert total == pytest.approx(result.iteration_time_s, rel=1e-9)
        assert c.host_wait_s > 0  # a debug model's tiny kernels wait for their launches
    assert max(c.bubble_s for c in result.per_class) > 0  # a pipeline of 2 stages has a bubble


@pytest.mark.integration
def test_trace_file_has_a_process_per_rank(tmp_path, capsys):
    job = write_job(tmp_path, {"pp": 2, "dp": 2})
    trace = tmp_path / "timeline.json"
    assert main(["emulate", job, "--trace", str(trace), "--ranks", "0,1,3", "--workers", "1"]) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["pid"] for e in events if e.get("ph") == "X"} == {0, 1, 3}


@pytest.mark.integration
def test_trace_into_a_directory_not_yet_made_makes_it(tmp_path):
    # as --memory-out does: the up-front check lets a missing parent through, so the write
    # must make it rather than fail after the whole run
    job = write_job(tmp_path, {"dp": 2})
    trace = tmp_path / "new" / "sub" / "timeline.json"
    assert main(["emulate", job, "--trace", str(trace), "--workers", "1"]) == 0
    assert json.loads(trace.read_text())["traceEvents"]
    assert [p.name for p in trace.parent.iterdir()] == ["timeline.json"]  # no temporary left


def test_a_rank_outside_the_world_is_refused(tmp_path, capsys):
    job = write_job(tmp_path, {"pp": 2, "dp": 2})
    assert main(["emulate", job, "--trace", str(tmp_path / "t.json"), "--ranks", "0,9"]) == 2
    assert "--ranks: rank 9 is outside the world [0, 4)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--ranks", "1"], "give --trace FILE too"),  # would be ignored: no timeline is written
        (["--ranks", "", "--trace", "t.json"], "must be comma-separated integers"),
        (["--ranks", "1,1", "--trace", "t.json"], "rank(s) [1] given more than once"),
    ],
)
def test_ranks_that_would_be_ignored_or_doubled_are_refused(tmp_path, capsys, extra, needle):
    job = write_job(tmp_path, {"pp": 2, "dp": 2})
    extra = [str(tmp_path / a) if a == "t.json" else a for a in extra]
    assert main(["emulate", job, *extra]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()


@pytest.mark.integration
@pytest.mark.parametrize(("model", "oom"), [("gpt3-125m", False), ("gpt3-6.7b", True)])
def test_oom_is_an_answer_not_a_crash(tmp_path, model, oom):
    # one A100 40 GB, DDP-style zero=0: 6.7 B params need ~18 B/param of model state
    # (bf16 weights, fp32 main grads, fp32 master + two Adam moments), far above 40 GiB
    job = job_spec_from_dict(
        {
            "model": {"name": model},
            "batch": {"seq_len": 256, "global_batch": 1},
            "cluster": {
                "gpu": "a100-sxm-40g",
                "intra_node": "nvlink3",
                "inter_node": "ib-hdr-8x200",
            },
        }
    )
    result = emulate(job, workers=1)
    assert result.oom is oom
    assert result.per_class[0].oom is oom
    assert result.iteration_time_s > 0  # the timing is given either way
    if oom:
        where = result.per_class[0].oom_detail["at"]
        assert where["phase"] and where["module"] is not None


def test_a_job_running_triton_attention_is_priced_by_its_rates_and_slower(monkeypatch):
    from prismbench import emulate as emulate_module
    from prismbench.emulate import attention_rates_for, cost_context

    # one layer of head dim 128 at 2k tokens: attention is a sizeable part of its kernels
    model = {"family": "gpt", "layers": 1, "hidden": 512, "ffn_hidden": 2048, "heads": 4,
             "vocab": 256, "max_seq_len": 2048}  # fmt: skip
    tables = {
        "model": model,
        "batch": {"seq_len": 2048, "global_batch": 1},
        "cluster": {"gpu": "a100-sxm-80g", "intra_node": "nvlink3", "inter_node": "ib-hdr-8x200"},
    }
    flash = job_spec_from_dict(tables)
    triton = job_spec_from_dict({**tables, "kernels": {"attention": "triton"}})
    assert attention_rates_for(flash) is None and cost_context(flash).attention is None
    assert cost_context(triton).attention.arch == "ampere"
    # without the host's launch queue, which binds so small a model, kernels alone set the time
    slower, faster = (emulate(j, workers=1, host_dispatch=None) for j in (triton, flash))
    assert slower.iteration_time_s > faster.iteration_time_s
    # the rates' attention ops are counted apart from the table's interpolation
    rated = slower.compute_priced_by["published-rates"]["ops"]
    assert rated == 2  # the layer's attention forward and backward
    assert faster.compute_priced_by["published-rates"]["ops"] == 0
    # a GPU architecture the kernel was never measured on is refused, naming the field
    monkeypatch.setitem(emulate_module.ATTENTION_RATES, "triton", _empty_rates())
    with pytest.raises(SpecError, match=r"kernels.attention='triton': no published rates"):
        attention_rates_for(triton)


def test_a_torchtitan_job_on_an_h100_prices_attention_as_flash_attention_2():
    from prismbench.emulate import attention_rates_for

    job = job_spec_from_dict({
        "model": {"family": "llama", "layers": 1, "hidden": 512, "ffn_hidden": 1024, "heads": 4,
                  "kv_heads": 2, "vocab": 256, "max_seq_len": 2048, "positions": "rope"},
        "batch": {"seq_len": 2048, "global_batch": 1},
        "kernels": {"framework": "torchtitan"},
        "cluster": {"gpu": "h100-hbm2e-96g", "intra_node": "nvlink4", "inter_node": "roce-8x400"},
    })  # fmt: skip
    rates = attention_rates_for(job)
    assert (rates.kernel, rates.arch) == ("flash2", "hopper")


def _empty_rates():
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "rates.csv"
    path.write_text("arch,causal,head_dim,seqlen,fwd_bwd_tflops,peak_bf16_tflops,source\n")
    return path


def test_emulate_says_on_stderr_when_the_allocator_never_settles(tmp_path, capsys, monkeypatch):
    import emulator.memory.replay

    job = tmp_path / "job.toml"
    job.write_text('[model]\nname = "gpt-debug"\n'
                   "[batch]\nseq_len = 128\nmicro_batch = 16\nglobal_batch = 32\n")  # fmt: skip
    assert main(["emulate", str(job), "--json", "--workers", "1"]) == 0
    out, err = capsys.readouterr()
    settled = json.loads(out)["per_class"][0]
    # its allocator repeats its blocks after two steady iterations
    assert (settled["steady_iterations"], settled["steady_converged"]) == (2, True)
    assert "warning" not in err
    monkeypatch.setattr(emulator.memory.replay, "MAX_STEADY_ITERATIONS", 1)
    assert main(["emulate", str(job), "--json", "--workers", "1"]) == 0
    out, err = capsys.readouterr()
    unsettled = json.loads(out)["per_class"][0]
    assert (unsettled["steady_iterations"], unsettled["steady_converged"]) == (1, False)
    assert (
        "warning: pipeline rank 0: the allocator's blocks still changed after 1 steady "
        "iterations (MAX_STEADY_ITERATIONS)" in err
    )


def _ingested_rows(tmp_path, capsys, *, slower: float, gpu: str):
    """Rows that `ingest-profile` writes for a synthetic profile of the tiny GPT job measured
    `slower` x what the GPU's own table prices, on `gpu`: (job path, rows path, matched rows,
    the table's kernel seconds of the job, without the idle gaps between kernels)."""
    from emulator.costs.pricing import compute_prices
    from prismbench.capture import capture_job
    from prismbench.emulate import cost_context
    from prismbench.spec import load_job_spec
    from tests.prismbench.profiles import (
        TINY_TOML,
        compute_rows,
        profiled,
        write_jsonl,
    )

    job = tmp_path / "tiny.toml"
    job.write_text(TINY_TOML)
    trace = capture_job(load_job_spec(job)).traces[0]
    priced_s, _ = compute_prices(trace, cost_context(load_job_spec(job), kernel_gap_s=0.0))
    rows = compute_rows(trace)
    profile = [profiled(trace, r, slower * priced_s[r] * 1e6) for r in rows]
    path = write_jsonl(tmp_path / "tiny.ops.jsonl.gz", profile)
    out = tmp_path / "rows.csv"
    ingest = ["ingest-profile", str(path), "--job", str(job), "--out", str(out), "--json"]
    assert main([*ingest, "--provenance", f"gpu={gpu}"]) == 0
    matched = json.loads(capsys.readouterr().out)["matched_rows"]
    return job, out, matched, float(sum(priced_s[rows]))


def test_rows_measured_on_the_jobs_gpu_price_it_over_the_committed_table(tmp_path, capsys):
    from prismbench.emulate import kernel_gap_for

    job, rows, matched, table_s = _ingested_rows(
        tmp_path, capsys, slower=10.0, gpu="NVIDIA H100 80GB HBM3"
    )
    assert main(["emulate", str(job), "--kernel-table", str(rows), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["kernel_table"] == f"{rows} over results/kernels/h100-sxm-80g.csv"
    by = result["compute_priced_by"]
    assert by["exact"]["ops"] == matched  # every op its own row, none the committed table's
    compute_s = sum(source["time_s"] for source in by.values())
    assert compute_s == pytest.approx(10 * table_s + matched * kernel_gap_for(), rel=1e-6)


def test_rows_measured_on_another_gpu_are_refused_naming_it(tmp_path, capsys):
    # rows `calibrate --job` wrote on an H200 (ingest-profile refuses to label them so itself)
    job, rows, _, _ = _ingested_rows(tmp_path, capsys, slower=1.0, gpu="NVIDIA H100 80GB HBM3")
    rows.write_text(rows.read_text().replace("NVIDIA H100 80GB HBM3", "NVIDIA H200"))
    assert main(["emulate", str(job), "--kernel-table", str(rows), "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"error: --kernel-table: {rows}: rows measured on 'NVIDIA H200', not on "
        "cluster.gpu='h100-sxm-80g' (whose device names are 'NVIDIA H100 80GB HBM3'): a table "
        "prices the GPU it was measured on\n"
    )


def test_rows_may_name_the_gpu_as_the_job_spec_does(tmp_path, capsys):
    """`ingest-profile --provenance gpu=h100-sxm-80g` names the GPU by its preset, as
    cluster.gpu does, not as torch does: the job on that preset takes the rows, and a job on
    another preset still refuses them."""
    job, rows, matched, _ = _ingested_rows(tmp_path, capsys, slower=1.0, gpu="h100-sxm-80g")
    assert main(["emulate", str(job), "--kernel-table", str(rows), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["compute_priced_by"]["exact"]["ops"] == matched
    h200 = tmp_path / "tiny_h200.toml"
    h200.write_text(job.read_text() + '[cluster]\ngpu = "h200-141g"\n')
    assert main(["emulate", str(h200), "--kernel-table", str(rows), "--json"]) == 2
    assert "rows measured on 'h100-sxm-80g', not on cluster.gpu='h200-141g'" in (
        capsys.readouterr().err
    )
