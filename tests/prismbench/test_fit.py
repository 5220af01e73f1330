"""prismbench.fit: the largest value that fits, exact on both sides of the capacity line."""

import dataclasses
import json

import pytest

import emulator.hardware
from prismbench.fit import OomSite, _search, check_memory, fit
from prismbench.report import oom_site_label
from prismbench.spec import SpecError, job_spec_from_dict

# where a made-up check that does not fit ran out
HERE = OomSite(pp=0, iteration="steady", phase="backward", module="GPT.lm_head",
               op="aten.mm", request_bytes=3 << 20, allocation_bytes=20 << 20)  # fmt: skip


def _probe_below(line: int, tried: list[int]):
    def fits(value):
        tried.append(value)
        return value <= line

    return fits


@pytest.mark.parametrize(
    ("line", "start", "step", "answer"),
    [(37, 1, 1, 37), (37, 64, 1, 37), (37, 8, 4, 36), (3, 3, 1, 3), (1, 5, 1, 1), (0, 4, 1, None)],
)
def test_search_finds_the_last_fitting_multiple_of_the_step(line, start, step, answer):
    tried = []
    assert _search(_probe_below(line, tried), start, step, step)[0] == answer
    assert len(tried) == len(set(tried)) <= 14  # doubling/halving, then bisection


def test_search_reaches_a_line_far_above_where_it_starts():
    # a tiny model fits ~100 000 sequences a micro-batch: 17 doublings, then 17 halvings
    tried = []
    assert _search(_probe_below(99_991, tried), 1, 1, 1)[0] == 99_991
    assert len(tried) <= 2 * 17 + 1


def _job(micro_batch: int = 1, **parallel):
    return job_spec_from_dict(
        {
            "model": {"name": "gpt-debug"},
            "parallel": parallel,
            "batch": {"seq_len": 64, "micro_batch": micro_batch, "global_batch": 2 * micro_batch},
        }
    )


DEBUG_SPEC = '[model]\nname = "gpt-debug"\n[batch]\nseq_len = 64\nglobal_batch = 2\n'


def _fit_cli(tmp_path, capsys, *args: str, spec: str = DEBUG_SPEC) -> str:
    """`prismbench fit JOB.toml ARGS` on `spec` written to a file: what it printed, its
    whitespace folded (rich wraps and pads its table and lines)."""
    from prismbench.cli import main

    job = tmp_path / "job.toml"
    job.write_text(spec)
    assert main(["fit", str(job), *args]) == 0
    return " ".join(capsys.readouterr().out.split())


def test_fit_on_a_gpu_whose_capacity_is_exactly_what_a_micro_batch_needs(monkeypatch, tmp_path):
    monkeypatch.setenv("PRISMBENCH_CACHE", str(tmp_path))
    # reserved memory is a staircase of segments: take the last micro-batch of its first step
    need = {1: check_memory(_job(1))}
    for n in range(2, 9):
        need[n] = check_memory(_job(n))
        if need[n].peak_reserved_bytes > need[n - 1].peak_reserved_bytes:
            break
    line = n - 1
    assert need[n].peak_reserved_bytes > need[line].peak_reserved_bytes
    real = emulator.hardware.gpu_preset("h100-sxm-80g")
    exact = need[line].outside_bytes + need[line].peak_reserved_bytes
    tiny = dataclasses.replace(real, usable_capacity_bytes=exact)
    monkeypatch.setattr(emulator.hardware, "gpu_preset", lambda name: tiny)
    result = fit(_job(1), "micro_batch")
    assert result.largest_fitting == line and result.headroom_bytes == 0
    by_value = {p.value: p.memory for p in result.probes}
    assert by_value[line].fits and by_value[line].oom_at is None and not by_value[n].fits
    oom = by_value[n].oom_at
    assert oom.iteration in ("first", "steady") and oom.phase and oom.op.startswith("aten.")
    assert oom.allocation_bytes >= oom.request_bytes > 0
    # exactly the segments it needs: never a cache-freeing retry
    assert by_value[line].steady_alloc_retries == 0
    # one byte less and the step's micro-batches no longer fit (every one of them, here)
    monkeypatch.setattr(
        emulator.hardware,
        "gpu_preset",
        lambda name: dataclasses.replace(real, usable_capacity_bytes=exact - 1),
    )
    below = [v for v, m in need.items() if m.peak_reserved_bytes < need[line].peak_reserved_bytes]
    assert fit(_job(1), "micro_batch").largest_fitting == (max(below) if below else None)


def test_varying_an_unknown_setting_is_refused():
    with pytest.raises(SpecError, match=r"--vary 'heads' must be one of"):
        fit(_job(), "heads")


