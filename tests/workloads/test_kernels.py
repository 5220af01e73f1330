"""Tests for workloads/kernels.py: each framework's kernel choices, the rules that refuse
bad ones, and the padded vocabulary."""

import pytest

from prismbench.spec import job_spec_from_dict
from workloads.config import SpecError
from workloads.kernels import (
    CHOICES,
    FRAMEWORKS,
    KernelsSpec,
    framework_fallback_notes,
    moot_overrides,
    padded_vocab,
    research_program_notes,
)


def test_every_framework_has_a_valid_choice_for_every_field():
    for framework in FRAMEWORKS:
        spec = KernelsSpec(framework=framework)
        for name, (allowed, _) in CHOICES.items():
            assert getattr(spec, name) in allowed
        assert spec.vocab_multiple >= 1
        assert spec.overrides() == {}


def test_a_field_given_next_to_the_framework_overrides_its_choice():
    spec = KernelsSpec(framework="megatron", vocab_multiple=64)
    assert spec.vocab_multiple == 64
    assert spec.overrides() == {"vocab_multiple": 64}


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"framework": "deepspeed"}, "kernels.framework"),
        ({"loss": "magic"}, "kernels.loss"),
        ({"vocab_multiple": 0}, "kernels.vocab_multiple"),
        ({"pipeline_recv": "never"}, "kernels.pipeline_recv"),
        ({"attention": "xformers"}, "kernels.attention"),
    ],
)
def test_bad_choices_name_the_field(kwargs, field):
    with pytest.raises(SpecError, match=field):
        KernelsSpec(**kwargs)


def test_the_job_spec_reads_a_kernels_section_and_refuses_unknown_keys():
    tables = {"model": {"name": "gpt2-124m"}, "batch": {"seq_len": 128, "global_batch": 2}}
    assert job_spec_from_dict(tables).kernels.framework == "prism-86a4f47"
    job = job_spec_from_dict({**tables, "kernels": {"framework": "llm.c"}})
    assert job.kernels.framework == "llm.c"
    assert job.to_dict()["kernels"]["framework"] == "llm.c"
    with pytest.raises(SpecError, match="kernels: unknown key"):
        job_spec_from_dict({**tables, "kernels": {"fused": True}})


def test_padded_vocab_rounds_up_to_the_multiple():
    assert padded_vocab(50257, 128) == 50304
    assert padded_vocab(50304, 128) == 50304
    assert padded_vocab(50257, 1) == 50257


def test_padding_multiplies_the_multiple_by_tp_as_megatron_does():
    assert padded_vocab(50257, 128, tp=8) == 51200  # Megatron's GPT-2 vocabulary at tp 8
    assert padded_vocab(51200, 128, tp=8) == 51200  # an already padded vocabulary stays
    assert padded_vocab(50257, 1, tp=8) == 50257  # 1: no padding at any tp


def _job(kernels: dict, parallel: dict | None = None, train: dict | None = None):
    return job_spec_from_dict(
        {
            "model": {"name": "gpt2-124m"},
            "parallel": parallel or {},
            "batch": {"seq_len": 128, "global_batch": 2},
            "train": train or {},
            "kernels": kernels,
        }
    )


def test_an_override_that_changes_nothing_for_the_job_is_said():
    ring = {"cp_attention": "ring"}  # the default framework's choice: all-gather
    assert moot_overrides(_job(ring)) == [
        "kernels.cp_attention='ring' changes nothing for this job: parallel.cp = 1"
    ]
    assert moot_overrides(_job(ring, {"cp": 2})) == []  # context parallelism: it acts
    # the framework's own choice, written out, overrides nothing
    assert moot_overrides(_job({"cp_attention": "all-gather"})) == []
    fp8 = {"fp8_recipe": "rowwise"}
    assert moot_overrides(_job(fp8, train={"precision": "fp8"})) == []
    assert moot_overrides(_job(fp8)) == [
        "kernels.fp8_recipe='rowwise' changes nothing for this job: train.precision is not fp8"
    ]


