"""Which kernels the job runs: a production framework's choices, one field per choice.

The emulator predicts the program it captures, so the program must run what the framework
behind a measurement runs. `[kernels] framework = "megatron"` picks that framework's
choices; any field given next to it overrides the framework's value. Each choice is
implemented for real by the workloads (loss-parity tests cover every value). Some fields act
on some jobs only (`MOOT_WHEN`: cp_attention without context parallelism, the fp8 fields in
bf16, ...); an override of one that changes nothing for its job is said by the CLI
(`moot_overrides`), not refused: a resolved spec written out whole names every field.

Frameworks (the values each one selects are in the `*_BY_FRAMEWORK` tables below, with
the source of each):
- `prism-86a4f47`: the workloads as they were when the shared H100 profiles were taken
  (commit 86a4f47); keeps those profiles comparable. The default.
- `megatron`: Megatron-LM / Megatron-DeepSpeed.
- `nemo`: NVIDIA NeMo (Megatron-core with Transformer Engine).
- `llm-foundry`: MosaicML llm-foundry (Composer).
- `torchtitan`: PyTorch torchtitan as its published benchmarks ran it (torchtitan 9dec370,
  torch 1963fc8, Dec 2024: FlashAttention-2 through SDPA, its own float32 RMSNorm); a job of
  today's torchtitan overrides `attention = "flash"` and `norm = "torch"`.
- `llm.c`: Karpathy's llm.c.

Fields:
- `loss`: how the cross-entropy runs (`workloads.loss` implements each value):
  `unfused-fp32` (logits upcast to float32, log-softmax and NLL as separate kernels;
  with tp > 1 Megatron's vocab-parallel formulation), `loss-parallel` (the same at tp = 1;
  with tp > 1 torch's DTensor `loss_parallel()`, as torchtitan: other float32 temporaries),
  `fused` (one kernel each way over the low-precision logits, keeping a float32 logsumexp
  per token; the backward writes a new gradient in the logits' dtype), `fused-inplace` (the
  same, the gradient written over the logits).
- `norm`: which norm kernels run. `torch`: the models' `nn.LayerNorm` / `nn.RMSNorm` on bf16
  parameters run one fused kernel each way on a CUDA build (`aten.native_layer_norm`, and
  `aten._fused_rms_norm` as `emulator.capture.fused_ops` routes it), computing in float32
  inside the kernel and keeping the input plus a float32 mean/rstd per token. Most
  frameworks' norms run the same kernels and keep the same memory: llm-foundry's
  `LPLayerNorm` (llmfoundry/models/layers/norm.py) casts input and weight to the autocast
  dtype and runs `F.layer_norm` with autocast off, so that a norm under `amp_bf16` is a bf16
  kernel, which is what the workloads' bf16 parameters already give; Megatron's fused layer
  norm (Apex `FusedLayerNormAffineFunction`, `persist_layer_norm`'s `FastLayerNormFN`,
  Transformer Engine's `LayerNorm`/`RMSNorm`) is one kernel each way that saves the input and
  float32 mean/rstd; torchtitan has run `nn.RMSNorm` since Mar 2025. Their speed differences
  are the kernel tables' business, not a different program. `eager-fp32`: RMSNorm as the
  float32 eager math of torchtitan's own RMSNorm class before that (`norm_type = "rmsnorm"`
  at 9dec370, the code of its Dec 2024 benchmarks: upcast, square, mean, rsqrt, multiply,
  downcast, weight; `workloads.models.norms`), a different program: eight kernels forward,
  more backward, float32 intermediates kept for backward where nothing recomputes them. It
  is an RMSNorm: a GPT model's LayerNorm (torchtitan's `layernorm` was `nn.LayerNorm`) stays
  `torch` when the framework chose it, and a spec that asks for it there is refused.
- `vocab_multiple`: the embedding and output layer are padded to a multiple of this many
  rows times the tensor-parallel size, as Megatron's `make_vocab_size_divisible_by` does
  (`_vocab_size_with_padding` in megatron/training/tokenizer/tokenizer.py: multiple =
  make_vocab_size_divisible_by * tensor_model_parallel_size). 1: no padding at any tp (the
  vocabulary-parallel layers then split ceil(V/tp) rows per rank, torch.chunk's split).
  Labels stay below the true vocabulary; padded columns take part in the softmax.
- `fp8_recipe`: torchao float8 scaling recipe for `train.precision = "fp8"` (`tensorwise`:
  one scale per tensor; `rowwise`: one per row, power-of-two scales; `rowwise_with_gw_hp`:
  rowwise with the weight-gradient GEMM in high precision), `workloads.float8`; or
  `prism-86a4f47`, the workloads' own tensorwise float8 linears of that commit
  (`workloads.prism_float8`), whose casts the `fused` rule below does not know.
- `fp8_casts`: how the amax/scale/cast work around each fp8 GEMM is recorded: `unfused`,
  the eager op chain (what runs without torch.compile); `fused`, the two kernels per operand
  cast (amax, then cast) that torch.compile generates, dynamic scaling with this step's amax;
  `transformer-engine`, Transformer Engine's delayed scaling: one cast-transpose kernel per
  operand that records the amax as it casts, no per-cast amax collective, no scale
  reciprocals (rules: `emulator.capture.fp8_casts`). It takes the `tensorwise` recipe (one
  scale per tensor, as delayed scaling keeps). The real CPU run is eager either way; the
  choice changes what the capture records.
- `attention`: which fused attention kernel runs on the GPU: `flash`, a FlashAttention-2-class
  kernel (torch's SDPA backends: cuDNN on an H100, FlashAttention-2 on an A100; Transformer
  Engine's fused attention; flash-attn 2), priced by the kernel tables; `triton`, Tri Dao's
  FlashAttention Triton kernel (flash-attn's `flash_attn_triton.py`, vendored by llm-foundry
  for `attn_impl: triton`), about half as fast at long sequences, priced at FlashAttention
  v1's published rates times a ratio per head dim fitted on llm-foundry's rows
  (`emulator.costs.attention_rates`, results/kernels/fit_triton_attention.py); `flash2`, FlashAttention-2 itself where the tables
  measured another kernel (torch's SDPA on an H100 while cuDNN attention was opt-in, from
  torch 2.5.1 until torch 2.11, whose SDPA the shared profiles show running cuDNN; flash-attn
  2), priced at its published rates, 1.3-1.7x slower than the cuDNN kernels of the H100
  table (on a GPU the workloads ask SDPA for its flash backend: the kernel priced runs; a real
  H100 run without that ran cuDNN, 1.4-2.1x faster, results/calibration/README.md). `triton`
  changes the price only: the workloads run `flash`'s program, so on a GPU causal attention
  is SDPA with the backend torch picks (cuDNN on an H100), not flash-attn's Triton kernel, and
  a GPU run of a `triton` job measures another kernel than the one priced. ALiBi and
  position-masked attention (context-parallel chunks) run compiled FlexAttention on a GPU
  under `custom_ops = "fused"` whichever of the three is set (`flash2` included: it forces
  SDPA's backend only), their eager math under `"eager"` (`custom_ops`). All three compute exact attention and keep the output and a float32 logsumexp, so
  the program, its memory and its loss are the same: the choice is what the kernel costs.
  `unfused`: no fused kernel, the score matrix in memory, as
  Megatron-LM ran attention before flash attention (a batched GEMM for the scores, Megatron's
  fused masked-softmax kernel, attention dropout of `train.attention_dropout`, a batched GEMM
  with V: `workloads.models.unfused_attention`); a different program, with the probabilities
  kept for backward (5 a s^2 b bytes per layer with dropout). It needs cp = 1.
- `grad_reduce`: when the data-parallel gradient reduction runs (zero 0 and 1):
  `overlapped`, bucket by bucket as backward completes each (torch DDP, Megatron-core's
  `overlap_grad_reduce`); `after-backward`, each model chunk's whole gradient buffer in one
  collective once every micro-batch's backward is done, exposed (Megatron-LM's local DDP,
  `workloads.zero.DistributedOptimizer(overlap=False)`). FSDP (zero 2, 3) is unaffected.
- `dp_grad_collective`: how zero=1 reduces the gradient buffer over the data-parallel group:
  `reduce-scatter` (each rank receives the sums of its share: Megatron's distributed
  optimizer, every framework's choice) or `all-reduce` (every rank receives all the sums and
  steps its share; the same result with twice the bytes on the wire: DeepSpeed's BF16
  optimizer under its pipeline engine, which all-reduces the fp32 gradients in
  `_bf16_reduce_grads`, as BLOOM ran). zero=0 always all-reduces; FSDP (zero 2, 3) is
  unaffected.
- `pipeline_recv`: the pipeline's receive buffers. "per-microbatch": torch.distributed.
  pipelining, whose stages allocate a receive buffer per micro-batch at setup and keep it;
  "per-transfer": Megatron's 1F1B (`workloads.megatron_schedule`), a buffer allocated by
  each receive and freed once consumed; it runs schedule "1f1b" only, and any number of
  micro-batches (fewer than pp included), and "interleaved-1f1b" with a multiple of pp
  micro-batches (`workloads.config.per_transfer_refusal`). `megatron` and `nemo` choose it
  and fall back to "per-microbatch" for a pipeline it cannot run (`for_pipeline`).
- `pipeline_transfer`: what one stage sends the next (and its gradient back) under tensor
  parallelism: `whole`, the full activation from every tp rank; `scatter-gather`,
  Megatron-LM's `scatter_gather_tensors_in_pipeline`: each tp rank sends its 1/tp slice of the
  flattened activation and the receiving stage all-gathers the slices over tp, so the
  inter-stage link carries 1/tp of the bytes and an intra-node all-gather is added. Megatron
  skips it under sequence parallelism (the activation is already split) and when tp does not
  divide the activation; so does the workload. It needs `pipeline_recv = "per-transfer"`.
- `custom_ops`: how the workloads' own ops run on a GPU, RoPE and position-masked attention
  (ALiBi, context-parallel chunks): `fused`, one kernel each way (`prism::rope`,
  `prism::masked_attention`: Megatron-core's and Transformer Engine's fused RoPE, FlexAttention
  or flash-attn with ALiBi), what production frameworks run (on CUDA: FlexAttention, and
  RoPE's reference math compiled into one kernel, `workloads.models.cuda_kernels`, as the fused
  losses and Megatron's masked softmax are); `eager`, their float32 reference
  math as a chain of eager kernels, the score matrix of the masked attention in memory
  (`workloads.models.eager_ops`): what the workloads at 86a4f47 ran on a GPU, so the shared
  H100 profiles of that commit stay comparable.
- `selective_recompute`: what `train.recompute = "selective"` reruns (`workloads.recompute`):
  `op`, torchtitan's op-level policy at 9dec370 (pointwise ops and every second matmul of each
  block rerun; attention, the other matmuls, float8 amaxes and the `abs` before them kept);
  `op-prism-86a4f47`, the workloads' own at 86a4f47 (the same, `abs` not kept);
  `core-attention`, Megatron's `--recompute-granularity selective` (Korthikanti et al. 2022):
  each block's core attention only.
- `recompute_reruns`: how much of a checkpointed region recomputation reruns: `needed`, until
  backward has every tensor the region saved (torch's non-reentrant checkpoint, early stop: a
  block's last GEMM is not rerun); `all`, the whole region (Megatron's reentrant
  `CheckpointFunction`).
- `compile`: true when the job runs its transformer blocks under `torch.compile` (torchtitan's
  `[compile] enable`, which wraps each TransformerBlock: `apply_compile` in
  torchtitan/models/llama3/infra/parallelize.py). The real CPU run stays eager; the capture
  records what Inductor runs on a GPU instead, by a documented rule
  (`emulator.capture.compile_fusion`, docs/MODELS.md "torch.compile"): within each compiled
  graph, memory-bound ops fuse into kernels by data dependence, as Inductor's scheduler
  fuses them; GEMMs and attention stay extern kernels. It implies `fp8_casts = "fused"`
  (torchtitan docs/float8.md: compile is what fuses torchao's scaling and casting kernels);
  asking for `compile = true` with `fp8_casts = "unfused"` is refused.
- `async_tp`: true when tensor parallelism runs asynchronously (torchtitan's
  `parallelism.enable_async_tensor_parallel`): Inductor's micro-pipeline TP pass
  (torch/_inductor/fx_passes/micro_pipeline_tp.py) replaces each sequence-parallel all-gather
  feeding a GEMM by `fused_all_gather_matmul` and each GEMM feeding a reduce-scatter by
  `fused_matmul_reduce_scatter` (torch/distributed/_symmetric_memory), which overlap the
  transfer with the GEMM chunk by chunk (the overlap rule: `emulator.costs.overlap`). It needs
  `compile = true`, tp > 1 and sequence parallelism, as torchtitan requires (it refuses async TP
  without compile; its TP plan is sequence-parallel). It needs CUDA symmetric memory, so the
  overlap is a model only: the CPU run and the capture are the plain TP program.
- `grad_accumulation`: the dtype of the distributed optimizer's gradient buffer (zero 0 and 1),
  in which gradients are accumulated over micro-batches and reduced over data parallelism:
  `fp32` (Megatron's `accumulate_allreduce_grads_in_fp32`, what bf16 runs use) or
  `model-dtype`, the parameters' dtype (Megatron-LM's default for fp16 runs; torch DDP's `.grad`).
  With `model-dtype` the step casts the reduced gradients to float32 for the master copy (a
  full-size float32 temporary, as Megatron's `_copy_model_grads_to_main_grads`). FSDP (zero 2,
  3) reduces in its own dtype: `model-dtype` is refused there.
- `optimizer_step`: how the AdamW step runs: `foreach`, torch's multi-tensor ops (several
  passes over the fp32 state, with a full-size temporary for the second moment's square
  root); `fused`, one kernel reading parameters, gradients and both moments and writing
  them back (torch's `fused=True`, what apex's FusedAdam, Transformer Engine's and llm.c's
  AdamW kernels do), no temporary.
- `fsdp_reshard`: which FSDP units free their gathered parameters after forward under
  `parallel.zero = 3` (FSDP2's `reshard_after_forward`; zero 2 keeps every unit gathered):
  `all`, every transformer block and the root (embedding, final norm, output layer), each
  gathered again in backward; `not-root`, every block but not the root: FSDP1 (Composer's
  FSDP, llm-foundry) never frees the root's parameters after forward (`_post_forward_reshard`
  in torch/distributed/fsdp/_runtime_utils.py: "Do not free the root's parameters in the
  post-forward for FULL_SHARD"); `not-root-or-last`, every block but the last, whose
  parameters backward needs first, and not the root: the torchtitan of the Dec 2024
  benchmarks passed `reshard_after_forward=False` for the last block
  (torchtitan/parallelisms/parallelize_llama.py `apply_fsdp` at 9dec370), and the FSDP2 of
  its torch (1963fc8) kept the root gathered unconditionally (`FSDPState._lazy_init`: "For
  the root, do not reshard after forward"; torch 2.13 does so only when the root's
  `reshard_after_forward` is left None, which is how the workloads ask for it). More memory
  from the end of forward to the start of backward, two fewer all-gathers a micro-batch;
  `none`, no unit (the program of zero 2): what the same torchtitan passes for every block
  and the root when pipeline parallelism is on ("to avoid per-microbatch all-gathers",
  9dec370), so torchtitan's choice is `none` for pp > 1 (`for_pipeline`).
- `tp_grad_overlap`: true when the tensor-parallel collective of a column-parallel linear's
  input gradient (all-reduce; reduce-scatter under sequence parallelism) runs while the
  linear's weight-gradient GEMM computes, as Megatron-LM's
  `LinearWithGradAccumulationAndAsyncCommunication` launches it between the two GEMMs
  (`--async-tensor-model-parallel-allreduce`, on by default from Feb 2022). The workloads'
  DTensor program reduces after both GEMMs; the overlap is priced by a documented rule (the
  capture is unchanged: `emulator.graph.build`, `costs.overlap`). Without tensor parallelism
  there is nothing to overlap and the field changes nothing.
- `sp_regather`: true when, under sequence parallelism, a column-parallel linear keeps only the
  sequence shard of its input for backward and all-gathers it again there (Megatron-LM, Korthikanti
  et al. 2022 sec. 4.2.2), where torch's DTensor plan keeps the gathered input, tp times larger
  (`workloads.sp_regather`). A different program: one more all-gather per attention, MLP and
  output layer in backward (beside the first input-gradient GEMM where no copy follows the
  all-gather: one sequence per micro-batch, or `sp_collectives = "first-dim"`; exposed
  otherwise), and less memory. Moot without sequence parallelism, and where
  whole blocks are checkpointed (full or op-level selective recompute), which keep only their
  input.
- `sp_collectives`: how the sequence-parallel all-gathers and reduce-scatters run:
  `dtensor`, DTensor's redistribute along the sequence dimension of the workloads' [b, s, h]
  (a full-width copy before each reduce-scatter, and after each all-gather unless a
  micro-batch is one sequence: torchtitan's program); `first-dim`, Megatron's along the
  leading dimension of its [s, b, h] layout, with no copy (`workloads.sp_collectives`: the
  workloads gather rows; with more than one sequence per micro-batch, attention's q, k, v and
  wo's input, 1/tp of the width each, are reordered by a copy, and the output layer's
  all-gather keeps DTensor's copy). Moot without sequence parallelism.
- `cp_attention`: the context-parallel attention program (`workloads.context_parallel`; moot at
  cp = 1): `all-gather`, K and V all-gathered and one fused kernel each way over the gathered
  keys, masked by position (the Llama 3 paper's; it takes ALiBi); `ring`, torch's ring attention
  of `context_parallel` (Dec 2024), what torchtitan's context-parallel runs ran: K and V
  repeated to every query head and all-gathered once, cp flash-attention calls forward and
  backward, float32 merging of their outputs and float32 accumulation of the gradients, dK/dV
  passed around the ring by an all-to-all permutation each backward step. No bias: an ALiBi
  model runs `all-gather` (a framework's choice gives way; a spec's is refused).
- `launch_blocking`: true when the run set `CUDA_LAUNCH_BLOCKING=1`, so every kernel launch
  returns only once the kernel has run and the host cannot run ahead of the GPU: each op's
  host dispatch time adds to its kernel time (`emulator.graph.build`). Not a framework's
  choice (all default to false); BLOOM's launch script set it. The capture is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from workloads.config import (
    SpecError,
    check_choice,
    check_flag,
    check_positive_ints,
    per_transfer_refusal,
)

FRAMEWORKS = ("prism-86a4f47", "megatron", "nemo", "llm-foundry", "torchtitan", "llm.c")

LOSSES = ("unfused-fp32", "loss-parallel", "fused", "fused-inplace")
NORMS = ("torch", "eager-fp32")
# torchao recipe names, and the workloads' own float8 of 86a4f47 (workloads.prism_float8)
FP8_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp", "prism-86a4f47")
FP8_CASTS = ("unfused", "fused", "transformer-engine")
PIPELINE_RECVS = ("per-microbatch", "per-transfer")
PIPELINE_TRANSFERS = ("whole", "scatter-gather")
ATTENTIONS = ("flash", "flash2", "triton", "unfused")
GRAD_REDUCES = ("overlapped", "after-backward")
DP_GRAD_COLLECTIVES = ("reduce-scatter", "all-reduce")
GRAD_ACCUMULATIONS = ("fp32", "model-dtype")
RECOMPUTE_RERUNS = ("needed", "all")
# the one granularity that checkpoints part of a block (its core attention), not the whole block
CORE_ATTENTION = "core-attention"
SELECTIVE_GRANULARITIES = ("op", "op-prism-86a4f47", CORE_ATTENTION)  # workloads.recompute
OPTIMIZER_STEPS = ("foreach", "fused")
CUSTOM_OPS = ("fused", "eager")
SP_COLLECTIVES = ("dtensor", "first-dim")
FSDP_RESHARDS = ("all", "not-root", "not-root-or-last", "none")
CP_ATTENTIONS = ("all-gather", "ring")


def _same_for_all(value: Any) -> dict[str, Any]:
    return {framework: value for framework in FRAMEWORKS}


# One table per field: the framework's choice for it.
LOSS_BY_FRAMEWORK: dict[str, str] = {
    "prism-86a4f47": "unfused-fp32",
    # Megatron-LM: `--cross-entropy-loss-fusion` is off by default (arguments.py), and its
    # jit-fused "native" variant upcasts too (core/fusions/fused_cross_entropy.py calls
    # VocabParallelCrossEntropy.calculate_logits_max: `vocab_parallel_logits.float()`); the
    # 2021-22 papers' code ran vocab_parallel_cross_entropy(output.float(), labels).
    "megatron": "unfused-fp32",
    # NeMo 2 GPTConfig sets cross_entropy_loss_fusion=True with Megatron-core's default
    # cross_entropy_fusion_impl="native" (transformer_config.py): the float32 jit path above.
    "nemo": "unfused-fp32",
    # llm-foundry mpt-*.yaml `loss_fn: fused_crossentropy` -> flash_attn.losses.cross_entropy
    # CrossEntropyLoss(ignore_index=-100, reduction="none") (models/mpt/modeling_mpt.py);
    # inplace_backward stays False.
    "llm-foundry": "fused",
    # torchtitan train.py (9dec370) loss_fn: F.cross_entropy(pred.flatten(0, 1).float(), ...),
    # with tp > 1 inside torch's loss_parallel() (training.disable_loss_parallel defaults to
    # False; train_context enters it around forward and backward); today's
    # components/loss.py cross_entropy_loss is the same call.
    "torchtitan": "loss-parallel",
    # llm.c train_gpt2.cu fused_classifier: loss and dlogits in one kernel, dlogits written
    # over the logits buffer.
    "llm.c": "fused-inplace",
}
# torchtitan's published runs (Dec 2024, 9dec370) used its own RMSNorm class (the module
# docstring); the others run fused norm kernels.
NORM_BY_FRAMEWORK: dict[str, str] = {**_same_for_all("torch"), "torchtitan": "eager-fp32"}
VOCAB_MULTIPLE_BY_FRAMEWORK: dict[str, int] = {
    "prism-86a4f47": 1,
    # Megatron-LM arguments.py --make-vocab-size-divisible-by, default 128
    "megatron": 128,
    # NeMo 2 GPTConfig make_vocab_size_divisible_by = 128 (collections/llm/gpt/model/base.py)
    "nemo": 128,
    # llm-foundry takes the model's vocab_size as configured (the mpt flavors' 50368 is
    # already padded by the yaml); no padding of its own
    "llm-foundry": 1,
    # torchtitan sizes the embedding from the tokenizer's vocabulary, unpadded
    "torchtitan": 1,
    # llm.c train_gpt2.cu gpt2_build_from_descriptor: padded_vocab_size = 50304, "padded to
    # 128" (GPT-2's 50257)
    "llm.c": 128,
}
# Megatron-LM's `--fp8-recipe` defaults to "delayed" (megatron/training/arguments.py), NeMo's
# MegatronMixedPrecision(fp8_recipe="delayed") and llm-foundry's `precision: amp_fp8` runs
# Composer's `te.fp8_autocast` with TE's default DelayedScaling: one scale per tensor, from
# an amax history. torchao has no delayed scaling any more; its per-tensor recipe runs the
# same GEMMs with the same operand formats (e4m3 forward, e5m2 gradients), so "tensorwise".
# torchtitan's `float8.recipe_name` defaults to None, torchao's tensorwise config
# (torchtitan/components/quantization/float8.py). llm.c has no fp8 (bf16/fp32 kernels only):
# its entry only matters for an llm.c job that asks for fp8, which then runs the default.
# prism-86a4f47 ran its own tensorwise float8 linears (workloads.prism_float8), which its fp8
# profile measured.
FP8_RECIPE_BY_FRAMEWORK: dict[str, str] = {
    **_same_for_all("tensorwise"),
    "prism-86a4f47": "prism-86a4f47",
}
# Transformer Engine (Megatron, NeMo, llm-foundry) runs each cast as its own fused CUDA
# kernel, with its default DelayedScaling recipe (Megatron-LM `--fp8-recipe delayed`, NeMo's
# MegatronMixedPrecision, Composer's te.fp8_autocast); torchtitan's float8 needs
# `--training.compile` "to fuse the float8 scaling/casting kernels" (torchtitan docs/float8.md). prism-86a4f47 ran eager torchao-style casts; llm.c:
# as for the recipe, the default.
# torchtitan without compile runs torchao's eager casts ("unfused"); `compile = true` makes it
# "fused" (KernelsSpec).
FP8_CASTS_BY_FRAMEWORK: dict[str, str] = {
    **_same_for_all("unfused"),
    "megatron": "transformer-engine",
    "nemo": "transformer-engine",
    "llm-foundry": "transformer-engine",
}
# llm-foundry's published throughput tables (scripts/train/benchmarking/README.md) were made by
# sweep.sh, which passes no --attn_impl, so submit_benchmarks.py's default `--attn_impl triton`
# set `model.attn_config.attn_impl` (both at b2a43a147, the Oct 2023 table update; the pretrain
# yamls and MPT's configuration_mpt.py default say triton too). Megatron and NeMo run Transformer
# Engine's fused attention (cuDNN) or flash-attn 2, prism-86a4f47 torch's SDPA (cuDNN on the
# shared profiles' H100 and H200, torch 2.11), llm.c cuDNN's: all FlashAttention-2-class.
# torchtitan's published runs used torch 1963fc8 (2024-12-23; its benchmarks/
# llama3_h100_202412_torchtitan.md), where torch's SDPA tried FlashAttention-2 first and cuDNN
# last on every GPU (pytorch#138522, Oct 2024, "Make CuDNN Attention Opt in"; torchtitan's Llama
# calls F.scaled_dot_product_attention with no backend chosen): "flash2" for it. Megatron-LM of
# 2021-22 (the code of the Narayanan, Korthikanti and BLOOM runs; `megatron` stands for it, as
# for grad_reduce below) had no flash attention: ParallelAttention / CoreAttention run baddbmm,
# FusedScaleMaskSoftmax, dropout and bmm (megatron/model/transformer.py at a8d172b31e and
# 2e90a342f5); `--use-flash-attn` came in 2023. So "unfused" for it.
ATTENTION_BY_FRAMEWORK: dict[str, str] = {
    **_same_for_all("flash"),
    "llm-foundry": "triton",
    "torchtitan": "flash2",
    "megatron": "unfused",
}
# Megatron-LM's train_step runs `forward_backward_func(...)` and then, under `--DDP-impl local`
# (the default), `model_module.allreduce_gradients()`: one all-reduce per grad buffer, after the
# whole backward (megatron/training.py and model/distributed.py at a8d172b31e, May 2021, and at
# 2e90a342f5, May 2022; the distributed optimizer of 2022 reduce-scatters there too). Overlap
# came with Megatron-core's DDP `overlap_grad_reduce` (2023), which NeMo 2's llm recipes turn on
# (DistributedDataParallelConfig(overlap_grad_reduce=True, ...)). BLOOM's Megatron-DeepSpeed
# reduces after the pipeline schedule too (DeepSpeed's PipelineEngine ReduceGrads step).
# prism-86a4f47 runs workloads.zero with overlap; llm-foundry and torchtitan shard with FSDP
# (not this field); llm.c reduces each layer's gradients on its NCCL stream as its backward
# finishes the layer (llmc/zero.cuh multi_gpu_async_reduce_gradient, called per layer from
# train_gpt2.cu's backward at karpathy/llm.c f1e2ace): overlapped, per layer not per bucket.
GRAD_REDUCE_BY_FRAMEWORK: dict[str, str] = {
    **_same_for_all("overlapped"),
    "megatron": "after-backward",
}
# Megatron-LM's distributed optimizer (2022) and Megatron-core's reduce-scatter the gradient
# buffer; the other frameworks' zero=1 paths are the workloads' (workloads.zero), which do the
# same. DeepSpeed's BF16 optimizer all-reduces instead; no framework here is DeepSpeed, so a
# baseline that ran it says so (results/baselines: BLOOM).
DP_GRAD_COLLECTIVE_BY_FRAMEWORK: dict[str, str] = _same_for_all("reduce-scatter")
# Megatron-LM keeps its gradient buffer (`main_grad`, local DDP's contiguous buffers) in fp32
# only under `--accumulate-allreduce-grads-in-fp32`, which arguments.py turns on for bf16 and
# leaves off for fp16; otherwise the buffer has the parameters' dtype and `param_hook` adds
# each micro-batch's gradient into it there, and the all-reduce runs on it
# (megatron/model/distributed.py `_get_buffer_type` at bbab79f869, May 2022; at a8d172b31e, May
# 2021, gradients without contiguous buffers stay in `.grad`, fp16 too). The Narayanan and
# Korthikanti runs are fp16 (examples/sc21/CONFIG.sh passes `--fp16` and no fp32 flag), so
# "model-dtype" for `megatron`, which gives way to "fp32" when the job is not fp16
# (`KernelsSpec.for_precision`), as Megatron's bf16 default does. NeMo (Megatron-core,
# `grad_reduce_in_fp32` in its recipes' DistributedDataParallelConfig) and the others'
# distributed-optimizer paths keep fp32: the workloads at 86a4f47 did.
GRAD_ACCUMULATION_BY_FRAMEWORK: dict[str, str] = {
    **_same_for_all("fp32"),
    "megatron": "model-dtype",
}
# At 86a4f47 `prism::rope` and `prism::masked_attention` had only their reference math, which a
# GPU ran as eager kernels (the shared profiles: mpt-7b's float32 SIMT GEMMs and softmax, Llama's
# ~10 RoPE kernels per call). Megatron-core applies RoPE with one fused kernel
# (`apply_rope_fusion`), NeMo likewise, llm-foundry runs ALiBi inside its attention kernel;
# torchtitan's eager RoPE is a complex product of ~3 kernels each way, closer to one fused kernel
# than to the reference chain, and one kernel under compile.
CUSTOM_OPS_BY_FRAMEWORK: dict[str, str] = {**_same_for_all("fused"), "prism-86a4f47": "eager"}
# Megatron-LM's `--recompute-granularity selective` checkpoints each layer's CoreAttention and
# nothing else (`checkpoint_core_attention`, `_checkpointed_attention_forward` in
# megatron/model/transformer.py at bbab79f869, May 2022, the code of Korthikanti et al. 2022);
# Megatron-core's (NeMo) selective recompute defaults to the core attention too
# (`recompute_modules = ["core_attn"]`). torchtitan's `selective` is its op-level policy; the
# workloads at 86a4f47 ran one like it that did not keep `abs`; llm-foundry and llm.c have no
# selective recompute.
SELECTIVE_RECOMPUTE_BY_FRAMEWORK: dict[str, str] = {
    **_same_for_all("op"),
    "megatron": CORE_ATTENTION,
    "nemo": CORE_ATTENTION,
    "prism-86a4f47": "op-prism-86a4f47",
}
# Megatron-LM recomputes through its reentrant `CheckpointFunction` (megatron/mpu/random.py at
# a8d172b31e and bbab79f869: backward reruns `run_function(*detached_inputs)` whole), as does
# Megatron-core's `tensor_parallel.checkpoint` (NeMo); torchtitan checkpoints with torch's
# non-reentrant `checkpoint`, whose early stop is on by default, as are the workloads at 86a4f47.
RECOMPUTE_RERUNS_BY_FRAMEWORK: dict[str, str] = {
    **_same_for_all("needed"),
    "megatron": "all",
    "nemo": "all",
}
# Megatron-LM steps apex's FusedAdam (`from apex.optimizers import FusedAdam as Adam`,
# megatron/optimizer/__init__.py at a8d172b31e; Megatron-DeepSpeed the same), NeMo
# Megatron-core's fused Adam (TE or apex), llm.c its own one-kernel AdamW (llmc/adamw.cuh
# adamw_kernel3 at f1e2ace). The workloads at 86a4f47 ran torch's foreach AdamW. torchtitan's
# `optimizer.implementation` defaults to "fused" in its current JobConfig, but its 2024 option
# was `--optimizer.fused`, off by default (torchtitan/optimizer.py at 9dec370 passes
# foreach=not fused; its train_configs do not set it); the published runs' flags are not
# stated: "foreach", the default. llm-foundry trains with Composer's DecoupledAdamW, a
# per-parameter loop of torch ops (not verified here): "foreach" is the nearer of the two.
OPTIMIZER_STEP_BY_FRAMEWORK: dict[str, str] = {
    **_same_for_all("foreach"),
    "megatron": "fused",
    "nemo": "fused",
    "llm.c": "fused",
}
# torchtitan's JobConfig: `compile.enable = False` and `parallelism.enable_async_tensor_parallel
# = False` by default (torchtitan/config/job_config.py). Megatron, NeMo and llm-foundry train
# eager (TE's and Apex's fused kernels are what `fp8_casts`, `norm` and `loss` say); llm.c is
# CUDA C. Megatron/NeMo's own TP overlap (`--tp-comm-overlap`, TE userbuffers) is not this
# field: it is not modelled.
COMPILE_BY_FRAMEWORK: dict[str, bool] = _same_for_all(False)
# Megatron-LM launches a column-parallel linear's input-gradient all-reduce before its weight
# gradient GEMM and waits after it (`async_grad_allreduce` in megatron/mpu/layers.py, from
# 83b1e42f30 of Feb 2022: the code at 2e90a342f5 and bbab79f869, May 2022, the README and
# Korthikanti runs), and under sequence parallelism the reduce-scatter the same way; Megatron-
# core keeps it (tensor_parallel/layers.py), so NeMo too. Megatron-LM of 2021 (a8d172b31e, the
# Narayanan runs) and BLOOM's Megatron-DeepSpeed fork reduce in `copy_to_tensor_model_
# parallel_region`'s backward, after both GEMMs: their baselines say false. torchtitan's
# DTensor TP reduces after both (async TP is `async_tp`); llm-foundry and llm.c have no TP.
TP_GRAD_OVERLAP_BY_FRAMEWORK: dict[str, bool] = {
    **_same_for_all(False),
    "megatron": True,
    "nemo": True,
}
ASYNC_TP_BY_FRAMEWORK: dict[str, bool] = _same_for_all(False)
# Megatron-LM's `LinearWithGradAccumulationAndAsyncCommunication` saves its input, the sequence
# shard, and all-gathers it again in backward when `ctx.sequence_parallel` (megatron/mpu/
# layers.py at bbab79f869, May 2022, the code of the Korthikanti runs; Megatron-core's
# tensor_parallel/layers.py keeps it, so NeMo too). torchtitan's DTensor plan keeps the gathered
# input; the others run no sequence parallelism.
SP_REGATHER_BY_FRAMEWORK: dict[str, bool] = {
    **_same_for_all(False),
    "megatron": True,
    "nemo": True,
}
# Megatron-LM gathers and reduce-scatters the sequence along the first dimension of [s, b, h]
# (`_gather_along_first_dim`, `_reduce_scatter_along_first_dim` in megatron/mpu/mappings.py and
# `_all_gather_base` in `LinearWithGradAccumulationAndAsyncCommunication`, layers.py, at
# bbab79f869; Megatron-core's tensor_parallel keeps them, so NeMo too). torchtitan's DTensor
# plan shards dimension 1 of [b, s, h] (torchtitan/models/llama3/infra/parallelize.py).
SP_COLLECTIVES_BY_FRAMEWORK: dict[str, str] = {
    **_same_for_all("dtensor"),
    "megatron": "first-dim",
    "nemo": "first-dim",
}
# No framework sets CUDA_LAUNCH_BLOCKING; a run's launch script may (BLOOM's did).
LAUNCH_BLOCKING_BY_FRAMEWORK: dict[str, bool] = _same_for_all(False)
# Megatron-core allocates each receive in p2p_communication.py (`_communicate`: torch.empty
# per recv_prev/recv_next) and runs either 1F1B of schedules.py,
# `forward_backward_pipelining_without_interleaving` or `..._with_interleaving` (the 2022
# Megatron-LM of the Narayanan and Korthikanti runs allocated the same way, in
# megatron/p2p_communication.py); NeMo 2 trains through Megatron-core's
# `get_forward_backward_func` (nemo/lightning/megatron_parallel.py). So "per-transfer" for
# both: workloads.megatron_schedule runs both schedules. A megatron or nemo pipeline it cannot
# run (another schedule; interleaved with micro-batches not a multiple of pp) runs torch's
# pipelining, per micro-batch (`KernelsSpec.for_pipeline`).
# torchtitan pipelines with torch.distributed.pipelining (torchtitan/distributed/
# pipeline_parallel.py); llm-foundry (Composer FSDP) and llm.c (data parallel only) have no
# pipeline parallelism, so the value is moot for them.
PIPELINE_RECV_BY_FRAMEWORK: dict[str, str] = {
    **_same_for_all("per-microbatch"),
    "megatron": "per-transfer",
    "nemo": "per-transfer",
}

# Megatron-LM split each pipeline transfer over tp and all-gathered it on receive
# (`--scatter-gather-tensors-in-pipeline`, on by default since 72e4230bb5 of Feb 2021;
# megatron/p2p_communication.py `_communicate` at a8d172b31e, May 2021, and at bbab79f869, May
# 2022, the latter skipping it under sequence parallelism), the code of the Narayanan and
# Korthikanti runs. BLOOM's Megatron-DeepSpeed pipelines with DeepSpeed's PipelineEngine, which
# partitions the same way (`is_pipe_partitioned` and `is_grad_partitioned` = model parallel,
# runtime/pipe/engine.py of 2021-22: a PartitionedTensor sent, `.full()` all-gathered).
# Megatron-core's p2p_communication.py (2023 on, NeMo 2) sends whole tensors. torchtitan's
# pipelining sends whole stage outputs; the others have no pipeline.
PIPELINE_TRANSFER_BY_FRAMEWORK: dict[str, str] = {
    **_same_for_all("whole"),
    "megatron": "scatter-gather",
}

# torchtitan's Dec 2024 code kept the last block and the root gathered, llm-foundry's
# Composer FSDP (FSDP1) the root (the field's docstring). The others keep every unit
# resharded; none of them runs FSDP in the baselines (Megatron and NeMo shard with zero 1).
FSDP_RESHARD_BY_FRAMEWORK: dict[str, str] = {
    **_same_for_all("all"),
    "torchtitan": "not-root-or-last",
    "llm-foundry": "not-root",
}
# With pipeline parallelism the same torchtitan keeps every unit gathered after forward
# (`reshard_after_forward=False` for the blocks, `not pp_enabled` for the root); the other
# frameworks' choices do not depend on it.
FSDP_RESHARD_PIPELINED_BY_FRAMEWORK: dict[str, str] = FSDP_RESHARD_BY_FRAMEWORK | {
    "torchtitan": "none"
}

# torchtitan (9dec370) enters torch's `context_parallel` (utils.create_context_parallel_ctx) with
# `experimental.context_parallel_rotate_method = "allgather"` by default, and repeats K and V
# before SDPA (models/llama/model.py `repeat_kv`). Megatron-core and NeMo run Transformer
# Engine's own ring (`AttnFuncWithCPAndKVP2P`: p2p per step, fused output correction), which is
# neither program; no published row of theirs runs context parallelism. The others have none.
CP_ATTENTION_BY_FRAMEWORK: dict[str, str] = {**_same_for_all("all-gather"), "torchtitan": "ring"}

CHOICES: dict[str, tuple[tuple, dict[str, Any]]] = {
    "loss": (LOSSES, LOSS_BY_FRAMEWORK),
    "norm": (NORMS, NORM_BY_FRAMEWORK),
    "fp8_recipe": (FP8_RECIPES, FP8_RECIPE_BY_FRAMEWORK),
    "fp8_casts": (FP8_CASTS, FP8_CASTS_BY_FRAMEWORK),
    "pipeline_recv": (PIPELINE_RECVS, PIPELINE_RECV_BY_FRAMEWORK),
    "pipeline_transfer": (PIPELINE_TRANSFERS, PIPELINE_TRANSFER_BY_FRAMEWORK),
    "attention": (ATTENTIONS, ATTENTION_BY_FRAMEWORK),
    "grad_reduce": (GRAD_REDUCES, GRAD_REDUCE_BY_FRAMEWORK),
    "dp_grad_collective": (DP_GRAD_COLLECTIVES, DP_GRAD_COLLECTIVE_BY_FRAMEWORK),
    "grad_accumulation": (GRAD_ACCUMULATIONS, GRAD_ACCUMULATION_BY_FRAMEWORK),
    "custom_ops": (CUSTOM_OPS, CUSTOM_OPS_BY_FRAMEWORK),
    "selective_recompute": (SELECTIVE_GRANULARITIES, SELECTIVE_RECOMPUTE_BY_FRAMEWORK),
    "recompute_reruns": (RECOMPUTE_RERUNS, RECOMPUTE_RERUNS_BY_FRAMEWORK),
    "optimizer_step": (OPTIMIZER_STEPS, OPTIMIZER_STEP_BY_FRAMEWORK),
    "sp_collectives": (SP_COLLECTIVES, SP_COLLECTIVES_BY_FRAMEWORK),
    "fsdp_reshard": (FSDP_RESHARDS, FSDP_RESHARD_BY_FRAMEWORK),
    "cp_attention": (CP_ATTENTIONS, CP_ATTENTION_BY_FRAMEWORK),
}


# The boolean fields: the framework's choice of each.
FLAGS: dict[str, dict[str, bool]] = {
    "compile": COMPILE_BY_FRAMEWORK,
    "async_tp": ASYNC_TP_BY_FRAMEWORK,
    "launch_blocking": LAUNCH_BLOCKING_BY_FRAMEWORK,
    "tp_grad_overlap": TP_GRAD_OVERLAP_BY_FRAMEWORK,
    "sp_regather": SP_REGATHER_BY_FRAMEWORK,
}


@dataclass(frozen=True, kw_only=True)
class KernelsSpec:
    """The framework whose kernels the job runs; a field left as None takes its choice."""

    framework: str = "prism-86a4f47"
    loss: str | None = None
    norm: str | None = None
    vocab_multiple: int | None = None
    fp8_recipe: str | None = None
    fp8_casts: str | None = None
    pipeline_recv: str | None = None
    pipeline_transfer: str | None = None
    attention: str | None = None
    grad_reduce: str | None = None
    dp_grad_collective: str | None = None
    grad_accumulation: str | None = None
    custom_ops: str | None = None
    selective_recompute: str | None = None
    recompute_reruns: str | None = None
    optimizer_step: str | None = None
    sp_collectives: str | None = None
    fsdp_reshard: str | None = None
    cp_attention: str | None = None
    compile: bool | None = None
    async_tp: bool | None = None
    launch_blocking: bool | None = None
    tp_grad_overlap: bool | None = None
    sp_regather: bool | None = None

    def __post_init__(self) -> None:
        check_choice("kernels", "framework", self.framework, FRAMEWORKS)
        # the fields left to the framework (`for_pipeline` and `for_precision` may revise them)
        object.__setattr__(
            self, "_chosen", frozenset(n for n in (*CHOICES, *FLAGS) if getattr(self, n) is None)
        )
        self._resolve_compile()
        for name, (allowed, by_framework) in CHOICES.items():
            value = getattr(self, name)
            if value is None:
                object.__setattr__(self, name, by_framework[self.framework])
            else:
                check_choice("kernels", name, value, allowed)
        self._resolve_pipeline_transfer()
        if self.vocab_multiple is None:
            object.__setattr__(self, "vocab_multiple", VOCAB_MULTIPLE_BY_FRAMEWORK[self.framework])
        check_positive_ints("kernels", self, ("vocab_multiple",))

    def _resolve_compile(self) -> None:
        """The boolean fields (FLAGS): the framework's when not given; compile implies
        fused fp8 casts, async_tp needs compile (module docstring)."""
        for name, by_framework in FLAGS.items():
            value = getattr(self, name)
            if value is None:
                object.__setattr__(self, name, by_framework[self.framework])
            else:
                check_flag("kernels", name, value)
        if self.compile and self.fp8_casts == "unfused":
            raise SpecError(
                "kernels.fp8_casts='unfused' contradicts kernels.compile=true: torch.compile "
                "fuses torchao's float8 scaling and casting kernels (torchtitan docs/float8.md)"
            )
        if self.compile and self.fp8_casts is None:
            object.__setattr__(self, "fp8_casts", "fused")
        if self.async_tp and not self.compile:
            raise SpecError(
                "kernels.async_tp=true needs kernels.compile=true: async tensor parallelism is "
                "an Inductor pass (torchtitan refuses it without compile)"
            )

    def _resolve_pipeline_transfer(self) -> None:
        """Scatter-gather is a feature of Megatron's executor: a framework's choice of it
        gives way to torch's pipelining, which sends whole tensors; a spec's is refused."""
        if self.pipeline_transfer != "scatter-gather" or self.pipeline_recv == "per-transfer":
            return
        if "pipeline_transfer" in self._chosen:
            object.__setattr__(self, "pipeline_transfer", "whole")
            return
        raise SpecError(
            "kernels.pipeline_transfer='scatter-gather' needs kernels.pipeline_recv="
            "'per-transfer': it is Megatron's p2p communication (workloads.megatron_schedule); "
            "torch's pipelining sends whole tensors"
        )

    def for_pipeline(self, schedule: str, pp: int, num_microbatches: int) -> KernelsSpec:
        """The kernels a pipeline of `schedule` runs: a framework's "per-transfer" receive
        policy, left as the framework's choice, holds where Megatron's 1F1B executor runs the
        pipeline (`workloads.config.per_transfer_refusal`); elsewhere the job runs torch's
        pipelining, "per-microbatch". With pp > 1 a framework's FSDP reshard choice is its
        pipelined one (FSDP_RESHARD_PIPELINED_BY_FRAMEWORK). Fields given in the spec are
        kept as given."""
        if pp == 1:
            return self
        revised = self
        chosen = "pipeline_recv" in self._chosen and self.pipeline_recv == "per-transfer"
        if chosen and per_transfer_refusal(schedule, pp, num_microbatches):
            transfer = "whole" if "pipeline_transfer" in self._chosen else self.pipeline_transfer
            revised = revised._revised(pipeline_recv="per-microbatch", pipeline_transfer=transfer)
        if "fsdp_reshard" in self._chosen:
            pipelined = FSDP_RESHARD_PIPELINED_BY_FRAMEWORK[self.framework]
            if pipelined != self.fsdp_reshard:
                revised = revised._revised(fsdp_reshard=pipelined)
        return revised

    def _revised(self, **changes: Any) -> KernelsSpec:
        """`replace`, keeping which fields the framework chose (a later revision asks)."""
        revised = replace(self, **changes)
        object.__setattr__(revised, "_chosen", self._chosen)
        return revised

    def for_precision(self, precision: str, zero: int) -> KernelsSpec:
        """The gradient buffer a job of `precision` and ZeRO stage `zero` keeps: a framework's
        "model-dtype" holds for fp16 only (Megatron keeps bf16 gradients in fp32); a spec's is
        kept, and refused under FSDP (zero >= 2), whose reduction dtype is its own."""
        if self.grad_accumulation != "model-dtype":
            return self
        if "grad_accumulation" in self._chosen:
            if precision == "fp16" and zero < 2:
                return self
            return self._revised(grad_accumulation="fp32")
        if zero >= 2:
            raise SpecError(
                f"kernels.grad_accumulation='model-dtype' needs parallel.zero 0 or 1 (zero="
                f"{zero}): it is the distributed optimizer's gradient buffer; FSDP reduces in "
                "float32"
            )
        return self

    def for_model(self, family: str, positions: str = "rope") -> KernelsSpec:
        """The norm a model of `family` runs: "eager-fp32" is an RMSNorm, so a framework's
        choice of it gives way to "torch" for GPT's LayerNorm; a spec's is refused there. The
        same for the ring attention, which takes no ALiBi bias (`positions`)."""
        revised = self
        if self.norm == "eager-fp32" and family != "llama":
            if "norm" not in self._chosen:
                raise SpecError(
                    f"kernels.norm='eager-fp32' needs model.family='llama' (is {family!r}): it "
                    "is torchtitan's RMSNorm; a GPT model's LayerNorm runs one fused kernel"
                )
            revised = revised._revised(norm="torch")
        if self.cp_attention == "ring" and positions == "alibi":
            if "cp_attention" not in self._chosen:
                raise SpecError(
                    "kernels.cp_attention='ring' needs a model without ALiBi (model.positions="
                    "'alibi'): torch's ring attention takes no attention bias; use 'all-gather'"
                )
            revised = revised._revised(cp_attention="all-gather")
        return revised

    def given(self) -> dict[str, Any]:
        """The overrides the spec gave, not those the framework's own revisions for the job
        made (`for_pipeline`, `for_precision`, `for_model`)."""
        return {k: v for k, v in self.overrides().items() if k not in self._chosen}

    def overrides(self) -> dict[str, Any]:
        """The fields that differ from the framework's own choices."""
        preset = KernelsSpec(framework=self.framework)
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name != "framework" and getattr(self, f.name) != getattr(preset, f.name)
        }


