"""What a job spec implies before anything runs: layout, parameters, FLOPs, model-state bytes.

`explain(job)` returns plain frozen dataclasses (`Explanation`); `explanation_to_dict` turns
them into JSON-ready raw numbers with unit-suffixed keys. Rendering lives in `report.py`.

Conventions (stated once, used everywhere below):
- FLOPs: 2 per multiply-accumulate. Forward per token per layer = 2 x (weights of the layer's
  matmuls) + 4*s*h for attention scores (QK^T) and values (AV) over the full sequence s. The
  causal mask is NOT used to halve the attention term, as in Narayanan et al. 2021 (SC21) eq. 3;
  PaLM-style MFU counts differ. Logits add 2*h*V per token; embeddings, norms, activations,
  softmax and biases are not counted. Backward = 2 x forward. Model FLOPs exclude recompute;
  hardware FLOPs add it: full recompute reruns the forward of every transformer layer (not the
  logits layer), which makes hardware FLOPs equal Narayanan eq. 3,
  96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)), for a GPT with a 4h MLP and MHA; selective recompute
  is counted as Korthikanti et al. 2022 Sec. 4.2 define it (rerun only the attention core,
  QK^T, softmax, AV). The workloads' "selective" is torchtitan's op-level policy instead (it
  reruns every second matmul), so for that mode this figure is the paper's, not the
  program's: `prismbench emulate` reports the FLOPs the captured program runs.
- Parameters per rank: tensor parallelism shards linear weights column/row-wise (row-parallel
  biases stay whole), and embedding and output by vocab (ceil(V/tp) rows of the vocabulary as
  padded by `kernels.vocab_multiple`, which also counts in the logits' FLOPs); norms and learned
  position tables are replicated; tp divides kv_heads (the spec refuses kv-head replication).
  A pipeline split unties tied embeddings:
  the last stage then holds its own output matrix. ZeRO-3/FSDP divides what is left by the
  data-parallel group, dp*cp (FSDP over dp x cp), rounding up.
- Model-state bytes per parameter: what the workloads hold (the ZeRO paper's scheme,
  Rajbhandari et al. 2020 Sec. 3.1, counts 2 + 2 + 12 for mixed-precision Adam; the program
  differs), as (weights, gradients, master weights, moments):
  * zero 0/1: `workloads.zero.DistributedOptimizer` (Megatron's
    distributed optimizer): weights in the model dtype (2 B; fp8 jobs keep bf16 weights, fp8 is
    only the GEMM input format; fp32 4 B, `parallelize.cast_parameters`), a persistent fp32
    main-grad buffer (4 B, plus bucket padding; in the weights' dtype with
    `kernels.grad_accumulation = "model-dtype"`), an fp32 master copy (4 B, even for fp32 jobs)
    and AdamW's two fp32 moments (8 B); zero 1 shards master and moments over dp*cp.
  * zero 2/3: FSDP2 (`parallelize.apply_fsdp`): parameters stay fp32 and
    sharded over dp*cp (4 B / D), with fp32 sharded gradients (4 B / D) and AdamW's moments
    (8 B / D), no master copy; bf16 copies are gathered for compute (zero 2 keeps them from
    forward to backward: activation-like memory, not counted here). Also on one rank (D = 1):
    capture and `record` build the job's DeviceMesh whatever its size, and the workloads shard
    with FSDP2 wherever there is a mesh (`workloads.train.build_training`).
  Buffers: the workloads register none.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from emulator.hardware import gpu_preset
from emulator.memory.outside import CUDA_CONTEXT_BYTES, NCCL_SETUP_BYTES, nccl_buffer_bytes
from emulator.world.mesh import World
from workloads.config import ModelSpec
from workloads.flavors import FLAVORS, parameter_count

# Bytes per parameter of the model's own weights, by precision (see the module docstring).
WEIGHT_BYTES = {"bf16": 2, "fp16": 2, "fp8": 2, "fp32": 4}
FP32 = 4
NARAYANAN_EQ3 = "96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h))  [Narayanan et al. 2021, SC21, eq. 3]"


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, kw_only=True)
class AxisPlacement:
    """One mesh axis: its size, rank stride, and whether every group of it fits in a node."""

    name: str
    size: int
    stride: int
    intra_node: bool
    max_nodes_per_group: int  # the most nodes one group of the axis spans


@dataclass(frozen=True, kw_only=True)
class StageInfo:
    """One pipeline rank (pp index): its layers, and what each of its GPUs holds."""

    pp_rank: int
    virtual_stages: tuple[int, ...]
    layers_per_virtual_stage: tuple[int, ...]
    layers: int
    has_embedding: bool
    has_output: bool
    params_per_tp_rank: int  # after tensor parallelism, before ZeRO-3
    params_per_rank: int  # what one GPU holds under the job's ZeRO stage
    weights_bytes: int
    grads_bytes: int
    master_weights_bytes: int
    optimizer_bytes: int  # AdamW's moments
    model_state_bytes: int
    model_state_bytes_by_zero: tuple[int, int, int, int]  # ZeRO stage 0, 1, 2, 3


@dataclass(frozen=True, kw_only=True)
class FlopsInfo:
    """FLOPs of one training iteration (whole job), by the conventions in the module docstring."""

    forward_flops_per_token: int
    attention_flops_per_token: int  # forward QK^T + AV over all layers, included above
    logits_flops_per_token: int  # included in forward_flops_per_token
    model_flops_per_iteration: int
    hardware_flops_per_iteration: int
    recompute: str
    model_flops_per_gpu: float
    hardware_flops_per_gpu: float
    # eq. 3 evaluated with this model's l, h, V; it assumes a 4h MLP and MHA
    narayanan_eq3_flops_per_iteration: float
    causal_attention_halved: bool


@dataclass(frozen=True, kw_only=True)
class GpuFit:
    """The job against its GPU preset: model state against what the allocator may hold, and the
    compute-bound time floor."""

    gpu: str
    hbm_capacity_bytes: int  # nominal DRAM, as the datasheet counts it
    usable_capacity_bytes: int  # what CUDA offers (the preset's cited figure)
    # CUDA context, NCCL setup and each communicator's buffers (emulator.memory.outside), the
    # communicators as the layout makes them (`layout_nccl_communicators`)
    outside_allocator_bytes: int
    allocator_limit_bytes: int  # usable - outside: where the caching allocator runs out
    # for the dtype the job's GEMMs run in (fp8: the fp8 peak, though only GEMMs run in fp8;
    # fp32: the fp32 units', as torch runs fp32 matmuls without tf32 by default: a time floor,
    # not the tf32 peak emulate's MFU is quoted against, docs/METRICS.md)
    peak_dense_tflops: float
    model_state_fraction_of_allocator_limit: float  # worst pipeline stage; activations on top
    iteration_time_at_peak_s: float  # hardware FLOPs per GPU at dense peak: a lower bound


@dataclass(frozen=True, kw_only=True)
class Explanation:
    """Everything `prismbench explain` reports for one job."""

    model: str
    world_size: int
    mesh_shape: tuple[int, int, int, int]
    mesh_dim_names: tuple[str, ...]
    gpus_per_node: int
    nodes: int
    axes: tuple[AxisPlacement, ...]
    virtual_stages_per_rank: int
    microbatches_per_iteration: int
    tokens_per_iteration: int
    params_total: int
    dp_shard_group: int
    zero_stage: int
    precision: str
    state_bytes_per_param: tuple[int, int, int, int]  # weights, grads, master, moments (unsharded)
    stages: tuple[StageInfo, ...]
    flops: FlopsInfo
    max_model_state_bytes: int
    gpu: GpuFit


def flavor_rows() -> list[dict[str, Any]]:
    """Every registered flavor's dimensions and parameter count, by family then size."""
    rows = [
        {
            "name": name,
            "family": spec.family,
            "layers": spec.layers,
            "hidden": spec.hidden,
            "ffn_hidden": spec.ffn_hidden,
            "heads": spec.heads,
            "kv_heads": spec.kv_heads,
            "vocab": spec.vocab,
            "params": parameter_count(spec),
        }
        for name, spec in FLAVORS.items()
    ]
    return sorted(rows, key=lambda row: (row["family"], row["params"], row["name"]))


