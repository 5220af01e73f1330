"""Fused fp8 casts: a captured fp8 job records two kernels per operand cast instead of the
eager chain, moving fewer bytes; the fp8 GEMMs are the same either way."""

import collections

import numpy as np
import pytest

from emulator.capture.trace import COMPUTE
from prismbench.spec import job_spec_from_dict
from tests.prismbench.capture_cases import capture


def _spec(fp8_casts, parallel=None, recipe="tensorwise"):
    return {
        "model": {"name": "llama-debug"},
        "parallel": dict(parallel or {}),
        "batch": {"seq_len": 32, "micro_batch": 1, "global_batch": 2},
        "train": {"precision": "fp8"},
        "kernels": {"fp8_recipe": recipe, "fp8_casts": fp8_casts},
    }


def _job(fp8_casts, recipe="tensorwise", parallel=None):
    return job_spec_from_dict(_spec(fp8_casts, parallel, recipe))


def _compute_rows(trace):
    rows = np.flatnonzero(trace["kind"] == COMPUTE)
    atens = trace.text("aten")
    return [
        (atens[i], trace.tensors(i), int(trace["read_bytes"][i] + trace["write_bytes"][i]))
        for i in rows
    ]


def _fp8_writes(rows):
    return [r for r in rows if any(d.startswith("float8") for _, d, out in r[1] if out)]


def _cast_work(rows):
    """Kernels and bytes of everything but the GEMMs, attention, norms and the optimizer: in an
    fp8 job of this model, what differs between unfused and fused is the cast work."""
    gemms = [r for r in rows if r[0] == "aten._scaled_mm"]
    casts = [r for r in _fp8_writes(rows) if r[0] != "aten.clone"]
    return gemms, casts, len(rows), sum(b for *_, b in rows)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fused_casts_record_two_kernels_per_operand_and_fewer_bytes(recipe):
    unfused = _compute_rows(capture(_job("unfused", recipe)).traces[0])
    fused = _compute_rows(capture(_job("fused", recipe)).traces[0])
    gemms_u, casts_u, kernels_u, bytes_u = _cast_work(unfused)
    gemms_f, casts_f, kernels_f, bytes_f = _cast_work(fused)
    assert gemms_u == gemms_f and len(gemms_f) > 0  # same fp8 GEMMs, same shapes and dtypes
    # one kernel writes each fp8 operand either way; torchao casts two operands per GEMM
    assert len(casts_u) == len(casts_f) == 2 * len(gemms_f)
    amax = [r for r in fused if r[0] == "aten.amax"]
    assert len(amax) == len(casts_f)
    # the eager chain of one cast is abs, max, scale arithmetic, multiply, clamp, cast...
    assert kernels_u - kernels_f >= 4 * len(casts_f)
    # ...the fused pair reads the bf16 operand twice and writes it once in fp8, and writes
    # and reads its float32 scales (one, or one per row)
    for (_, tensors, nbytes), (_, amax_tensors, amax_bytes) in zip(casts_f, amax, strict=True):
        (hp_shape, hp_dtype, _), *_ = tensors
        (amax_in, (scale_shape, scale_dtype, _)) = amax_tensors
        assert amax_in == (hp_shape, hp_dtype, False) and hp_dtype == "bfloat16"
        assert scale_dtype == "float32"
        scale_bytes = 4 * int(np.prod(scale_shape))
        assert nbytes + amax_bytes == 5 * int(np.prod(hp_shape)) + 2 * scale_bytes
    assert bytes_f < bytes_u


def test_eager_torchao_copies_operands_into_the_layouts_its_gemms_read():
    """On a GPU eager torchao runs a transposing copy for three of each linear's six GEMM
    operands (`preprocess_addmm`: a row-major A and a column-major B for `_scaled_mm`), and
    ATen's max() copies the transposed weight before each of its two amax passes; the fused
    rules' casts write the layout the GEMM reads, and no copy is left."""
    copies, gemms = {}, {}
    for casts in ("unfused", "fused", "transformer-engine"):
        rows = _compute_rows(capture(_job(casts)).traces[0])
        gemms[casts] = sum(r[0] == "aten._scaled_mm" for r in rows)
        clones = [r[1][0][1] for r in rows if r[0] == "aten.clone"]
        copies[casts] = (
            sum(dtype.startswith("float8") for dtype in clones),
            clones.count("bfloat16"),
        )
    assert len(set(gemms.values())) == 1
    linears = gemms["unfused"] // 3
    assert linears > 0
    assert copies["unfused"] == (3 * linears, 2 * linears)
    assert copies["fused"] == copies["transformer-engine"] == (0, 0)
    bf16 = job_spec_from_dict({**_spec("unfused"), "train": {"precision": "bf16"}})
    assert "aten.clone" not in capture(bf16).traces[0].text("aten")