# Fields that change nothing for some jobs (the field list above): when, and the rule to say.
MOOT_WHEN: dict[str, tuple[str, Any]] = {
    "cp_attention": ("parallel.cp = 1", lambda job: job.parallel.cp == 1),
    "sp_collectives": ("no sequence parallelism", lambda job: not job.parallel.sequence_parallel),
    "sp_regather": (
        "it acts under sequence parallelism only, on blocks not checkpointed whole (train.recompute "
        "full, or selective at op level, keeps only a block's input)",
        lambda job: not job.parallel.sequence_parallel
        or checkpoints_whole_blocks(job.train.recompute, job.kernels.selective_recompute),
    ),
    "tp_grad_overlap": ("parallel.tp = 1", lambda job: job.parallel.tp == 1),
    "fsdp_reshard": ("it acts under parallel.zero = 3 only", lambda job: job.parallel.zero != 3),
    "pipeline_recv": ("parallel.pp = 1", lambda job: job.parallel.pp == 1),
    "pipeline_transfer": (
        "it acts with parallel.pp > 1, tp > 1 and no sequence parallelism only (the split is "
        "over the tp group; Megatron sends a sequence-parallel activation whole: it is split "
        "already)",
        lambda job: job.parallel.pp == 1 or job.parallel.tp == 1 or job.parallel.sequence_parallel,
    ),
    "fp8_recipe": ("train.precision is not fp8", lambda job: job.train.precision != "fp8"),
    "fp8_casts": ("train.precision is not fp8", lambda job: job.train.precision != "fp8"),
    "grad_reduce": (
        "it acts under parallel.zero <= 1 with parallel.dp * cp > 1 or pp > 1 only (FSDP "
        "reduces its own way; one data-parallel rank reduces nothing, and scales its gradients "
        "bucket by bucket only under a pipeline)",
        lambda job: job.parallel.zero >= 2
        or (job.parallel.dp * job.parallel.cp == 1 and job.parallel.pp == 1),
    ),
    "dp_grad_collective": (
        "it acts under parallel.zero = 1 with parallel.dp * cp > 1 only (zero 0 all-reduces, "
        "FSDP reduce-scatters, one data-parallel rank reduces nothing)",
        lambda job: job.parallel.zero != 1 or job.parallel.dp * job.parallel.cp == 1,
    ),
    "custom_ops": (
        "it runs RoPE and position-masked attention (ALiBi, context parallelism) only: "
        "model.positions = 'learned' and parallel.cp = 1 run neither",
        lambda job: job.model.positions == "learned" and job.parallel.cp == 1,
    ),
    "grad_accumulation": ("FSDP (parallel.zero >= 2) keeps no such buffer", lambda job: job.parallel.zero >= 2),
    "selective_recompute": ("train.recompute is not selective", lambda job: job.train.recompute != "selective"),
    "recompute_reruns": ("train.recompute = none", lambda job: job.train.recompute == "none"),
}  # fmt: skip


