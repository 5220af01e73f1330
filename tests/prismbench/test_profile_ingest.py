"""Profile ingestion: profiler records of a real run -> kernel-table rows, matched to the capture.

The examples build a synthetic profile from the capture of a tiny job (what a GPU run of the
same job would have recorded), so they run in seconds on CPU."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest

from emulator.costs.kernel_table import SHAPE_FIELDS, load_kernel_table, op_class, row_op
from emulator.hardware import gpu_preset
from prismbench.capture import capture_job
from prismbench.cli import main
from prismbench.profile_ingest import (
    collapse_to_recorded,
    ingest_ops,
    launched_first,
    match_key,
    profile_case,
    profile_source,
    write_rows_csv,
)
from prismbench.profile_readers import (
    ProfiledOp,
    ProfileError,
    read_chrome_trace,
    read_ops_jsonl,
    read_profile,
)
from prismbench.spec import job_spec_from_dict
from tests.prismbench.profiles import (
    FIXTURE,
    TINY,
    TINY_TOML,
    synthetic_profile,
    write_jsonl,
)

SHARED_H100 = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gpu" / "h100-sxm-80g"


@pytest.fixture(scope="module")
def trace():
    return capture_job(job_spec_from_dict(TINY)).traces[0]


def test_jsonl_reader_skips_kernel_and_runtime_events(tmp_path):
    events = [
        {"op": "aten::addmm", "shapes": [[64], [8, 64], [64, 64], [], []], "self_cuda_us": 5.5,
         "kernels": [["Memset (Device)", 0.5], ["nvjet_gemm", 5.0]], "cpu_start_us": 1.0},
        {"op": "Activity Buffer Request", "shapes": [], "self_cuda_us": 0.5,
         "kernels": [["Memset (Device)", 0.5]], "cpu_start_us": 2.0},
        {"op": "Memset (Device)", "shapes": [], "self_cuda_us": 0.5, "kernels": [],
         "cpu_start_us": 3.0},
        {"op": "nvjet_gemm", "shapes": [], "self_cuda_us": 5.0, "kernels": [], "cpu_start_us": 4.0},
    ]  # fmt: skip
    path = tmp_path / "case.ops.jsonl.gz"
    with gzip.open(path, "wt") as handle:
        handle.write("\n".join(json.dumps(e) for e in events) + "\n")
    (op,) = read_ops_jsonl(path)
    assert op.op == "aten::addmm" and op.kernel_us == 5.5
    assert op.shapes == ((64,), (8, 64), (64, 64), (), ())
    assert read_profile(path) == [op]


def test_chrome_trace_reader_links_kernels_to_their_ops():
    """Kernels reach their op by External id (addmm), by the runtime launch's correlation id
    (gelu) and by the ac2g flow's start (sum, on another thread); aten::linear encloses addmm."""
    addmm, gelu, total = read_chrome_trace(FIXTURE)
    assert addmm.op == "aten::addmm" and addmm.shapes[:3] == ((32,), (8, 64), (64, 32))
    assert addmm.kernels == (("Memset (Device)", 1.5), ("nvjet_gemm_bias", 10.0))
    assert [name for name, _, _ in addmm.stack] == ["aten::linear"]
    assert (gelu.op, gelu.kernels) == ("aten::gelu", (("gelu_kernel", 4.0),))
    assert (total.op, total.kernels) == ("aten::sum", (("reduce_kernel", 2.5),))
    assert read_profile(FIXTURE) == [addmm, gelu, total]


def test_a_chrome_trace_that_opens_with_a_blank_line_is_read(tmp_path):
    """Older kineto exports write a newline before the trace's opening brace."""
    leading_blank = tmp_path / "kineto.json"
    leading_blank.write_text("\n" + FIXTURE.read_text())
    assert read_profile(leading_blank) == read_chrome_trace(FIXTURE)