def test_a_value_that_fits_past_one_that_does_not_is_reported_apart(monkeypatch):
    """Reserved memory need not grow with the batch (the allocator's rounding and caching):
    here 34-38 do not fit but 39 and 40 do, as the 125M GPT's shared spec on an H100 gave."""
    import prismbench.fit

    def check(job):
        mb = job.batch.micro_batch
        fits = mb <= 33 or mb in (39, 40)
        return prismbench.fit.MemoryCheck(
            fits=fits, peak_reserved_bytes=mb, outside_bytes=0, capacity_bytes=0,
            headroom_bytes=1 if fits else -1, oom_at=None if fits else HERE,
            steady_alloc_retries=0, first_iteration_alloc_retries=0, steady_converged=True,
        )  # fmt: skip

    monkeypatch.setattr(prismbench.fit, "check_memory", lambda job, **_: check(job))
    result = fit(_job(8), "micro_batch")
    # the scan from the bracket (32) stops at 34; 40 was found to fit by the bisection
    assert result.largest_fitting == 33 and result.fits_above == (40,) and result.contiguous


def _everything_fits(monkeypatch):
    import prismbench.fit

    def check(job):
        return prismbench.fit.MemoryCheck(
            fits=True, peak_reserved_bytes=job.batch.seq_len, outside_bytes=0, capacity_bytes=0,
            headroom_bytes=1, oom_at=None, steady_alloc_retries=0, first_iteration_alloc_retries=0, steady_converged=True,
        )  # fmt: skip

    monkeypatch.setattr(prismbench.fit, "check_memory", lambda job, **_: check(job))


def test_a_value_the_spec_refuses_bounds_the_answer_as_the_spec_not_memory(monkeypatch):
    # gpt-debug learns a table of 128 positions: seq_len 129 is refused before memory is asked
    _everything_fits(monkeypatch)
    result = fit(_job(), "seq_len")
    assert result.largest_fitting == 128 and result.limited_by == "spec"
    refused = {r.value: r.reason for r in result.refused}
    assert min(refused) == 129
    assert "batch.seq_len(129) exceeds model.max_seq_len(128)" in refused[129]
    assert all(p.value <= 128 for p in result.probes)  # refused values are not memory probes


def test_fit_prints_and_reports_the_spec_bound(monkeypatch, tmp_path, capsys):
    _everything_fits(monkeypatch)
    text = _fit_cli(tmp_path, capsys, "--vary", "seq_len")
    assert "Largest seq_len that fits: 128" in text
    assert "seq_len 129 is refused by the spec: batch.seq_len(129) exceeds" in text
    assert "the bound is the spec's, not memory" in text
    data = json.loads(_fit_cli(tmp_path, capsys, "--vary", "seq_len", "--json"))
    assert data["limited_by"] == "spec" and data["refused"][0]["value"] > 128


def test_memory_is_named_the_bound_when_the_next_value_does_not_fit(monkeypatch):
    import prismbench.fit

    def check(job):
        fits = job.batch.seq_len <= 100
        return prismbench.fit.MemoryCheck(
            fits=fits, peak_reserved_bytes=0, outside_bytes=0, capacity_bytes=0,
            headroom_bytes=1 if fits else -1, oom_at=None if fits else HERE,
            steady_alloc_retries=0, first_iteration_alloc_retries=0, steady_converged=True,
        )  # fmt: skip

    monkeypatch.setattr(prismbench.fit, "check_memory", lambda job, **_: check(job))
    result = fit(_job(), "seq_len")
    assert result.largest_fitting == 100 and result.limited_by == "memory"


def test_a_maximum_bounds_the_search_and_is_named_the_bound(monkeypatch, tmp_path, capsys):
    _everything_fits(monkeypatch)
    result = fit(_job(), "micro_batch", maximum=50)
    assert result.largest_fitting == 50 and result.limited_by == "maximum"
    assert max(p.value for p in result.probes) == 50  # nothing beyond it was emulated
    text = _fit_cli(tmp_path, capsys, "--vary", "micro_batch", "--max", "20")
    assert "Largest micro_batch that fits: 20" in text
    assert "micro_batch 21 is beyond --max 20: the bound is the search's, not memory" in text


def test_values_the_search_left_unprobed_are_said_in_words_not_a_constant(
    monkeypatch, tmp_path, capsys
):
    _everything_fits(monkeypatch)
    # doubling fits up to 32, then 50: the 17 values between are more than the scan checks
    text = _fit_cli(tmp_path, capsys, "--vary", "micro_batch", "--max", "50")
    assert "Not every value below the answer was probed (more than 16 lay between" in text
    assert "MAX_SCAN" not in text