# ---- parameters ---------------------------------------------------------------------------


def _has_bias(m: ModelSpec) -> bool:
    return m.family == "gpt"


def _norm_params(m: ModelSpec) -> int:
    """One norm: RMSNorm weight (Llama) or LayerNorm weight + bias (GPT)."""
    return 2 * m.hidden if m.family == "gpt" else m.hidden


def layer_params(m: ModelSpec, tp: int = 1) -> int:
    """Parameters of one transformer block held by one tensor-parallel rank."""
    h, bias = m.hidden, _has_bias(m)
    kv_dim = m.kv_heads // tp * m.head_dim
    q_dim = h // tp
    attention = h * q_dim + 2 * h * kv_dim + q_dim * h  # wq, wk, wv (column), wo (row)
    if bias:
        attention += q_dim + 2 * kv_dim + h  # wo's bias is not sharded (row parallel)
    f = m.ffn_hidden // tp
    if m.family == "llama":
        ffn = 3 * h * f  # SwiGLU w1, w3 (column), w2 (row)
    else:
        ffn = 2 * h * f + f + h  # w1 (column, bias sharded), w2 (row, bias whole)
    return attention + ffn + 2 * _norm_params(m)


def embedding_params(m: ModelSpec, tp: int = 1) -> int:
    """Token embedding (vocab-sharded) plus a learned position table (replicated)."""
    positions = m.max_seq_len * m.hidden if m.positions == "learned" else 0
    return _ceil_div(m.vocab, tp) * m.hidden + positions