@pytest.mark.skipif(not SHARED_H100.is_dir(), reason="../shared/data/gpu is not beside the repo")
def test_a_recorded_h100_profile_is_matched_to_its_capture_op_for_op():
    """The shared gpt3-125m profile (one iteration on an H100, torch 2.11) against the capture
    of its own job spec: every trace row but the optimizer's one foreach add is matched, and all
    but ~4 us of 80.5 ms of kernel time lands on a row."""
    from prismbench.profile_ingest import ingest_profile
    from prismbench.spec import load_job_spec

    case = "gpt3-125m-s2048-mb8-none"
    result = ingest_profile(
        SHARED_H100 / "profiles" / f"{case}.ops.jsonl.gz",
        load_job_spec(SHARED_H100 / "specs" / f"{case}.toml"),
    )
    assert (result.trace_rows, result.matched_rows, len(result.rows)) == (899, 898, 74)
    assert result.total_kernel_us == pytest.approx(80476.46, abs=0.01)
    assert result.total_kernel_us - result.attributed_kernel_us < 5.0
    assert [op["op"] for op in result.unmatched_trace] == ["aten._foreach_add_"]
    assert {op["op"] for op in result.unmatched_profile} == {
        "aten::_local_scalar_dense",
        "aten::arange",
        "aten::fill_",
    }
    assert {row["source"] for row in result.rows} == {f"profile:{case}"}


def test_kernels_go_to_the_outermost_op_the_capture_records():
    ops = read_chrome_trace(FIXTURE)
    linear, *_ = collapse_to_recorded(ops, {"aten.linear", "aten.addmm"})
    assert linear.op == "aten::linear" and linear.kernel_us == 11.5
    assert linear.shapes == ((8, 64), (32, 64), (32,))
    assert collapse_to_recorded(ops, {"aten.addmm"}) == ops  # linear is not recorded: addmm is


def test_a_full_max_copies_its_input_first_as_the_capture_records_it():
    """ATen's max() reduces a contiguous copy of a transposed input: the profiler lists the copy
    after the max that launched it (nested in it, in a Chrome trace); the capture records the
    copy first, where its kernel runs."""
    weight_t = (4096, 14336)
    maximum = ProfiledOp("aten::max", (weight_t,), (("reduce", 55.0),), 10.0)
    copy = ProfiledOp("aten::copy_", (weight_t, weight_t, ()), (("copy", 439.0),), 11.0)
    other = ProfiledOp("aten::copy_", ((), (), ()), (("copy", 2.0),), 12.0)
    assert launched_first([maximum, copy, other]) == [copy, maximum, other]
    assert launched_first([maximum, other]) == [maximum, other]
    nested = ProfiledOp(
        copy.op, copy.shapes, copy.kernels, 11.0, (("aten::max", 10.0, (weight_t,)),)
    )
    assert collapse_to_recorded([nested], {"aten.max", "aten.copy_"}) == [nested]


def test_cuda_zero_fills_come_before_the_loss_and_embedding_backwards_that_launch_them():
    """As a real H100 profile of the 125M GPT lists them: nll_loss_backward, then the fill of
    its [16 384, 50 304] grad_input; embedding_dense_backward, an arange, then the fill of its
    [50 304, 768] grad_weight. The capture records each fill before its op."""
    logits, tokens = (16384, 50304), (8, 2048)
    loss_bwd = ProfiledOp("aten::nll_loss_backward", ((), logits, (16384,)), (("nll", 19.0),), 1.0)
    loss_fill = ProfiledOp("aten::fill_", (logits, ()), (("fill", 997.0),), 2.0)
    softmax_bwd = ProfiledOp(
        "aten::_log_softmax_backward_data", (logits, logits), (("s", 9.0),), 3.0
    )
    embed_bwd = ProfiledOp(
        "aten::embedding_dense_backward", ((*tokens, 768), tokens), (("e", 309.0),), 4.0
    )
    arange = ProfiledOp("aten::arange", ((), (), (), (0,)), (("a", 1.0),), 5.0)
    embed_fill = ProfiledOp("aten::fill_", ((50304, 768), ()), (("fill", 24.0),), 6.0)
    scalar_fill = ProfiledOp("aten::fill_", ((), ()), (("fill", 1.0),), 7.0)
    profile = [loss_bwd, loss_fill, softmax_bwd, embed_bwd, arange, embed_fill, scalar_fill]
    assert launched_first(profile) == [
        loss_fill,
        loss_bwd,
        softmax_bwd,
        embed_fill,
        embed_bwd,
        arange,
        scalar_fill,
    ]
    # a fill of another tensor after the loss stays where it is, and fills already first stay
    assert launched_first([loss_bwd, scalar_fill]) == [loss_bwd, scalar_fill]
    in_order = [loss_fill, loss_bwd, loss_fill, loss_bwd]
    assert launched_first(in_order) == in_order
    # nested in its op (a Chrome trace), the fill keeps its kernel rather than giving it away
    nested = ProfiledOp(
        loss_fill.op,
        loss_fill.shapes,
        loss_fill.kernels,
        2.0,
        (("aten::nll_loss_backward", 1.0, loss_bwd.shapes),),
    )
    assert collapse_to_recorded([nested], {"aten.nll_loss_backward", "aten.fill_"}) == [nested]