def checkpoints_whole_blocks(mode: str, selective: str) -> bool:
    """Whether `workloads.recompute.apply_recompute(model, mode, selective=selective)`
    checkpoints whole blocks (full, or op-level selective) rather than nothing or only each
    block's core attention. Here, not there, because the spec reads it too without torch."""
    return mode == "full" or (mode == "selective" and selective != CORE_ATTENTION)


def moot_overrides(job: Any) -> list[str]:
    """What the job's `[kernels]` overrides (`KernelsSpec.given`) that change nothing for it
    are, one line each: the CLI says so, so that none is ignored silently."""
    return [
        f"kernels.{name}={value!r} changes nothing for this job: {MOOT_WHEN[name][0]}"
        for name, value in job.kernels.given().items()
        if name in MOOT_WHEN and MOOT_WHEN[name][1](job)
    ]


def framework_fallback_notes(job: Any) -> list[str]:
    """Where the framework's choice gave way for this job and another program runs, one line
    each (`KernelsSpec.for_pipeline`): a Megatron or NeMo pipeline that Megatron's executor
    cannot run (Megatron itself refuses the layout) runs torch's pipelining. The CLI says
    them; nothing changes."""
    k, p = job.kernels, job.parallel
    chosen = PIPELINE_RECV_BY_FRAMEWORK[k.framework]
    if p.pp == 1 or chosen == k.pipeline_recv or "pipeline_recv" not in k._chosen:
        return []
    why = per_transfer_refusal(p.schedule, p.pp, job.num_microbatches)
    return [
        f"kernels.framework={k.framework!r} runs its pipelines with Megatron's executor "
        f"(kernels.pipeline_recv={chosen!r}), which cannot run this one ({why}): torch's "
        "pipelining runs it (kernels.pipeline_recv='per-microbatch'), where Megatron would "
        "refuse the layout"
    ]