@pytest.mark.parametrize(
    ("kernels", "moot", "acting"),
    [
        # a block checkpointed whole keeps only its input, whatever sp_regather says
        ({"sp_regather": True}, ({"tp": 2}, {"recompute": "full"}), ({"tp": 2}, {})),
        # Megatron sends a sequence-parallel activation whole: it is split already
        ({"framework": "megatron", "pipeline_transfer": "whole"}, ({"tp": 2, "pp": 2}, {}),
         ({"tp": 2, "pp": 2, "sequence_parallel": False}, {})),
        # the split is over the tp group: with none, the activation goes whole
        ({"framework": "megatron", "pipeline_transfer": "whole"}, ({"pp": 2}, {}),
         ({"tp": 2, "pp": 2, "sequence_parallel": False}, {})),
        # RoPE and position-masked attention only: GPT-2's learned positions at cp 1 run neither
        ({"custom_ops": "fused"}, ({}, {}), ({"cp": 2}, {})),
        # one data-parallel rank launches no reduction at all
        ({"dp_grad_collective": "all-reduce"}, ({"zero": 1}, {}), ({"zero": 1, "dp": 2}, {})),
        ({"grad_reduce": "after-backward"}, ({}, {}), ({"dp": 2}, {})),
        # one data-parallel rank of a pipeline still scales its gradients in the buckets
        ({"grad_reduce": "after-backward"}, ({}, {}), ({"pp": 2}, {})),
        ({"grad_reduce": "after-backward"}, ({"zero": 3, "dp": 2}, {}), ({"cp": 2}, {})),
    ],
)  # fmt: skip
def test_an_override_the_program_never_reads_for_the_job_is_said(kernels, moot, acting):
    # each emulated (gpt-debug) to the same iteration time and memory as its opposite choice,
    # and nothing was said: an override silently ignored
    [note] = moot_overrides(_job(kernels, *moot))
    assert note.startswith(f"kernels.{[*kernels][-1]}=") and "changes nothing for this job" in note
    assert moot_overrides(_job(kernels, *acting)) == []


def test_what_the_default_framework_runs_unlike_production_is_said():
    """ALiBi as eager fp32 math and unfused fp8 casts: said under the default framework, not
    under one that fuses them, nor for a job they do not concern."""
    alibi = {"model": {"name": "mpt-1b"}, "batch": {"seq_len": 128, "global_batch": 2}}
    [note] = research_program_notes(job_spec_from_dict(alibi))
    assert "ALiBi" in note and "custom_ops = 'eager'" in note
    assert research_program_notes(job_spec_from_dict(alibi | {"kernels": {"framework": "llm-foundry"}})) == []
    [note] = research_program_notes(_job({}, train={"precision": "fp8"}))
    assert "fp8 casts run unfused" in note
    compiled = {"compile": True, "fp8_recipe": "tensorwise"}
    assert research_program_notes(_job(compiled, train={"precision": "fp8"})) == []
    assert research_program_notes(_job({})) == []  # bf16 GPT-2, learned positions


def test_a_choice_the_framework_revises_for_the_job_is_not_an_override():
    # torchtitan keeps no FSDP unit gathered when pipelined (fsdp_reshard "none", its own
    # choice for pp > 1): not given by the spec, so nothing to say at zero 1
    job = _job({"framework": "torchtitan"}, {"pp": 2, "zero": 1})
    assert job.kernels.fsdp_reshard == "none" and moot_overrides(job) == []


def test_the_model_is_built_with_the_padded_vocabulary_and_explain_counts_it():
    from prismbench.explain import explain
    from workloads.models import build_model

    unpadded, padded = _job({}), _job({"framework": "llm.c"})
    assert unpadded.built_model is unpadded.model
    assert (padded.model.vocab, padded.built_model.vocab) == (50257, 50304)
    model = build_model(padded.built_model)  # tied: one [50304, 768] matrix
    assert model.tok_embeddings.weight.shape == (50304, 768)
    assert model.output.weight is model.tok_embeddings.weight
    rows = explain(padded).stages[0].params_per_rank - explain(unpadded).stages[0].params_per_rank
    assert rows == (50304 - 50257) * 768
    tp2 = _job({"framework": "megatron"}, {"tp": 2})
    assert tp2.built_model.vocab == 50432  # 128 * 2 * 197


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"compile": "yes"}, "kernels.compile='yes' must be a boolean"),
        ({"async_tp": 1}, "kernels.async_tp=1 must be a boolean"),
        ({"async_tp": True}, "kernels.async_tp=true needs kernels.compile=true"),
        ({"compile": True, "fp8_casts": "unfused"}, "kernels.fp8_casts='unfused' contradicts"),
    ],
)
def test_bad_compile_settings_name_the_field_and_rule(kwargs, message):
    with pytest.raises(SpecError, match=message):
        KernelsSpec(**kwargs)