def test_fused_casts_under_tensor_parallelism_keep_the_amax_all_reduce():
    for casts in ("unfused", "fused"):
        trace = capture(_job(casts, parallel={"tp": 2})).traces[0]
        names = trace.text("name")
        assert "scaled_mm" in names and "all_reduce" in names


def _one_micro_batch(fp8_casts):
    spec = _spec(fp8_casts)
    return job_spec_from_dict({**spec, "batch": {**spec["batch"], "global_batch": 1}})


def _fp8_bytes_written(trace) -> int:
    rows = np.flatnonzero(trace["kind"] == COMPUTE)
    return sum(
        int(trace["write_bytes"][i])
        for i in rows
        if any(d.startswith("float8") for _, d, out in trace.tensors(i) if out)
    )


def test_transformer_engine_casts_write_each_operand_once_with_no_amax_pass():
    fused = _compute_rows(capture(_one_micro_batch("fused")).traces[0])
    te_trace = capture(_one_micro_batch("transformer-engine")).traces[0]
    te = _compute_rows(te_trace)
    gemms = [r for r in te if r[0] == "aten._scaled_mm"]
    assert gemms == [r for r in fused if r[0] == "aten._scaled_mm"] and gemms
    # delayed scaling: the amax is recorded by the cast kernel, the GEMM reads the scale
    # inverse the cast wrote (the one reciprocal left is the optimizer's grad-clip)
    assert not [r for r in te if r[0] == "aten.amax"]
    reciprocals = [r for r in fused if r[0] == "aten.reciprocal"]
    assert len(reciprocals) >= 2 * len(gemms)
    assert len([r for r in te if r[0] == "aten.reciprocal"]) == len(reciprocals) - 2 * len(gemms)
    # torchao casts input, weight and output gradient once per GEMM that reads them (two
    # casts per GEMM); TE's cast-transpose writes both layouts from one read of the operand
    casts_fused, casts_te = _fp8_writes(fused), _fp8_writes(te)
    assert len(casts_fused) == 2 * len(gemms)
    assert len(casts_te) <= len(casts_fused) // 2
    # each kernel writes its operand's two layouts (twice the bytes of the one it records),
    # once however many linears read the operand (torchao casts attention's input for wq, wk
    # and wv, forward and backward: six casts, where TE's fused QKV casts it once)
    fp8_out = lambda rows: sum(  # noqa: E731
        int(np.prod(shape)) for r in rows for shape, d, out in r[1] if out and d.startswith("float8")
    )
    assert _fp8_bytes_written(te_trace) == 2 * fp8_out(casts_te) < fp8_out(casts_fused)
    # each reads a bf16 operand (and its float32 scale) once
    for _, tensors, nbytes in casts_te:
        (hp_shape, hp_dtype, _), (scale_shape, scale_dtype, _), _ = tensors
        assert (hp_dtype, scale_dtype) == ("bfloat16", "float32")
        assert nbytes >= 3 * int(np.prod(hp_shape))  # read 2 B, write >= 1 B an element


def test_transformer_engine_casts_under_tensor_parallelism_issue_no_amax_collective():
    def all_reduces(precision, casts):
        job = job_spec_from_dict({**_spec(casts, {"tp": 2}), "train": {"precision": precision}})
        return capture(job).traces[0].text("name").count("all_reduce")

    bf16 = all_reduces("bf16", "transformer-engine")
    # dynamic scaling (torch.compile's rule) reduces each sharded operand's amax over tp
    assert all_reduces("fp8", "fused") > bf16
    # delayed scaling reduces the amax history once per region, not per cast: the fp8 job
    # issues the bf16 job's collectives and no more
    assert all_reduces("fp8", "transformer-engine") == bf16


def test_transformer_engine_gathers_sequence_parallel_operands_in_fp8():
    """Megatron with Transformer Engine casts a column-parallel input on its sequence shard and
    all-gathers fp8 (again in backward, from the saved fp8 shard), and casts a row-parallel
    output gradient before gathering it: the program gathers bf16 and casts the gathered tensor,
    so the rule makes those gathers move one byte an element."""

    def gathers(precision):
        job = job_spec_from_dict({
            "model": {"name": "gpt-debug"}, "parallel": {"tp": 2, "sequence_parallel": True},
            "batch": {"seq_len": 32, "micro_batch": 2, "global_batch": 2},
            "train": {"precision": precision}, "kernels": {"framework": "megatron"},
        })  # fmt: skip
        assert job.kernels.fp8_casts == "transformer-engine"
        assert job.kernels.sp_collectives == "first-dim" and job.kernels.sp_regather
        trace = capture(job).traces[0]
        rows = [i for i, name in enumerate(trace.text("name")) if name == "all_gather"]
        dtypes = trace.text("dtype")
        return [(dtypes[i], int(trace["numel"][i]), int(trace["size_bytes"][i])) for i in rows]

    bf16, fp8 = gathers("bf16"), gathers("fp8")
    assert [numel for _, numel, _ in fp8] == [numel for _, numel, _ in bf16]  # the same gathers
    assert {d for d, *_ in bf16} == {"bfloat16"}
    by_dtype = {d: [(n, b) for dd, n, b in fp8 if dd == d] for d, *_ in fp8}
    # per block: the attention and MLP inputs forward and again in backward (e4m3), the two
    # output gradients (e5m2); the output layer is not fp8 and keeps its bf16 gathers
    layers = 4
    assert len(by_dtype["float8_e4m3fn"]) == 4 * layers
    assert len(by_dtype["float8_e5m2"]) == 2 * layers
    assert len(by_dtype["bfloat16"]) == len(bf16) - 6 * layers
    assert all(b == n for d in ("float8_e4m3fn", "float8_e5m2") for n, b in by_dtype[d])