def test_ops_whose_profiled_shapes_say_nothing_match_by_op():
    """Profilers record no shapes for tensor lists (torch's fused AdamW, `cat`), CUDA's `stack`
    launches its kernels as a nested `cat`, and `arange` is listed with its out= tensor before
    it is resized: each matches by op, as a real H100 profile lists them."""
    step = match_key("optimizer_step", "aten._fused_adamw_", [(125262336,)])
    assert step == match_key("optimizer_step", "aten._fused_adamw_", [])
    stacked = match_key("copy", "aten.stack", [(1, 4096, 32, 64), (1, 4096, 32, 64)])
    assert stacked == match_key("copy", "aten.cat", [])
    assert match_key("copy", "aten.arange", [], [(64,)]) == match_key("copy", "aten.arange", [(0,)])
    # other ops still need their shapes to agree
    assert match_key("copy", "aten.clone", [(64,)]) != match_key("copy", "aten.clone", [(32,)])


def test_sdpa_flash_backend_kernels_match_the_sdpa_op_the_capture_records(trace):
    """On CUDA, SDPA's flash backend hands `_flash_attention_forward`/`_backward` q, k, v as
    [batch, seq, heads, head_dim] and a jsonl profile lists the kernels under them (the H200
    reprofile of 2026-11-30): they match the capture's SDPA rows, [batch, heads, seq, dim]."""
    inner = {"aten::_scaled_dot_product_flash_attention": "aten::_flash_attention_forward",
             "aten::_scaled_dot_product_flash_attention_backward": "aten::_flash_attention_backward"}  # fmt: skip
    ops = [
        ProfiledOp(inner[op.op], tuple((s[0], s[2], s[1], s[3]) if len(s) == 4 else s for s in op.shapes),
                   op.kernels, op.cpu_start_us) if op.op in inner else op
        for op in synthetic_profile(trace)
    ]  # fmt: skip
    assert {op.op for op in ops} >= set(inner.values())
    assert ingest_ops(ops, trace).matched_rows == len(ops)


def test_alignment_tolerates_an_inserted_and_a_missing_op(trace):
    ops = synthetic_profile(trace)
    assert ingest_ops(ops, trace).matched_rows == len(ops)
    missing = next(i for i, op in enumerate(ops) if op.op == "aten::addmm")
    extra = ProfiledOp("aten::fill_", ((3, 5), ()), (("fill", 7.0),), 0.0)
    edited = ops[:missing] + ops[missing + 1 : missing + 4] + [extra] + ops[missing + 4 :]
    result = ingest_ops(edited, trace)
    assert result.matched_rows == len(ops) - 1 == result.trace_rows - 1
    assert result.total_kernel_us - result.attributed_kernel_us == pytest.approx(7.0)
    assert result.unmatched_profile == [
        {"op": "aten::fill_", "shapes": "[[3, 5], []]", "count": 1, "kernel_us": 7.0}
    ]
    (row,) = result.unmatched_trace
    assert (row["op"], row["count"]) == ("aten.addmm", 1)


def test_rows_aggregate_and_round_trip_through_load_kernel_table(trace, tmp_path):
    ops = synthetic_profile(trace)
    result = ingest_ops(ops, trace, {"gpu": "Test GPU", "torch": "2.13"})
    assert sum(row["repetitions"] for row in result.rows) == len(ops)
    path = write_rows_csv(result.rows, tmp_path / "rows.csv")
    table = load_kernel_table(path)
    assert table.gpus == ("Test GPU",)
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(result.rows) and {r["op"] for r in rows} >= {"mm", "addmm", "norm"}
    keys = [
        (op_class(r["op"]), r["dtype"], *(r[f] for f in ("m", "n", "k", "nbytes"))) for r in rows
    ]
    alone = [row for row, key in zip(rows, keys, strict=True) if keys.count(key) == 1]
    assert len(alone) > 10
    for row in alone:  # the only row at its table point: the table answers its time
        if "flash" not in row["op"]:
            seconds = table.time_s(row_op(row), gpu_preset("h100-sxm-80g").sm_count)
            assert seconds == pytest.approx(float(row["time_us"]) * 1e-6, rel=1e-9)