def test_torchtitan_defaults_to_eager_without_async_tp_and_compile_fuses_fp8_casts():
    eager = KernelsSpec(framework="torchtitan")
    assert (eager.compile, eager.async_tp, eager.fp8_casts) == (False, False, "unfused")
    compiled = KernelsSpec(framework="torchtitan", compile=True)
    assert compiled.fp8_casts == "fused"
    assert compiled.overrides() == {"compile": True, "fp8_casts": "fused"}
    assert KernelsSpec(framework="megatron").fp8_casts == "transformer-engine"


@pytest.mark.parametrize(
    "parallel, message",
    [
        ({}, r"kernels.async_tp=true needs parallel.tp > 1 \(tp=1\)"),
        ({"tp": 2, "sequence_parallel": False}, "needs parallel.sequence_parallel=true"),
    ],
)
def test_async_tp_needs_sequence_parallel_tensor_parallelism(parallel, message):
    kernels = {"compile": True, "async_tp": True}
    with pytest.raises(SpecError, match=message):
        _job(kernels, parallel)
    job = _job(kernels, {"tp": 2})
    assert job.kernels.async_tp and job.to_dict()["kernels"]["async_tp"] is True


def test_llm_foundry_runs_triton_attention_megatron_unfused_and_the_others_flash():
    assert KernelsSpec(framework="llm-foundry").attention == "triton"
    assert KernelsSpec(framework="megatron").attention == "unfused"
    # torchtitan's published runs: torch of Dec 2024, whose SDPA tried FlashAttention-2 first
    assert KernelsSpec(framework="torchtitan").attention == "flash2"
    others = set(FRAMEWORKS) - {"llm-foundry", "megatron", "torchtitan"}
    assert {KernelsSpec(framework=f).attention for f in others} == {"flash"}
    assert KernelsSpec(framework="llm-foundry", attention="flash").overrides() == {
        "attention": "flash"
    }


@pytest.mark.parametrize(
    ("kernels", "parallel", "train", "message"),
    [
        (
            {"framework": "megatron"},
            {"cp": 2},
            {},
            "kernels.attention='unfused' needs parallel.cp=1",
        ),
        ({}, {}, {"attention_dropout": 0.1}, "train.attention_dropout=0.1 needs kernels.attention"),
        (
            {"attention": "unfused"},
            {},
            {"attention_dropout": 1.0},
            "must be a number in \\[0, 1\\)",
        ),
        ({"attention": "unfused"}, {}, {"attention_dropout": True}, "must be a number"),
    ],
)
def test_unfused_attention_and_its_dropout_name_the_field_and_rule(
    kernels, parallel, train, message
):
    with pytest.raises(SpecError, match=message):
        job_spec_from_dict(
            {
                "model": {"name": "gpt-debug"},
                "parallel": parallel,
                "batch": {"seq_len": 32, "global_batch": 2},
                "train": train,
                "kernels": kernels,
            }
        )


def test_only_the_workloads_at_86a4f47_run_their_custom_ops_as_eager_math():
    assert KernelsSpec(framework="prism-86a4f47").custom_ops == "eager"
    others = set(FRAMEWORKS) - {"prism-86a4f47"}
    assert {KernelsSpec(framework=f).custom_ops for f in others} == {"fused"}


def test_megatron_and_nemo_recompute_only_the_core_attention_when_selective():
    assert {KernelsSpec(framework=f).selective_recompute for f in ("megatron", "nemo")} == {
        "core-attention"
    }
    assert KernelsSpec(framework="prism-86a4f47").selective_recompute == "op-prism-86a4f47"
    others = set(FRAMEWORKS) - {"megatron", "nemo", "prism-86a4f47"}
    assert {KernelsSpec(framework=f).selective_recompute for f in others} == {"op"}


def test_megatron_and_nemo_recompute_a_checkpointed_region_whole():
    assert {KernelsSpec(framework=f).recompute_reruns for f in ("megatron", "nemo")} == {"all"}
    others = set(FRAMEWORKS) - {"megatron", "nemo"}
    assert {KernelsSpec(framework=f).recompute_reruns for f in others} == {"needed"}


def test_the_86a4f47_float8_linears_cannot_take_the_fused_cast_rule():
    from workloads.kernels import KernelsSpec as Kernels

    assert Kernels().fp8_recipe == "prism-86a4f47"
    with pytest.raises(SpecError, match="needs a torchao kernels.fp8_recipe"):
        job_spec_from_dict(
            {
                "model": {"name": "llama-debug"},
                "batch": {"seq_len": 32, "global_batch": 2},
                "train": {"precision": "fp8"},
                "kernels": {"compile": True},
            }
        )