def research_program_notes(job: Any) -> list[str]:
    """What the job runs that no production framework runs and that moves its time most, one
    line each: choices of `prism-86a4f47` (the default framework, the program of the shared
    H100 profiles) kept so those profiles stay comparable. The CLI says them; nothing changes."""
    notes = []
    if job.model.positions == "alibi" and job.kernels.custom_ops == "eager":
        notes.append(
            "ALiBi attention runs as float32 eager math over the whole score matrix "
            "(kernels.custom_ops = 'eager'); llm-foundry and Megatron run a fused bf16 kernel: "
            "set kernels.framework, or kernels.custom_ops = 'fused'"
        )
    if job.train.precision == "fp8" and job.kernels.fp8_casts == "unfused":
        notes.append(
            "fp8 casts run unfused, amax, scale and cast kernels around every GEMM "
            "(kernels.fp8_casts = 'unfused'), which can make fp8 slower than bf16; "
            "torch.compile (kernels.compile = true) and Transformer Engine "
            "(kernels.framework = 'nemo' or 'megatron') fuse them"
        )
    return notes


def padded_vocab(vocab: int, multiple: int, tp: int = 1) -> int:
    """Rows of the embedding and output layer: the vocabulary rounded up to a multiple of
    `multiple` * `tp` (Megatron's make-vocab-size-divisible-by; llm.c pads GPT-2's 50 257 to
    50 304); `multiple` = 1 leaves it as it is."""
    if multiple == 1:
        return vocab
    step = multiple * tp
    return -(-vocab // step) * step