def test_cli_writes_rows_and_refuses_bad_profiles(trace, tmp_path, capsys):
    job = tmp_path / "job.toml"
    job.write_text(TINY_TOML)
    profile = write_jsonl(tmp_path / "tiny.ops.jsonl.gz", synthetic_profile(trace))
    out = tmp_path / "rows.csv"
    assert main(["ingest-profile", str(profile), "--job", str(job), "--out", str(out)]) == 0
    assert "Matched" in capsys.readouterr().out and load_kernel_table(out)
    # the rows say which profile they came from, so compare can leave them out
    with out.open(newline="") as handle:
        assert {row["source"] for row in csv.DictReader(handle)} == {"profile:tiny"}
    with pytest.raises(ValueError, match="no rows once profile:tiny are left out"):
        load_kernel_table(out, skip_sources=("profile:tiny",))
    bad = {
        "missing.json": None,
        "broken.json": '{"traceEvents": [',
        "notes.txt": "hello\n",
        "lines.jsonl": '{"op": "aten::mm", "kernels": []}\n{oops\n',
    }
    for name, text in bad.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        target = tmp_path / f"{name}.csv"
        assert main(["ingest-profile", str(path), "--job", str(job), "--out", str(target)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {path}") and err.count("\n") == 1, err
        assert not target.exists() and not list(tmp_path.glob(".*.tmp"))
    with pytest.raises(ProfileError, match="unknown format"):
        read_profile(tmp_path / "notes.txt")


def test_cli_refuses_an_unknown_or_repeated_provenance_key(trace, tmp_path, capsys):
    job = tmp_path / "job.toml"
    job.write_text(TINY_TOML)
    profile = write_jsonl(tmp_path / "tiny.ops.jsonl.gz", synthetic_profile(trace))
    out = tmp_path / "rows.csv"
    ingest = ["ingest-profile", str(profile), "--job", str(job), "--out", str(out)]
    refused = {
        ("foo=bar",): "error: --provenance 'foo=bar': unknown key 'foo'; the keys are gpu, "
        "driver, torch, clocks, date\n",
        ("gpu=A", "gpu=B"): "error: --provenance gpu is given twice: give each key once\n",
    }
    for items, message in refused.items():
        assert main([*ingest, *(a for item in items for a in ("--provenance", item))]) == 2
        assert capsys.readouterr().err == message and not out.exists()
    # a GPU the job's cluster.gpu does not name: its table would refuse the rows once written
    assert main([*ingest, "--provenance", "gpu=Test GPU"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --provenance gpu='Test GPU': ") and "'h100-sxm-80g'" in err
    assert not out.exists()
    for gpu in ("h100-sxm-80g", "NVIDIA H100 80GB HBM3"):  # the preset's name, or torch's
        assert main([*ingest, "--provenance", f"gpu={gpu}", "--provenance", "torch=2.13"]) == 0
        assert load_kernel_table(out).gpus == (gpu,)


def test_a_truncated_or_undecodable_profile_is_refused_naming_it(trace, tmp_path, capsys):
    job = tmp_path / "job.toml"
    job.write_text(TINY_TOML)
    whole = write_jsonl(tmp_path / "whole.ops.jsonl.gz", synthetic_profile(trace)).read_bytes()
    cut = tmp_path / "cut.ops.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])  # a copy that stopped half-way
    binary = tmp_path / "binary.ops.jsonl"
    binary.write_bytes(b'{"op": "aten::mm", "kernels": []}\n\xff\xfe\n')
    for path, message in ((cut, "a truncated or corrupt gzip file"), (binary, "not UTF-8")):
        with pytest.raises(ProfileError, match=message):
            read_profile(path)
        out = tmp_path / "rows.csv"
        assert main(["ingest-profile", str(path), "--job", str(job), "--out", str(out)]) == 2
        assert main(["compare", str(job), "--profile", str(path)]) == 2
        lines = capsys.readouterr().err.splitlines()  # one line each, no traceback
        assert len(lines) == 2 and all(x.startswith(f"error: {path}: {message}") for x in lines)
        assert not out.exists()


def test_cli_refuses_a_profile_of_another_job_and_writes_nothing(trace, tmp_path, capsys):
    """A profile is of the job only where the alignment covers at least MIN_COVERAGE of both
    the capture's compute rows and the profile's kernel time: the tiny job's profile against a
    shorter sequence (most shapes differ), the first third of its profile (every profiled op
    matches, most rows do not), and a profile with no GPU kernel are refused."""
    job = tmp_path / "job.toml"
    job.write_text(TINY_TOML)
    other = tmp_path / "other.toml"
    other.write_text(TINY_TOML.replace("seq_len = 64", "seq_len = 32"))
    ops = synthetic_profile(trace)
    profile = write_jsonl(tmp_path / "tiny.ops.jsonl.gz", ops)
    third = write_jsonl(tmp_path / "third.ops.jsonl.gz", ops[: len(ops) // 3])
    no_kernels = tmp_path / "cpu_only.json"
    no_kernels.write_text('{"traceEvents": []}')
    cases = [
        (profile, other, "not a profile of --job"),
        (third, job, "not a profile of --job"),
        (no_kernels, job, "the profile records no GPU kernel time"),
    ]
    for path, spec, message in cases:
        out = tmp_path / "rows.csv"
        assert main(["ingest-profile", str(path), "--job", str(spec), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {path}: {message}") and err.count("\n") == 1, err
        assert not out.exists() and not list(tmp_path.glob(".*.tmp"))
    assert main(["ingest-profile", str(third), "--job", str(job), "--out", str(out)]) == 2
    assert f"of the capture's {len(ops):,} compute rows (33." in capsys.readouterr().err


def test_a_profile_measured_on_another_gpu_is_refused_by_ingest_and_compare(
    trace, tmp_path, capsys
):
    """The same program captures alike on every GPU, so an H200's profile of the tiny job
    aligns with its H100 capture: the GPU its summary.json names is what tells them apart."""
    job = tmp_path / "job.toml"
    job.write_text(TINY_TOML)  # cluster.gpu: the default h100-sxm-80g
    (tmp_path / "profiles").mkdir()
    profile = write_jsonl(tmp_path / "profiles" / "tiny.ops.jsonl.gz", synthetic_profile(trace))
    summary = tmp_path / "summary.json"
    out = tmp_path / "rows.csv"
    ingest = ["ingest-profile", str(profile), "--job", str(job), "--out", str(out)]
    compare = ["compare", str(job), "--profile", str(profile), "--json"]
    summary.write_text(json.dumps({"tiny": {"gpu": "NVIDIA H200"}}))
    for argv in (ingest, compare):
        assert main(argv) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1, captured.err
        assert captured.err.startswith(f"error: {profile}: measured on 'NVIDIA H200'")
        assert "cluster.gpu='h100-sxm-80g'" in captured.err
    assert not out.exists() and not list(tmp_path.glob(".*.tmp"))
    summary.write_text(json.dumps({"tiny": {"gpu": "NVIDIA H100 80GB HBM3"}}))
    assert main(ingest) == 0 and main(compare) == 0


@pytest.mark.parametrize(
    ("summary", "message"),
    [("{oops", "is not JSON"), ('["tiny"]', "must be a JSON object with an object per case"),
     ('{"tiny": "H100"}', "must be a JSON object with an object per case ('tiny'")],
)  # fmt: skip
def test_a_summary_json_of_another_form_beside_the_profile_is_refused_naming_it(
    summary, message, trace, tmp_path, capsys
):
    job = tmp_path / "job.toml"
    job.write_text(TINY_TOML)
    (tmp_path / "profiles").mkdir()
    profile = write_jsonl(tmp_path / "profiles" / "tiny.ops.jsonl.gz", synthetic_profile(trace))
    (tmp_path / "summary.json").write_text(summary)
    out = tmp_path / "rows.csv"
    assert main(["ingest-profile", str(profile), "--job", str(job), "--out", str(out)]) == 2
    assert main(["compare", str(job), "--profile", str(profile)]) == 2
    lines = capsys.readouterr().err.splitlines()  # one line each, no traceback
    assert len(lines) == 2 and all(
        line.startswith(f"error: {tmp_path / 'summary.json'}: ") and message in line
        for line in lines
    ), lines
    assert not out.exists()


def test_a_masked_fill_nested_in_a_chrome_trace_gives_its_copy_to_the_clone():
    """On CUDA `masked_fill` clones self (aten::clone -> aten::copy_) and fills the clone
    (aten::masked_fill_), both nested in aten::masked_fill; the capture records the clone and
    the in-place fill, not the out-of-place op, so each kernel goes to its own recorded op."""
    bias, mask = (32, 2048, 2048), (2048, 2048)
    parent = ("aten::masked_fill", 1.0, (bias, mask, ()))
    clone = ("aten::clone", 2.0, (bias,))
    copy = ProfiledOp(
        "aten::copy_", (bias, bias, ()), (("Memcpy DtoD", 357.0),), 3.0, (parent, clone)
    )
    fill = ProfiledOp("aten::masked_fill_", (bias, mask, ()), (("fill", 457.0),), 4.0, (parent,))
    cloned, filled = collapse_to_recorded([copy, fill], {"aten.clone", "aten.masked_fill_"})
    assert (cloned.op, cloned.kernel_us) == ("aten::clone", 357.0)
    assert filled == fill


@pytest.mark.parametrize(
    ("name", "case"),
    [("gpt3-125m.ops.jsonl.gz", "gpt3-125m"), ("run.ops.jsonl", "run"),
     ("trace.json.gz", "trace"), ("trace.json", "trace")],
)  # fmt: skip
def test_a_profiles_rows_are_sourced_by_its_name_in_every_format(name, case):
    assert profile_case(name) == case
    assert profile_source(f"some/dir/{name}") == f"profile:{case}"


def test_a_profile_committed_in_the_repository_is_matched_to_its_capture_without_shared_data():
    """The same job with NeMo's kernels, profiled on an H100 (results/gpu_runs/h100-2026-11-28,
    24 KB) against the capture of its recorded baseline's job: every trace row is matched, and
    all but ~4.4 us of 52.6 ms of kernel time lands on a row. Runs in a clone without
    ../shared, where the test above is skipped."""
    from prismbench.baselines import load_baseline
    from prismbench.profile_ingest import ingest_profile

    case = "gpt3-125m-s2048-mb8-none"
    root = Path(__file__).resolve().parents[2]
    job = load_baseline(root / "results" / "baselines" / "recorded" / f"h100frameworks__{case}.toml").job
    result = ingest_profile(
        root / "results" / "gpu_runs" / "h100-2026-11-28" / "reprofile" / f"{case}.ops.jsonl.gz", job
    )
    assert (result.trace_rows, result.matched_rows, len(result.rows)) == (892, 892, 69)
    assert result.total_kernel_us == pytest.approx(52577.90, abs=0.01)
    assert result.total_kernel_us - result.attributed_kernel_us < 5.0
    assert result.unmatched_trace == []
    assert {op["op"] for op in result.unmatched_profile} == {
        "aten::_local_scalar_dense",
        "aten::arange",
        "aten::fill_",
    }


def _iteration_records(ops) -> list[dict]:
    return [{"op": o.op, "shapes": [list(s) for s in o.shapes], "kernels": [list(k) for k in o.kernels],
             "cpu_start_us": 0.0} for o in ops]  # fmt: skip


def _csv_rows(path: Path) -> dict[tuple, dict]:
    with path.open(newline="") as handle:
        return {tuple(r[k] for k in ("op", "dtype", "aten", *SHAPE_FIELDS)): r for r in csv.DictReader(handle)}


def _slower(ops, factor) -> list[ProfiledOp]:
    return [ProfiledOp(o.op, o.shapes, tuple((k, factor * us) for k, us in o.kernels), 0.0) for o in ops]


def test_a_profile_of_several_iterations_gives_rows_of_them_all(trace, tmp_path, capsys):
    """`record --profile-iterations 2`: each iteration is aligned with the capture apart, so
    each row counts both (its time their mean) though the second holds an op the first does
    not, which moves every index after it."""
    from prismbench.calibrate_job import write_ops_jsonl_iterations

    ops = synthetic_profile(trace)
    stray = ProfiledOp("aten::cumsum", ((7,),), (("k", 0.001),), 0.0)
    job = tmp_path / "job.toml"
    job.write_text(TINY_TOML)
    one = write_ops_jsonl_iterations([_iteration_records(ops)], tmp_path / "one.ops.jsonl.gz")
    two = write_ops_jsonl_iterations([_iteration_records(ops), _iteration_records([stray, *_slower(ops, 3)])],
                                     tmp_path / "two.ops.jsonl.gz")  # fmt: skip
    for profile in (one, two):
        assert main(["ingest-profile", str(profile), "--job", str(job), "--out", str(tmp_path / f"{profile.name}.csv")]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "the profile holds 2 iterations, each aligned with the capture apart: the rows pool 2" in said
    assert "of its first iteration's kernel time" in said
    single, pooled = _csv_rows(tmp_path / "one.ops.jsonl.gz.csv"), _csv_rows(tmp_path / "two.ops.jsonl.gz.csv")
    assert single.keys() == pooled.keys()
    for key, row in single.items():
        assert float(pooled[key]["repetitions"]) == 2 * float(row["repetitions"])
        assert float(pooled[key]["time_us"]) == pytest.approx(2 * float(row["time_us"]))  # mean of x1 and x3


def test_a_later_iteration_that_is_not_the_job_s_is_left_out_and_named(trace, tmp_path, capsys):
    """A step cut off at the end of a trace, or one that evaluated: its ops are not pooled, and
    the first iteration's rows are written; a first iteration that is not the job's refuses the
    profile, as a profile of one."""
    from prismbench.calibrate_job import write_ops_jsonl_iterations

    ops = synthetic_profile(trace)
    cut = ops[: len(ops) // 3]
    job = tmp_path / "job.toml"
    job.write_text(TINY_TOML)
    one = write_ops_jsonl_iterations([_iteration_records(ops)], tmp_path / "one.ops.jsonl.gz")
    kept = write_ops_jsonl_iterations([_iteration_records(ops), _iteration_records(_slower(cut, 5))],
                                      tmp_path / "kept.ops.jsonl.gz")  # fmt: skip
    printed = {}
    for profile in (one, kept):
        assert main(["ingest-profile", str(profile), "--job", str(job), "--out", str(tmp_path / f"{profile.name}.csv"),
                     "--json"]) == 0  # fmt: skip
        printed[profile] = json.loads(capsys.readouterr().out)
    assert printed[kept]["iterations_left_out"] == [1] and printed[kept]["profile_iterations"] == 2
    assert _csv_rows(tmp_path / "kept.ops.jsonl.gz.csv") == {
        key: row | {"source": "profile:kept"} for key, row in _csv_rows(tmp_path / "one.ops.jsonl.gz.csv").items()
    }
    refused = write_ops_jsonl_iterations([_iteration_records(cut), _iteration_records(ops)], tmp_path / "r.ops.jsonl.gz")
    assert main(["ingest-profile", str(refused), "--job", str(job), "--out", str(tmp_path / "r.csv")]) == 2
    assert not (tmp_path / "r.csv").exists()


def test_a_profile_with_a_nan_kernel_time_is_refused_and_writes_no_rows(trace, tmp_path, capsys):
    """Read as it was, the NaN reached the rows (time_us nan) and `--json`'s coverage (NaN, no
    JSON); a negative time, rows of negative time."""
    ops = synthetic_profile(trace)
    job = tmp_path / "job.toml"
    job.write_text(TINY_TOML)
    for us in (float("nan"), -1.0):
        broken = [*ops[:5], ProfiledOp(ops[5].op, ops[5].shapes, (("k", us),), 0.0), *ops[6:]]
        profile = write_jsonl(tmp_path / "broken.ops.jsonl.gz", broken)
        out = tmp_path / "rows.csv"
        argv = ["ingest-profile", str(profile), "--job", str(job), "--out", str(out), "--json"]
        assert main(argv) == 2
        printed = capsys.readouterr()
        assert printed.out == "" and printed.err.count("\n") == 1
        assert f"broken.ops.jsonl.gz:6: the us of kernel 'k' must be a finite number >= 0, got {us}" in printed.err
        assert not out.exists()
        assert main(["compare", str(job), "--profile", str(profile), "--json"]) == 2
        assert capsys.readouterr().out == ""