def test_a_maximum_below_the_step_is_refused():
    with pytest.raises(SpecError, match=r"--max 1 must be >= 2 \(the step\)"):
        fit(_job(), "micro_batch", step=2, maximum=1)


@pytest.mark.parametrize("step", [0, -1])
def test_a_step_below_one_is_refused(step):
    with pytest.raises(SpecError, match=rf"--step {step} must be >= 1"):
        fit(_job(), "micro_batch", step=step)


def test_the_fit_table_shows_the_oom_s_request_op_and_an_unlimited_peak(
    monkeypatch, tmp_path, capsys
):
    import prismbench.fit
    from prismbench.cli import main

    def check(job):
        fits = job.batch.micro_batch <= 2
        return prismbench.fit.MemoryCheck(
            fits=fits, peak_reserved_bytes=job.batch.micro_batch << 30, outside_bytes=0,
            capacity_bytes=0, headroom_bytes=1 if fits else -1, oom_at=None if fits else HERE,
            steady_alloc_retries=0, first_iteration_alloc_retries=0, steady_converged=True,
        )  # fmt: skip

    monkeypatch.setattr(prismbench.fit, "check_memory", lambda job, **_: check(job))
    job = tmp_path / "job.toml"
    job.write_text('[model]\nname = "gpt-debug"\n[batch]\nseq_len = 64\nglobal_batch = 2\n')
    assert main(["fit", str(job), "--vary", "micro_batch"]) == 0
    rows = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
    (row,) = [r for r in rows if r.startswith("│ 4 │")]
    assert "4.00 GiB (as if unlimited)" in row and "3.00 MiB" in row
    assert oom_site_label(HERE) == "class 0, steady iteration, backward, in GPT.lm_head, op aten.mm"
    assert main(["fit", str(job), "--vary", "micro_batch", "--json"]) == 0
    probes = {p["value"]: p["memory"] for p in json.loads(capsys.readouterr().out)["probes"]}
    assert probes[4]["oom_at"] == dataclasses.asdict(HERE) and probes[2]["oom_at"] is None