def head_params(m: ModelSpec, tp: int = 1, *, tied: bool = False) -> int:
    """Final norm plus output projection (vocab-sharded; absent when tied to the embedding)."""
    output = 0 if tied else _ceil_div(m.vocab, tp) * m.hidden
    return _norm_params(m) + output


def total_params(m: ModelSpec) -> int:
    """Parameters of the whole, unsplit model (tied embeddings counted once)."""
    return m.layers * layer_params(m) + embedding_params(m) + head_params(m, tied=m.tie_embeddings)


def _stage_params(m: ModelSpec, tp: int, layers: int, first: bool, last: bool) -> int:
    params = layers * layer_params(m, tp)
    if first:
        params += embedding_params(m, tp)
    if last:
        params += head_params(m, tp, tied=m.tie_embeddings and first)
    return params


# ---- model-state bytes --------------------------------------------------------------------


def model_state_bytes(
    params: int,
    precision: str,
    zero: int,
    shard: int,
    *,
    fsdp: bool | None = None,
    grads_in_model_dtype: bool = False,
) -> tuple[int, int, int, int]:
    """(weights, grads, master weights, moments) bytes on one rank holding `params` before
    data-parallel sharding over `shard` = dp*cp ranks (module docstring). `fsdp`: whether
    the program shards with FSDP2 (default: zero >= 2, on any number of ranks);
    `grads_in_model_dtype`: the distributed optimizer's grad buffer has the weights' dtype
    (`kernels.grad_accumulation = "model-dtype"`)."""
    fsdp = zero >= 2 if fsdp is None else fsdp
    sharded = _ceil_div(params, shard)
    if fsdp:
        return FP32 * sharded, FP32 * sharded, 0, 2 * FP32 * sharded
    optimizer_params = sharded if zero >= 1 else params
    return (
        WEIGHT_BYTES[precision] * params,
        (WEIGHT_BYTES[precision] if grads_in_model_dtype else FP32) * params,
        FP32 * optimizer_params,
        2 * FP32 * optimizer_params,
    )


# ---- FLOPs --------------------------------------------------------------------------------


def flops(m: ModelSpec, *, seq_len: int, tokens: int, recompute: str, world_size: int) -> FlopsInfo:
    """Model and hardware FLOPs of one iteration processing `tokens` tokens."""
    h, s, layers, v = m.hidden, seq_len, m.layers, m.vocab
    kv_dim = m.kv_heads * m.head_dim
    ffn_matrices = 3 if m.family == "llama" else 2
    matmul_weights_per_layer = 2 * h * h + 2 * h * kv_dim + ffn_matrices * h * m.ffn_hidden
    attention_per_layer = 4 * s * h
    layer_forward = 2 * matmul_weights_per_layer + attention_per_layer
    logits = 2 * h * v
    forward = layers * layer_forward + logits
    recompute_per_token = {
        "none": 0,
        "selective": layers * attention_per_layer,
        "full": layers * layer_forward,
    }
    model = 3 * forward * tokens
    hardware = (3 * forward + recompute_per_token[recompute]) * tokens
    batch = tokens / s
    eq3 = 96 * batch * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    return FlopsInfo(
        forward_flops_per_token=forward,
        attention_flops_per_token=layers * attention_per_layer,
        logits_flops_per_token=logits,
        model_flops_per_iteration=model,
        hardware_flops_per_iteration=hardware,
        recompute=recompute,
        model_flops_per_gpu=model / world_size,
        hardware_flops_per_gpu=hardware / world_size,
        narayanan_eq3_flops_per_iteration=eq3,
        causal_attention_halved=False,
    )