def test_transformer_engine_casts_keep_one_scale_per_tensor():
    def fp8_job(kernels):
        return job_spec_from_dict(
            {
                "model": {"name": "llama-debug"},
                "batch": {"seq_len": 32, "global_batch": 2},
                "train": {"precision": "fp8"},
                "kernels": kernels,
            }
        )

    for framework in ("megatron", "nemo", "llm-foundry"):
        kernels = fp8_job({"framework": framework}).kernels
        assert (kernels.fp8_casts, kernels.fp8_recipe) == ("transformer-engine", "tensorwise")
    with pytest.raises(SpecError, match="fp8_casts='transformer-engine' needs kernels.fp8_recipe"):
        fp8_job({"framework": "megatron", "fp8_recipe": "rowwise"})


def test_megatron_nemo_and_llm_c_step_adamw_in_one_fused_kernel():
    fused = {"megatron", "nemo", "llm.c"}
    assert {KernelsSpec(framework=f).optimizer_step for f in fused} == {"fused"}
    assert {KernelsSpec(framework=f).optimizer_step for f in set(FRAMEWORKS) - fused} == {"foreach"}


def _train_job(precision: str, kernels: dict, zero: int = 0):
    return job_spec_from_dict(
        {
            "model": {"name": "gpt2-124m"},
            "parallel": {"dp": 2, "zero": zero},
            "batch": {"seq_len": 128, "global_batch": 2},
            "train": {"precision": precision},
            "kernels": kernels,
        }
    )


def test_megatron_accumulates_fp16_gradients_in_fp16_and_bf16_ones_in_fp32():
    # Megatron-LM turns accumulate_allreduce_grads_in_fp32 on for bf16 only
    megatron = {"framework": "megatron"}
    assert _train_job("fp16", megatron).kernels.grad_accumulation == "model-dtype"
    assert _train_job("bf16", megatron).kernels.grad_accumulation == "fp32"
    assert _train_job("fp16", megatron, zero=3).kernels.grad_accumulation == "fp32"
    assert _train_job("fp16", {"framework": "nemo"}).kernels.grad_accumulation == "fp32"
    # still the framework's choice after its pipeline fell back to torch's pipelining
    fallback = job_spec_from_dict(
        {
            "model": {"name": "gpt-debug"},
            "parallel": {"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b"},
            "batch": {"seq_len": 16, "micro_batch": 1, "global_batch": 3},
            "train": {"precision": "bf16"},
            "kernels": megatron,
        }
    ).kernels
    assert (fallback.pipeline_recv, fallback.grad_accumulation) == ("per-microbatch", "fp32")
    # a spec's own choice is kept (torch DDP keeps bf16 gradients in bf16)
    given = {"framework": "megatron", "grad_accumulation": "model-dtype"}
    assert _train_job("bf16", given).kernels.grad_accumulation == "model-dtype"


def test_model_dtype_gradients_are_refused_under_fsdp_and_halve_explains_grad_bytes():
    from prismbench.explain import explain

    with pytest.raises(SpecError, match=r"grad_accumulation='model-dtype' needs parallel.zero"):
        _train_job("bf16", {"grad_accumulation": "model-dtype"}, zero=3)
    fp32 = explain(_train_job("fp16", {"framework": "megatron", "grad_accumulation": "fp32"}))
    fp16 = explain(_train_job("fp16", {"framework": "megatron"}))
    assert fp32.stages[0].grads_bytes == 2 * fp16.stages[0].grads_bytes
    assert fp16.state_bytes_per_param == (2, 2, 4, 8)


def test_megatron_and_nemo_overlap_the_input_gradient_collective_with_the_weight_gradient():
    overlapped = {f for f in FRAMEWORKS if KernelsSpec(framework=f).tp_grad_overlap}
    assert overlapped == {"megatron", "nemo"}
    assert KernelsSpec(framework="megatron", tp_grad_overlap=False).overrides() == {
        "tp_grad_overlap": False
    }
    with pytest.raises(SpecError, match="kernels.tp_grad_overlap='no' must be a boolean"):
        KernelsSpec(tp_grad_overlap="no")