def test_transformer_engine_casts_a_weight_once_for_all_micro_batches():
    """TE caches a weight's fp8 copy and its transpose across micro-batches
    (`is_first_microbatch`): a second micro-batch casts its activations and gradients again,
    its weights not at all."""
    from torch import nn

    from workloads.flavors import get_flavor
    from workloads.models import build_model

    one = _fp8_bytes_written(capture(_one_micro_batch("transformer-engine")).traces[0])
    two = _fp8_bytes_written(capture(_job("transformer-engine")).traces[0])
    model = build_model(get_flavor("llama-debug"))
    weights = sum(
        m.weight.numel()
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and name != "output"
    )
    both_layouts = 2 * weights  # one byte an element, each layout once
    assert two - one == one - both_layouts > 0


@pytest.mark.parametrize(("recompute", "recomputed_amax"), [("selective", False), ("full", True)])
def test_a_recomputed_cast_reduces_again_only_when_the_checkpoint_did_not_keep_max(
    recompute, recomputed_amax
):
    """torchtitan's op-level policy keeps `max`: a cast rerun in backward takes its amax from
    the checkpoint's store and runs only the cast kernel. Full recompute keeps nothing."""
    from emulator.capture.trace import PHASES

    spec = _spec("fused") | {"train": {"precision": "fp8", "recompute": recompute}}
    spec["kernels"] |= {"framework": "torchtitan"}
    trace = capture(job_spec_from_dict(spec)).traces[0]
    atens = trace.text("aten")
    rerun = (trace["kind"] == COMPUTE) & (trace["phase"] == PHASES.index("recompute"))
    recomputed = collections.Counter(atens[i] for i in np.flatnonzero(rerun))
    assert recomputed["aten._to_copy"] > 0
    assert (recomputed["aten.amax"] > 0) == recomputed_amax


def test_each_fp8_gemm_reads_what_a_cast_wrote_though_its_layout_copy_is_dropped():
    """torchao copies a backward operand into the layout `_scaled_mm` takes; the rule drops
    that copy's kernel, and the GEMM's row reports the cast's storage in its flows, so the
    torch.compile rule sees the cast's reader."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from emulator.capture.fp8_casts import fused_fp8_casts
    from emulator.capture.op_recorder import OpRecorder

    with FakeTensorMode():
        linear = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False))
        config = Float8LinearConfig.from_recipe_name("tensorwise")
        convert_to_float8_training(linear, config=config)
        recorder = OpRecorder()
        recorder.record_flows = True
        with recorder, fused_fp8_casts(recorder, compiled=True):
            linear(torch.randn(16, 64, requires_grad=True)).sum().backward()
    rows = [e for e in recorder.events if e.kind == COMPUTE]
    cast_outputs = {e.flows[-1] for e in rows if e.aten == "aten._to_copy"}
    gemms = [e for e in rows if e.aten == "aten._scaled_mm"]
    assert len(gemms) == 3  # forward, input gradient, weight gradient
    assert all(set(e.flows[:2]) <= cast_outputs for e in gemms)
    # each operand's two casts write two layouts: the one read through a copy is recorded
    # transposed (so the compile rule's CSE does not take one for the other)
    written = collections.defaultdict(list)  # high-precision shape -> shapes the casts wrote
    for e in rows:
        if e.aten == "aten._to_copy":
            written[e.tensors[0][0]].append(e.tensors[-1][0])
    weight, gradient = (64, 32), (16, 32)  # the weight as w.t(), the output gradient
    assert written[weight] == [weight, weight[::-1]]
    assert written[gradient] == [gradient, gradient[::-1]]
    # only the gradient's second cast (A of the weight gradient: a row-major copy of the cast's
    # transpose) runs its loop over its output and reads the gradient transposed; B's copies
    # (the weight's, the input's) read their source in order
    transposed = [e for e in rows if e.transposed_reads]
    assert [e.tensors[0][0] for e in transposed] == [gradient]
    assert transposed[0].transposed_reads == transposed[0].flows[:1]