def stage_model_flops_per_gpu(explanation: Explanation) -> tuple[float, ...]:
    """Model FLOPs one GPU of each pipeline rank runs in an iteration, by the conventions of
    `flops`: its layers' share of every layer's forward and backward and, on the rank holding
    the output layer, the logits'. Over every GPU they sum to model_flops_per_iteration."""
    f, stages = explanation.flops, explanation.stages
    layers = sum(s.layers for s in stages)
    layer_forward = (f.forward_flops_per_token - f.logits_flops_per_token) / layers
    gpus_per_stage = explanation.world_size / len(stages)
    return tuple(
        3
        * explanation.tokens_per_iteration
        * (s.layers * layer_forward + (f.logits_flops_per_token if s.has_output else 0))
        / gpus_per_stage
        for s in stages
    )


# ---- layout -------------------------------------------------------------------------------


def axis_placements(world: World) -> tuple[AxisPlacement, ...]:
    """Where each mesh axis lands, for the row-major rank order of the world's axes."""
    placements = []
    stride = 1
    for name, size in reversed(world.axes):
        # groups that do not tile the nodes (tp 3 on 8-GPU nodes) span more than rank 0's
        placed = world.placements(world.groups(name))
        most = max(len(np.unique(world.node_of(group))) for group in placed)
        placements.append(
            AxisPlacement(
                name=name,
                size=size,
                stride=stride,
                intra_node=most == 1,
                max_nodes_per_group=most,
            )
        )
        stride *= size
    return tuple(reversed(placements))


def _stages(job: Any) -> tuple[StageInfo, ...]:
    m, p = job.built_model, job.parallel  # the vocabulary as padded (kernels.vocab_multiple)
    counts = job.stage_layers
    total_stages = p.pp * p.vpp
    model_dtype_grads = job.kernels.grad_accumulation == "model-dtype"
    shard = p.dp * p.cp
    stages = []
    for rank in range(p.pp):
        virtual = tuple(range(rank, total_stages, p.pp))
        first, last = 0 in virtual, total_stages - 1 in virtual
        layers = tuple(counts[v] for v in virtual)
        params_tp = _stage_params(m, p.tp, sum(layers), first, last)
        w, g, mw, o = model_state_bytes(
            params_tp, job.train.precision, p.zero, shard, grads_in_model_dtype=model_dtype_grads
        )
        by_zero = tuple(
            sum(model_state_bytes(params_tp, job.train.precision, z, shard,
                                  grads_in_model_dtype=model_dtype_grads and z < 2))
            for z in range(4)
        )  # fmt: skip
        stages.append(
            StageInfo(
                pp_rank=rank,
                virtual_stages=virtual,
                layers_per_virtual_stage=layers,
                layers=sum(layers),
                has_embedding=first,
                has_output=last,
                params_per_tp_rank=params_tp,
                params_per_rank=_ceil_div(params_tp, shard) if p.zero >= 2 else params_tp,
                weights_bytes=w,
                grads_bytes=g,
                master_weights_bytes=mw,
                optimizer_bytes=o,
                model_state_bytes=w + g + mw + o,
                model_state_bytes_by_zero=by_zero,
            )
        )
    return tuple(stages)


