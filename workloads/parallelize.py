"""Apply tensor/sequence parallelism, data parallelism (DDP, ZeRO-1/2/3) and precision to a stage.

Order (torchtitan's): float8 linears -> tensor parallel -> context parallel ->
activation recompute -> FSDP2 (zero 2/3) or a cast to the compute dtype (zero 0/1,
whose fp32 master copy lives in `workloads.zero.DistributedOptimizer`).

Tensor parallelism uses DTensor `parallelize_module` with torchtitan's Llama plan
(Megatron-LM's column/row split; with sequence parallelism, Korthikanti et al.
2022): norms run on sequence shards (SequenceParallel), the attention and MLP
inputs are all-gathered (PrepareModuleInput), wq/wk/wv/w1/w3 are column-parallel,
wo/w2 row-parallel with a reduce-scatter back to sequence shards (Megatron's collectives
along the leading dimension instead, `kernels.sp_collectives`: workloads.sp_collectives). The token
embedding is row-parallel over the vocabulary; the output layer is column-parallel
and returns vocabulary-sharded local logits (the loss is vocab-parallel, see
`workloads.train`). GPT's learned position embedding keeps a replicated table and
looks up the rank's sequence shard. Tied GPT embeddings stay tied (both modules
shard the table the same way, Shard(0)).

Rule: tp divides heads and kv_heads (Megatron-LM asserts num_query_groups % tp == 0;
replicating kv heads when tp > kv_heads is not implemented and is refused here).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from workloads.config import check_tensor_parallel
from workloads.context_parallel import apply_context_parallel
from workloads.float8 import (
    TENSOR_PARALLEL_RECIPES,
    convert_linears_to_float8,
    float8_tensor_parallel_styles,
    is_float8_linear,
)
from workloads.job import TrainingJob
from workloads.kernels import checkpoints_whole_blocks
from workloads.models.norms import RMSNorm
from workloads.recompute import apply_recompute
from workloads.sp_collectives import (
    gather_sequence,
    scatter_sequence,
    to_rank_order,
    to_sequence_order,
)
from workloads.sp_regather import regather_in_backward

# FSDP2 warns when a wrapped module returns a view (an in-place op on it would skip the
# pre-backward all-gather). Ours do under tensor parallelism (DTensor.to_local returns an
# alias), and no code here writes in place to a module's output.
warnings.filterwarnings(
    "ignore",
    message=r"FSDP2-wrapped module \(\w+\) returned a view tensor",
    category=UserWarning,
)

COMPUTE_DTYPES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.bfloat16,  # fp8 matmuls inside the converted linears, bf16 elsewhere
}


# each part of a block: the input it takes besides the activation (attention: the positions),
# its column-parallel linears (fed by that input) and its row-parallel output linear
_BLOCK_PARTS = {
    "attention": ((None,), ("attention.wq", "attention.wk", "attention.wv"), "attention.wo"),
    "feed_forward": ((), ("feed_forward.w1", "feed_forward.w3"), "feed_forward.w2"),
}


def _column_linears(part: str, family: str) -> tuple[str, ...]:
    """A part's column-parallel linears in a model of `family` (GPT's MLP has no w3)."""
    return tuple(n for n in _BLOCK_PARTS[part][1] if n != "feed_forward.w3" or family == "llama")


def _block_plan(
    sequence_parallel: bool,
    family: str,
    first_dim: bool = False,
    float8_parts: frozenset[str] = frozenset(),
) -> dict:
    """`float8_parts`: the parts of `_BLOCK_PARTS` whose linears are all torchao float8 linears;
    with sequence parallelism and DTensor's collectives they take torchao's float8 styles
    (workloads.float8), which refuse a plain linear; every other part the plain styles."""

    def styles(part: str) -> tuple[type, type, type]:
        if sequence_parallel and not first_dim and part in float8_parts:
            return float8_tensor_parallel_styles()
        return ColwiseParallel, RowwiseParallel, PrepareModuleInput

    plan = {}
    if sequence_parallel:
        plan = {"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel()}
    for part, (extra, _, out_linear) in _BLOCK_PARTS.items():
        _, rowwise, prepare_input = styles(part)
        if sequence_parallel and first_dim:  # the gathers, reduce-scatters: see below
            plan[out_linear] = RowwiseParallel(output_layouts=Partial(), use_local_output=False)
        elif sequence_parallel:
            plan[part] = prepare_input(
                input_layouts=(Shard(1), *extra), desired_input_layouts=(Replicate(), *extra)
            )
            plan[out_linear] = rowwise(output_layouts=Shard(1))
        else:
            # Megatron's f operator: the block input enters as one Replicate DTensor, so
            # backward sums the gradients of wq/wk/wv (w1/w3) locally and all-reduces once
            plan[part] = PrepareModuleInput(
                input_layouts=(Replicate(), *extra), desired_input_layouts=(Replicate(), *extra)
            )
            plan[out_linear] = RowwiseParallel()
    for part in _BLOCK_PARTS:
        colwise = styles(part)[0]
        for name in _column_linears(part, family):
            plan[name] = colwise()
    return plan


def _replicate_params(module: nn.Module, tp_mesh) -> None:
    """Replicate a module over tp (same input on every rank, as without sequence parallelism)."""

    def partition(_name, mod, mesh):
        for key, param in list(mod.named_parameters(recurse=False)):
            dparam = distribute_tensor_replicated(param, mesh)
            mod.register_parameter(key, nn.Parameter(dparam, requires_grad=param.requires_grad))

    def input_fn(_mod, inputs, mesh):
        return tuple(DTensor.from_local(x, mesh, [Replicate()], run_check=False) for x in inputs)

    def output_fn(_mod, output, _mesh):
        return output.to_local()

    distribute_module(module, tp_mesh, partition, input_fn, output_fn)


def _parallelize_pos_embeddings(module: nn.Embedding, tp_mesh, sequence_parallel: bool) -> None:
    """Replicated position table; with SP each rank looks up its own sequence shard."""
    tp, rank = tp_mesh.size(), tp_mesh.get_local_rank()

    def input_fn(_mod, inputs, mesh):
        (positions,) = inputs
        if sequence_parallel:
            local = positions.chunk(tp)[rank]
            return (DTensor.from_local(local, mesh, [Shard(0)], run_check=False),)
        return (DTensor.from_local(positions, mesh, [Replicate()], run_check=False),)

    def output_fn(_mod, output, _mesh):
        return output.to_local()

    def partition(_name, mod, mesh):
        if mod is module:
            dparam = distribute_tensor_replicated(mod.weight, mesh)
            mod.register_parameter("weight", nn.Parameter(dparam))

    distribute_module(module, tp_mesh, partition, input_fn, output_fn)


def distribute_tensor_replicated(tensor: torch.Tensor, mesh) -> DTensor:
    return DTensor.from_local(tensor.data, mesh, [Replicate()], run_check=False)


def _sequence_collectives_first_dim(model: nn.Module, tp_mesh) -> None:
    """The sequence-parallel all-gathers before attention, MLP and output layer and the
    reduce-scatters after wo and w2 as `workloads.sp_collectives` runs them (Megatron's, without
    DTensor's copies). Attention and MLP take their gathered rows in rank order; attention puts
    q, k and v in sequence order and wo's input back in rank order (a no-op for one sequence
    per micro-batch). The output layer's input is gathered in sequence order (the loss reads
    its rows against the labels): DTensor's copy stays there for more than one sequence. The
    gathers run before the modules' own input plans (prepended): the output layer's plan
    takes its input as replicated."""
    tp = tp_mesh.size()

    # the inputs are the sequence-parallel norms' Shard(1) DTensors
    def gather_rank_order(_mod, args):
        x, *rest = args
        return (gather_sequence(x, rank_order=True), *rest)

    def gather_sequence_order(_mod, args):
        x, *rest = args
        return (gather_sequence(x), *rest)

    def scatter_output(_mod, _args, partial):
        return scatter_sequence(partial, 1, rank_order=True)

    def sequence_order(_mod, _args, out):
        return out if out.shape[0] == 1 else to_sequence_order(out, tp)

    def rank_order(_mod, args):
        x, *rest = args
        return (x if x.shape[0] == 1 else to_rank_order(x, tp), *rest)

    for block in model.layers.values():
        attention, feed_forward = block.attention, block.feed_forward
        attention.register_forward_pre_hook(gather_rank_order, prepend=True)
        feed_forward.register_forward_pre_hook(gather_rank_order, prepend=True)
        for linear in (attention.wq, attention.wk, attention.wv):
            linear.register_forward_hook(sequence_order)
        attention.wo.register_forward_pre_hook(rank_order, prepend=True)
        attention.wo.register_forward_hook(scatter_output)
        feed_forward.w2.register_forward_hook(scatter_output)
    if model.output is not None:
        model.output.register_forward_pre_hook(gather_sequence_order, prepend=True)


def apply_tensor_parallel(
    model: nn.Module,
    tp_mesh,
    *,
    sequence_parallel: bool,
    regather: bool = False,
    first_dim: bool = False,
    float8: bool = False,
) -> None:
    """Shard one (stage) model over the tp mesh in place; no-op when tp == 1.

    `float8`: the blocks' linears are torchao tensorwise float8 linears; with sequence
    parallelism (DTensor's collectives, not `first_dim`) their inputs are cast on the sequence
    shard and all-gathered as float8 (torchao's float8 styles, torchtitan's plan:
    workloads.float8).

    With sequence parallelism, `regather`: the column-parallel inputs keep their sequence
    shard for backward and are all-gathered again there, as Megatron-LM does
    (`workloads.sp_regather`); `first_dim`: the sequence is gathered and reduce-scattered as
    rows, without DTensor's copies, as Megatron's [s, b, h] layout does
    (`workloads.sp_collectives`). The token embedding's reduce-scatter stays DTensor's (its
    vocabulary-masked partial sum), and so does the output layer's all-gather of more than one
    sequence."""
    tp = tp_mesh.size()
    if tp == 1:
        return
    spec = model.spec
    check_tensor_parallel(spec, tp)
    seq = Shard(1) if sequence_parallel else Replicate()
    tied = (
        model.tok_embeddings is not None
        and model.output is not None
        and (model.output.weight is model.tok_embeddings.weight)
    )
    root_plan = {}
    if model.tok_embeddings is not None:
        root_plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if model.output is not None:
        # gathered before its plan under first_dim: a second redistribute there would make
        # its backward an all-reduce
        gathered = sequence_parallel and first_dim
        root_plan["output"] = ColwiseParallel(
            input_layouts=Replicate() if gathered else seq,
            output_layouts=Shard(-1),
            use_local_output=True,
        )
    if root_plan:
        parallelize_module(model, tp_mesh, root_plan)
    if tied:
        model.output.weight = model.tok_embeddings.weight
    if model.norm is not None:
        if sequence_parallel:
            parallelize_module(model.norm, tp_mesh, SequenceParallel())
        else:
            _replicate_params(model.norm, tp_mesh)
    if getattr(model, "pos_embeddings", None) is not None:
        _parallelize_pos_embeddings(model.pos_embeddings, tp_mesh, sequence_parallel)
    local_heads = spec.heads // tp
    for block in model.layers.values():
        float8_parts = frozenset(
            part
            for part, (_, _, out_linear) in _BLOCK_PARTS.items()
            if float8
            and all(
                is_float8_linear(block.get_submodule(name))
                for name in (*_column_linears(part, spec.family), out_linear)
            )
        )
        plan = _block_plan(sequence_parallel, spec.family, first_dim, float8_parts)
        parallelize_module(block, tp_mesh, plan)
        if not sequence_parallel:
            _replicate_params(block.attention_norm, tp_mesh)
            _replicate_params(block.ffn_norm, tp_mesh)
        block.attention.core_attention.head_offset = tp_mesh.get_local_rank() * local_heads
    if sequence_parallel and first_dim:
        _sequence_collectives_first_dim(model, tp_mesh)
    if sequence_parallel and regather:
        for block in model.layers.values():
            regather_in_backward(block.attention, rank_order=first_dim)
            regather_in_backward(block.feed_forward, rank_order=first_dim)
        if model.output is not None:
            regather_in_backward(model.output)


def apply_fsdp(model: nn.Module, dp_mesh, *, zero: int, precision: str, reshard: str) -> None:
    """FSDP2 per transformer block, then the root. zero 2 keeps every unit's parameters
    gathered after forward; zero 3 frees them, for every unit (`reshard` = "all"), every
    block ("not-root": FSDP2 leaves a root whose `reshard_after_forward` is None gathered),
    every block but the last ("not-root-or-last") or none (`kernels.fsdp_reshard`)."""
    mp_policy = MixedPrecisionPolicy()
    if precision != "fp32":
        mp_policy = MixedPrecisionPolicy(
            param_dtype=COMPUTE_DTYPES[precision], reduce_dtype=torch.float32
        )
    blocks = list(model.layers.values())
    resharding = zero == 3 and reshard != "none"
    keep_last = resharding and reshard == "not-root-or-last"
    for i, block in enumerate(blocks):
        block_reshards = resharding and not (keep_last and i == len(blocks) - 1)
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=block_reshards, mp_policy=mp_policy)
    keep_root = resharding and reshard in ("not-root", "not-root-or-last")
    root_reshards = None if keep_root else resharding
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=root_reshards, mp_policy=mp_policy)


def set_kernels(model: nn.Module, job: TrainingJob) -> None:
    """Make every block's attention run the kernels `job` names: unfused with attention dropout
    (`kernels.attention = "unfused"`, `train.attention_dropout`) or a fused kernel (SDPA's
    FlashAttention-2 backend on a GPU for `flash2`); RoPE and
    ALiBi attention fused or as eager math (`kernels.custom_ops`); RMSNorm as one fused kernel
    or torchtitan's float32 eager math (`kernels.norm`)."""
    eager = job.kernels.custom_ops == "eager"
    for norm in model.modules():
        if isinstance(norm, RMSNorm):
            norm.eager_fp32 = job.kernels.norm == "eager-fp32"
    for block in model.layers.values():
        core = block.attention.core_attention
        core.unfused = job.kernels.attention == "unfused"
        core.flash_only = job.kernels.attention == "flash2"
        core.dropout = job.train.attention_dropout
        core.eager = eager
        if hasattr(block.attention, "eager_rope"):  # Llama's attention applies RoPE
            block.attention.eager_rope = eager


def parallelize_stage(model: nn.Module, mesh, job: TrainingJob, dp_mesh=None) -> None:
    """Apply everything but pipeline splitting (already done) to one stage model, in place.

    `mesh` is the (dp, pp, cp, tp) DeviceMesh, or None for a single-process run
    (then only precision and recompute apply); `dp_mesh` is `data_parallel_mesh(mesh)`,
    needed for zero 2/3 (flatten once per mesh, not once per stage).
    """
    par, precision = job.parallel, job.train.precision
    set_kernels(model, job)
    if precision == "fp8":
        convert_linears_to_float8(model, job.kernels.fp8_recipe, skip=("output",))
    if mesh is not None:
        # a block checkpointed whole keeps only its input already: regathering is moot there
        regather = job.kernels.sp_regather and not checkpoints_whole_blocks(
            job.train.recompute, job.kernels.selective_recompute
        )
        apply_tensor_parallel(
            model,
            mesh["tp"],
            sequence_parallel=par.sequence_parallel,
            regather=regather,
            first_dim=job.kernels.sp_collectives == "first-dim",
            # Megatron's regather keeps and gathers a bf16 shard (workloads.sp_regather)
            float8=precision == "fp8"
            and job.kernels.fp8_recipe in TENSOR_PARALLEL_RECIPES
            and not regather,
        )
        apply_context_parallel(model, mesh["cp"], method=job.kernels.cp_attention)
    apply_recompute(
        model,
        job.train.recompute,
        selective=job.kernels.selective_recompute,
        preserve_rng_state=job.train.attention_dropout > 0,
        early_stop=job.kernels.recompute_reruns == "needed",
    )
    if mesh is not None and par.zero >= 2:
        apply_fsdp(
            model, dp_mesh, zero=par.zero, precision=precision, reshard=job.kernels.fsdp_reshard
        )
    else:
        cast_parameters(model, COMPUTE_DTYPES[precision])


def cast_parameters(model: nn.Module, dtype: torch.dtype) -> None:
    """`model.to(dtype)` that keeps tied parameters tied, also under FakeTensorMode.

    `Module.to` swaps parameter objects in place when they are tensor subclasses (fake
    tensors, DTensors) and refuses a parameter shared by two modules (tied embeddings):
    "Couldn't swap". Here each distinct parameter is cast once and the new one set on
    every module that held it.
    """
    cast: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is None or param.dtype == dtype:
                continue
            if id(param) not in cast:
                with torch.no_grad():
                    cast[id(param)] = nn.Parameter(
                        param.to(dtype), requires_grad=param.requires_grad
                    )
            module._parameters[name] = cast[id(param)]


def data_parallel_mesh(mesh):
    """The flattened (dp, cp) mesh over which gradients are reduced (FSDP shards over it too)."""
    return mesh["dp", "cp"]._flatten("dp_cp")