def test_megatron_and_nemo_keep_the_sequence_shard_and_gather_it_again_in_backward():
    regathered = {f for f in FRAMEWORKS if KernelsSpec(framework=f).sp_regather}
    assert regathered == {"megatron", "nemo"}
    assert KernelsSpec(framework="torchtitan", sp_regather=True).overrides() == {
        "sp_regather": True
    }
    with pytest.raises(SpecError, match="kernels.sp_regather=1 must be a boolean"):
        KernelsSpec(sp_regather=1)


def test_megatron_and_nemo_run_the_sequence_collectives_along_the_first_dimension():
    first_dim = {f for f in FRAMEWORKS if KernelsSpec(framework=f).sp_collectives == "first-dim"}
    assert first_dim == {"megatron", "nemo"}
    assert KernelsSpec(framework="torchtitan").sp_collectives == "dtensor"
    with pytest.raises(SpecError, match="kernels.sp_collectives='sbh' must be one of"):
        KernelsSpec(sp_collectives="sbh")


def test_torchtitan_keeps_every_fsdp_unit_gathered_when_it_pipelines():
    # torchtitan's apply_fsdp (9dec370): reshard_after_forward=False for every unit with pp,
    # every block but the last (and not the root) without it
    def job(pp: int, kernels: dict):
        return job_spec_from_dict(
            {
                "model": {"name": "llama-debug"},
                "parallel": {"pp": pp, "dp": 2, "zero": 3},
                "batch": {"seq_len": 16, "micro_batch": 1, "global_batch": 4},
                "kernels": kernels,
            }
        ).kernels

    torchtitan = {"framework": "torchtitan"}
    assert job(1, torchtitan).fsdp_reshard == "not-root-or-last"
    assert job(2, torchtitan).fsdp_reshard == "none"
    assert job(2, {"framework": "llm-foundry"}).fsdp_reshard == "not-root"
    # a spec's own choice is kept under pipelining
    assert job(2, torchtitan | {"fsdp_reshard": "all"}).fsdp_reshard == "all"
    with pytest.raises(SpecError, match="kernels.fsdp_reshard='some' must be one of"):
        KernelsSpec(fsdp_reshard="some")


@pytest.mark.parametrize(
    ("attention", "flash_only"), [("flash2", True), ("flash", False), ("triton", False)]
)
def test_flash2_makes_every_block_ask_sdpa_for_its_flash_backend(attention, flash_only):
    """`flash2` prices FlashAttention-2; on a GPU torch 2.11's SDPA would pick cuDNN unless
    told, so the blocks ask for the flash backend (CPU and capture are unaffected). `triton`
    changes the price only: its blocks are `flash`'s, whose parity runs prove it."""
    from workloads.flavors import get_flavor
    from workloads.models import build_model
    from workloads.parallelize import set_kernels

    job = job_spec_from_dict(
        {"model": {"name": "llama-debug"}, "batch": {"seq_len": 32, "global_batch": 2},
         "kernels": {"framework": "torchtitan", "attention": attention}}
    )  # fmt: skip
    model = build_model(get_flavor("llama-debug"))
    set_kernels(model, job)
    cores = [block.attention.core_attention for block in model.layers.values()]
    assert cores and all(core.flash_only is flash_only for core in cores)
    assert not any(core.unfused for core in cores)


def test_a_megatron_pipeline_its_executor_cannot_run_is_said_to_run_torch_s():
    # Megatron's interleaved schedule needs a multiple of pp micro-batches: 6 on pp 4 is not
    tables = {"model": {"name": "llama-debug", "layers": 8},
              "parallel": {"pp": 4, "vpp": 2, "schedule": "interleaved-1f1b"},
              "batch": {"seq_len": 64, "micro_batch": 1, "global_batch": 6},
              "kernels": {"framework": "megatron"}}  # fmt: skip
    job = job_spec_from_dict(tables)
    assert job.kernels.pipeline_recv == "per-microbatch"
    [note] = framework_fallback_notes(job)
    assert "kernels.framework='megatron' runs its pipelines with Megatron's executor" in note
    assert "micro-batches per iteration(6) to be a multiple of pp(4)" in note
    assert "torch's pipelining runs it" in note
    tables["batch"]["global_batch"] = 8  # a multiple: Megatron's executor runs it, nothing said
    assert framework_fallback_notes(job_spec_from_dict(tables)) == []
    given = tables | {"kernels": {"framework": "megatron", "pipeline_recv": "per-microbatch"}}
    assert framework_fallback_notes(job_spec_from_dict(given)) == []  # the spec's own choice