def explain(job: Any) -> Explanation:
    """Layout, parameters, FLOPs and model-state memory implied by a validated JobSpec."""
    m, p = job.built_model, job.parallel  # the vocabulary as padded (kernels.vocab_multiple)
    gpn = job.cluster.gpus_per_node
    world = World.grid(dp=p.dp, pp=p.pp, cp=p.cp, tp=p.tp, vpp=p.vpp, gpus_per_node=gpn)
    stages = _stages(job)
    flops_info = flops(
        m,
        seq_len=job.batch.seq_len,
        tokens=job.tokens_per_iteration,
        recompute=job.train.recompute,
        world_size=job.world_size,
    )
    max_state = max(s.model_state_bytes for s in stages)
    return Explanation(
        model=m.name,
        world_size=job.world_size,
        mesh_shape=world.shape,
        mesh_dim_names=world.names,
        gpus_per_node=gpn,
        nodes=_ceil_div(job.world_size, gpn),
        axes=axis_placements(world),
        virtual_stages_per_rank=p.vpp,
        microbatches_per_iteration=job.num_microbatches,
        tokens_per_iteration=job.tokens_per_iteration,
        params_total=total_params(m),
        dp_shard_group=p.dp * p.cp,
        zero_stage=p.zero,
        precision=job.train.precision,
        state_bytes_per_param=model_state_bytes(
            1,
            job.train.precision,
            p.zero,
            1,
            grads_in_model_dtype=job.kernels.grad_accumulation == "model-dtype",
        ),  # fmt: skip
        stages=stages,
        flops=flops_info,
        max_model_state_bytes=max_state,
        gpu=_gpu_fit(job, max_state, flops_info),
    )


def layout_nccl_communicators(
    tp: int, pp: int, cp: int, dp: int, *, embedding_group: bool = False
) -> int:
    """NCCL communicators one rank makes under this layout, as the workloads build them: a
    (dp, pp, cp, tp) DeviceMesh whose groups of more than one rank are the tp, pp and cp groups
    and the flattened dp x cp group gradients are reduced over; every group that spans the whole
    world is torch's default group, one communicator. `embedding_group`: the rank is a first or
    last stage of a pipeline that unties tied embeddings, which makes one group more for their
    gradients (`workloads.train._embedding_group`), even where it has the pp group's ranks.
    (`emulator.memory.outside.nccl_communicators` counts the same from a captured trace.)"""
    world = tp * pp * cp * dp
    sizes = [size for size in (tp, pp, cp, dp * cp) if size > 1]
    mesh = sum(size < world for size in sizes) + any(size == world for size in sizes)
    return mesh + embedding_group


def _gpu_fit(job, max_state_bytes: int, flops_info: FlopsInfo) -> GpuFit:
    gpu = gpu_preset(job.cluster.gpu)
    p = job.parallel
    # the worst stage's: with tied embeddings split by a pipeline, its ends' (one group more)
    tied = job.model.tie_embeddings and p.pp > 1
    comms = layout_nccl_communicators(p.tp, p.pp, p.cp, p.dp, embedding_group=tied)
    outside = (
        CUDA_CONTEXT_BYTES[gpu.arch] + NCCL_SETUP_BYTES[gpu.arch] + nccl_buffer_bytes(comms)
    )  # as emulator.memory.outside.outside_memory counts a captured rank's
    limit = max(gpu.usable_capacity_bytes - outside, 0)
    peak_tflops = gpu.peak_tflops(job.train.precision)
    return GpuFit(
        gpu=gpu.name,
        hbm_capacity_bytes=gpu.hbm_capacity_bytes,
        usable_capacity_bytes=gpu.usable_capacity_bytes,
        outside_allocator_bytes=outside,
        allocator_limit_bytes=limit,
        peak_dense_tflops=peak_tflops,
        model_state_fraction_of_allocator_limit=max_state_bytes / limit if limit else float("inf"),
        iteration_time_at_peak_s=flops_info.hardware_flops_per_gpu / (peak_tflops * 1e12),
    )


def explanation_to_dict(explanation: Explanation) -> dict[str, Any]:
    """JSON-ready dict of raw numbers (bytes, FLOPs, counts) with the conventions spelled out."""
    data = asdict(explanation)
    data["conventions"] = {
        "flops": "2 per MAC; backward = 2 x forward; attention 4*s*h per layer per token, "
        "not halved for the causal mask",
        "narayanan_eq3": NARAYANAN_EQ3,
        "state_bytes": "weights + grads + fp32 master + two fp32 AdamW moments per param, "
        "as the workloads hold them (distributed optimizer: 2+4+4+8 mixed precision, 2+2+4+8 "
        "with kernels.grad_accumulation='model-dtype'; FSDP: 4+4+0+8 sharded over dp*cp); "
        "see prismbench.explain",
        "allocator_limit": "usable_capacity_bytes (what CUDA offers) - outside_allocator_bytes "
        "(CUDA context, NCCL setup, each communicator's buffers): what the caching allocator "
        "may reserve, docs/MEMORY.md",
    }
    return data