def test_fit_warns_when_the_allocator_never_settles(monkeypatch, tmp_path, capsys):
    import emulator.memory.replay
    from prismbench.cli import main

    monkeypatch.setenv("PRISMBENCH_CACHE", str(tmp_path))
    job = tmp_path / "job.toml"
    # this job's allocator repeats its blocks after two steady iterations; one is allowed
    job.write_text('[model]\nname = "gpt-debug"\n'
                   "[batch]\nseq_len = 128\nmicro_batch = 16\nglobal_batch = 32\n")  # fmt: skip
    monkeypatch.setattr(emulator.memory.replay, "MAX_STEADY_ITERATIONS", 1)
    assert main(["fit", str(job), "--vary", "micro_batch", "--max", "16", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["probes"][0]["memory"]["steady_converged"] is False
    assert (
        "warning: micro_batch = 16: the allocator's blocks still changed after 1 steady "
        "iterations (MAX_STEADY_ITERATIONS)" in err
    )


def test_a_probe_says_its_capture_as_each_class_is_captured(monkeypatch, tmp_path):
    # a probe not in the cache captures (minutes for a big job): its classes are said as
    # they are captured, under the probed value, not after a silence
    monkeypatch.setenv("PRISMBENCH_CACHE", str(tmp_path))
    said: list[str] = []
    fit(_job(1), "micro_batch", maximum=1, progress=said.append)
    assert any(m.startswith("micro_batch = 1: captured class 0 (1/1) in ") for m in said)


def test_a_maximum_below_the_layout_s_own_step_says_where_the_step_comes_from():
    two_stages = _job(1, pp=2)
    with pytest.raises(SpecError, match=r"--max 1 must be >= 2 \(the least layers the layout takes\)"):
        fit(two_stages, "layers", maximum=1)


def test_a_step_the_layout_cannot_take_is_refused_up_front():
    # tp 2 with sequence parallelism splits the sequence in two: a step of 7 would probe odd
    # lengths the spec refuses and report its bound, where larger even lengths fit
    sequence_parallel = _job(1, tp=2)
    with pytest.raises(SpecError, match=r"--step 7 must be a multiple of 2, the least seq_len"):
        fit(sequence_parallel, "seq_len", step=7)


@pytest.mark.slow  # 20-35 s on 2 cores: a bisection of captures of its own
def test_layers_take_any_step_a_pipeline_splits_unevenly():
    # pp 2 takes 3 layers (2 + 1): a step of 1 is the user's to give, unlike a sequence's split
    two_stages = _job(1, pp=2)
    assert fit(two_stages, "layers", step=1, maximum=3).largest_fitting == 3


def _fits_when(monkeypatch, rule, **memory):
    """check_memory made up: a job fits where `rule(job)` holds."""
    import prismbench.fit

    def check(job):
        fits = rule(job)
        figures = dict(fits=fits, peak_reserved_bytes=1 << 30, outside_bytes=0, capacity_bytes=0,
                       headroom_bytes=1 if fits else -1, oom_at=None if fits else HERE,
                       steady_alloc_retries=0, first_iteration_alloc_retries=0,
                       steady_converged=True)  # fmt: skip
        return prismbench.fit.MemoryCheck(**(figures | memory))

    monkeypatch.setattr(prismbench.fit, "check_memory", lambda job, **_: check(job))


def _layers_job(layers: int, pp: int):
    return job_spec_from_dict({"model": {"name": "gpt-debug", "layers": layers},
                               "parallel": {"pp": pp},
                               "batch": {"seq_len": 64, "global_batch": 2 * pp}})  # fmt: skip


def test_layers_halve_to_a_layer_a_stage_not_below_it(monkeypatch):
    # 6 layers on 2 stages do not fit, 3 do not, 2 do: a step of 1 must not halve to 1 layer,
    # which the spec refuses, and report that nothing fits
    _fits_when(monkeypatch, lambda job: job.model.layers <= 2)
    result = fit(_layers_job(6, pp=2), "layers", step=1)
    assert result.smallest == 2 and result.largest_fitting == 2 and not result.refused
    assert [p.value for p in result.probes] == [6, 3, 2]


def test_nothing_fitting_names_the_least_value_the_search_takes(monkeypatch, tmp_path, capsys):
    _fits_when(monkeypatch, lambda job: False)
    spec = DEBUG_SPEC.replace('"gpt-debug"\n', '"gpt-debug"\nlayers = 6\n[parallel]\npp = 2\n')
    text = _fit_cli(tmp_path, capsys, "--vary", "layers", "--step", "1", spec=spec)
    assert "Not even layers = 2 fits." in text


def test_a_least_value_the_spec_refuses_is_said_refused_not_unfitting(monkeypatch, tmp_path, capsys):
    _everything_fits(monkeypatch)
    # gpt-debug's learned positions stop at 128: no length that is a multiple of 256 is taken
    text = _fit_cli(tmp_path, capsys, "--vary", "seq_len", "--step", "256")
    assert "No seq_len from 256 on was emulated:" in text
    assert "seq_len 256 is refused by the spec: batch.seq_len(256) exceeds" in text
    assert "Not even" not in text


def test_values_below_the_bracket_the_search_stepped_over_are_said(monkeypatch, tmp_path, capsys):
    _fits_when(monkeypatch, lambda job: job.batch.micro_batch <= 5)
    result = fit(_job(4), "micro_batch")
    # 4 fits, 8 does not: 6 and 5 bisected; 1 to 3 never probed
    assert result.largest_fitting == 5 and result.every_value_probed_from == 4
    spec = DEBUG_SPEC.replace("seq_len = 64\n", "seq_len = 64\nmicro_batch = 4\n")
    text = _fit_cli(tmp_path, capsys, "--vary", "micro_batch", spec=spec.replace("= 2\n", "= 8\n"))
    assert ("Every micro_batch from 4 to the answer was probed, and none below 4: what the "
            "allocator reserves need not grow with the value") in text  # fmt: skip
    assert "the job's micro-batches a step kept: the global batch follows" in text


def test_a_value_that_fits_by_freeing_the_cache_in_its_first_iteration_says_so(
    monkeypatch, tmp_path, capsys
):
    _fits_when(monkeypatch, lambda job: job.batch.micro_batch <= 2, first_iteration_alloc_retries=1)
    text = _fit_cli(tmp_path, capsys, "--vary", "micro_batch")
    assert "│ 2 │ yes │" in text and "│ 1 / 0 │" in text


@pytest.mark.parametrize(("line", "scanned"), [(48, True), (49, True), (50, False)])
def test_the_scan_checks_up_to_max_scan_values_between_the_bracket_and_the_answer(
    monkeypatch, line, scanned
):
    # from 1 the doubling brackets at 32: the answer 48 leaves 15 values between, 49 sixteen
    # (MAX_SCAN, still checked one by one), 50 seventeen (not)
    _fits_when(monkeypatch, lambda job: job.batch.micro_batch <= line)
    result = fit(_job(1), "micro_batch")
    assert result.largest_fitting == line and result.contiguous is scanned
    assert result.every_value_probed_from == (32 if scanned else None)
