"""The training job the workloads run, as typed, validated sections.

`TrainingJob` holds the model (`ModelSpec`), the parallel layout, the batch, the training
settings and the kernels (`workloads.kernels`), each a frozen dataclass checked where it is built; a broken rule raises `SpecError`
naming the field and the numbers. The cluster the job runs on, and TOML loading, live in
`prismbench.spec`, whose `JobSpec` is a TrainingJob with a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from workloads.config import (
    MULTI_STAGE_SCHEDULES,
    SINGLE_STAGE_SCHEDULES,
    ModelSpec,
    SpecError,
    check_choice,
    check_flag,
    check_positive_ints,
    check_schedule,
    check_tensor_parallel,
    stage_layer_counts,
)
from workloads.kernels import KernelsSpec, padded_vocab

SCHEDULES = (*SINGLE_STAGE_SCHEDULES, *MULTI_STAGE_SCHEDULES)
PRECISIONS = ("bf16", "fp16", "fp8", "fp32")
RECOMPUTE_MODES = ("none", "selective", "full")
OPTIMIZERS = ("adamw",)
MODEL_INITS = ("auto", "device", "meta")
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True, kw_only=True)
class ParallelSpec:
    """How the job is split: degrees of tensor, pipeline, context and data parallelism."""

    tp: int = 1
    sequence_parallel: bool | None = None  # default: on whenever tp > 1 (Megatron's advice)
    pp: int = 1
    vpp: int = 1
    schedule: str = "1f1b"
    cp: int = 1  # causal CP is load-balanced: 2*cp chunks, rank i holds i and 2cp-1-i (Llama 3)
    dp: int = 1
    zero: int = 0

    def __post_init__(self) -> None:
        check_positive_ints("parallel", self, ("tp", "pp", "vpp", "cp", "dp"))
        check_choice("parallel", "schedule", self.schedule, SCHEDULES)
        check_choice("parallel", "zero", self.zero, ZERO_STAGES)
        if self.sequence_parallel is None:
            object.__setattr__(self, "sequence_parallel", self.tp > 1)
        check_flag("parallel", "sequence_parallel", self.sequence_parallel)
        if self.sequence_parallel and self.tp == 1:
            raise SpecError("parallel.sequence_parallel=true needs tp > 1 (tp=1)")
        if self.schedule != "1f1b" and self.pp == 1:
            raise SpecError(f"parallel.schedule={self.schedule!r} needs pp > 1 (pp=1)")

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.cp * self.tp


@dataclass(frozen=True, kw_only=True)
class BatchSpec:
    """Sequence length and batch sizes (global_batch in sequences, micro_batch per rank)."""

    seq_len: int
    micro_batch: int = 1
    global_batch: int

    def __post_init__(self) -> None:
        check_positive_ints("batch", self, ("seq_len", "micro_batch", "global_batch"))


@dataclass(frozen=True, kw_only=True)
class TrainSpec:
    """Numerics and memory-saving choices of the training step."""

    precision: str = "bf16"  # fp8 = fp8 GEMMs in linear layers, bf16 elsewhere (torchtitan float8)
    recompute: str = "none"
    optimizer: str = "adamw"
    # probability of dropping an attention probability (Megatron's --attention-dropout); only
    # the unfused attention takes it (TrainingJob checks)
    attention_dropout: float = 0.0
    # where the program builds its model: "device" builds the whole model in fp32 on the GPU,
    # then casts and shards it (a plain script; the freed fp32 segments stay cached); "meta"
    # builds it on meta and materialises this rank's shards in place (torchtitan; nothing
    # freed); "auto": "device" for one GPU, "meta" for several (TrainingJob.builds_on_meta)
    model_init: str = "auto"

    def __post_init__(self) -> None:
        check_choice("train", "precision", self.precision, PRECISIONS)
        check_choice("train", "recompute", self.recompute, RECOMPUTE_MODES)
        check_choice("train", "optimizer", self.optimizer, OPTIMIZERS)
        check_choice("train", "model_init", self.model_init, MODEL_INITS)
        p = self.attention_dropout
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise SpecError(f"train.attention_dropout={p!r} must be a number in [0, 1)")
        object.__setattr__(self, "attention_dropout", float(p))


@dataclass(frozen=True, kw_only=True)
class TrainingJob:
    """What the workloads run: the model, its parallel layout, batch, training settings and kernels.

    Cross-section rules that need no hardware are checked here; the cluster and what it
    allows (prismbench.spec.JobSpec) sit one floor up."""

    model: ModelSpec
    parallel: ParallelSpec = field(default_factory=ParallelSpec)
    batch: BatchSpec
    train: TrainSpec = field(default_factory=TrainSpec)
    kernels: KernelsSpec = field(default_factory=KernelsSpec)

    def __post_init__(self) -> None:
        p = self.parallel
        check_tensor_parallel(self.model, p.tp)
        stage_layer_counts(self.model.layers, p.pp * p.vpp)
        self._check_batch()
        kernels = self.kernels.for_pipeline(p.schedule, p.pp, self.num_microbatches)
        kernels = kernels.for_precision(self.train.precision, p.zero)
        kernels = kernels.for_model(self.model.family, self.model.positions)
        object.__setattr__(self, "kernels", kernels)
        check_schedule(p.schedule, p.pp, p.vpp, self.num_microbatches, self.kernels.pipeline_recv)
        self._check_recompute()
        self._check_zero_bubble_fsdp()
        self._check_async_tp()
        self._check_attention()
        self._check_fp8()

    def _check_fp8(self) -> None:
        """The cast rules know torchao's casts only, and Transformer Engine's delayed scaling
        keeps one scale per tensor (emulator.capture.fp8_casts)."""
        k = self.kernels
        if self.train.precision != "fp8":
            return
        if k.fp8_recipe == "prism-86a4f47" and k.fp8_casts != "unfused":
            raise SpecError(
                f"kernels.fp8_casts={k.fp8_casts!r} (or kernels.compile=true) needs a torchao "
                "kernels.fp8_recipe with train.precision='fp8': the cast rules rewrite "
                "torchao's casts, not those of the prism-86a4f47 float8 linears"
            )
        if k.fp8_casts == "transformer-engine" and k.fp8_recipe != "tensorwise":
            raise SpecError(
                f"kernels.fp8_casts='transformer-engine' needs kernels.fp8_recipe='tensorwise' "
                f"(got {k.fp8_recipe!r}): Transformer Engine's delayed scaling keeps one scale "
                "per tensor"
            )

    def _check_attention(self) -> None:
        """The unfused attention masks by sequence order (no context parallelism, which Megatron
        of 2021-22 did not have); dropout runs only there: the fused kernels' in-kernel dropout
        is not modelled."""
        if self.kernels.attention == "unfused" and self.parallel.cp > 1:
            raise SpecError(
                f"kernels.attention='unfused' needs parallel.cp=1 (cp={self.parallel.cp}): "
                "context-parallel attention runs a fused kernel on gathered keys; set "
                "kernels.attention='flash'"
            )
        if self.train.attention_dropout and self.kernels.attention != "unfused":
            raise SpecError(
                f"train.attention_dropout={self.train.attention_dropout} needs "
                f"kernels.attention='unfused' (is {self.kernels.attention!r}): dropout inside "
                "a fused attention kernel is not modelled"
            )

    def _check_recompute(self) -> None:
        """Zero-bubble's split backward computes a block's weight gradients apart from its
        input gradients; torch's composable `checkpoint` (workloads.recompute) recomputes the
        block inside a context that cannot be entered twice, so the real program fails at the
        first weight-gradient step (torch 2.13, on CPU as under capture)."""
        if self.parallel.schedule == "zero-bubble" and self.train.recompute != "none":
            raise SpecError(
                f"parallel.schedule='zero-bubble' needs train.recompute='none' (is "
                f"{self.train.recompute!r}): its split backward enters the recompute of torch's "
                "composable checkpoint twice, which torch refuses"
            )

    def _check_zero_bubble_fsdp(self) -> None:
        """Zero-bubble's weight backward (torch's `stage_backward_weight`) computes the
        gradients of the parameters a stage's module holds when its input backward runs; an
        FSDP unit that reshards after forward holds its sharded parameters then, not the
        gathered ones forward used, so none of its weight gradients is computed: every stage
        but the first (whose weight step reruns its whole backward) neither reduces gradients
        nor steps, silently (torch 2.13, on CPU as under capture)."""
        p, reshard = self.parallel, self.kernels.fsdp_reshard
        if p.schedule == "zero-bubble" and p.zero == 3 and reshard != "none":
            raise SpecError(
                f"parallel.schedule='zero-bubble' with parallel.zero=3 needs "
                f"kernels.fsdp_reshard='none' (is {reshard!r}): its split backward computes no "
                "weight gradient for parameters FSDP resharded after forward"
            )

    def _check_async_tp(self) -> None:
        """Async TP overlaps sequence parallelism's all-gathers and reduce-scatters with the
        GEMMs next to them (workloads.kernels): without them there is nothing to overlap."""
        if not self.kernels.async_tp:
            return
        p = self.parallel
        if p.tp == 1:
            raise SpecError("kernels.async_tp=true needs parallel.tp > 1 (tp=1)")
        if not p.sequence_parallel:
            raise SpecError(
                "kernels.async_tp=true needs parallel.sequence_parallel=true: it overlaps "
                "sequence parallelism's all-gathers and reduce-scatters with their GEMMs"
            )

    def _check_batch(self) -> None:
        p, b = self.parallel, self.batch
        if b.global_batch % (p.dp * b.micro_batch):
            raise SpecError(
                f"batch.global_batch({b.global_batch}) is not divisible by "
                f"parallel.dp({p.dp}) * batch.micro_batch({b.micro_batch})"
            )
        if p.cp > 1 and b.seq_len % (2 * p.cp):
            raise SpecError(
                f"batch.seq_len({b.seq_len}) is not divisible by 2*cp({2 * p.cp}) "
                "(load-balanced causal context parallelism)"
            )
        if p.sequence_parallel and (b.seq_len // p.cp) % p.tp:
            raise SpecError(
                f"batch.seq_len({b.seq_len}) / cp({p.cp}) is not divisible by tp({p.tp}): "
                "sequence parallelism shards each rank's sequence over the tp group"
            )
        if self.model.positions == "learned" and b.seq_len > self.model.max_seq_len:
            raise SpecError(
                f"batch.seq_len({b.seq_len}) exceeds model.max_seq_len({self.model.max_seq_len}) "
                "of the learned position table"
            )

    @property
    def world_size(self) -> int:
        return self.parallel.world_size

    @property
    def model_built_on(self) -> str:
        """`train.model_init` resolved: "meta" where the real program builds the model on meta
        and materialises only this rank's shards, "device" where it builds the whole model in
        fp32 on the device before casting and sharding it ("auto": on the device for one GPU,
        as the shared H100 measurements ran it, on meta for several ranks, what a large job
        must do)."""
        if self.train.model_init == "auto":
            return "meta" if self.world_size > 1 else "device"
        return self.train.model_init

    @property
    def builds_on_meta(self) -> bool:
        return self.model_built_on == "meta"

    @property
    def init_device(self) -> str | None:
        """`workloads.build_training`'s `init_device` for the real program: "meta" where it
        builds on meta (`builds_on_meta`), else None (on the device it runs on)."""
        return "meta" if self.builds_on_meta else None

    @property
    def built_model(self) -> ModelSpec:
        """The model as built: its vocabulary padded as `kernels.vocab_multiple` says
        (`workloads.kernels.padded_vocab`); labels stay below `model.vocab`."""
        vocab = padded_vocab(self.model.vocab, self.kernels.vocab_multiple, self.parallel.tp)
        return self.model if vocab == self.model.vocab else replace(self.model, vocab=vocab)

    @property
    def num_microbatches(self) -> int:
        return self.batch.global_batch // (self.parallel.dp * self.batch.micro_batch)

    @property
    def local_batch_rows(self) -> int:
        """Sequences one data-parallel rank consumes per iteration (all its micro-batches)."""
        return self.num_microbatches * self.batch.micro_batch

    @property
    def tokens_per_iteration(self) -> int:
        return self.batch.global_batch * self.batch.seq_len

    @property
    def stage_layers(self) -> tuple[int, ...]:
        """Layers per virtual pipeline stage (pp * vpp entries), by the rule in workloads.config."""
        return stage_layer_counts(self.model.layers, self.parallel.pp * self.parallel.vpp)
