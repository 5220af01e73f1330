"""Turn the rows of published_baselines.csv into baseline files the emulator is checked against.

    python results/baselines/make_baselines.py [--out DIR] [--readme PATH]

Each row whose job the spec can express becomes `<source>__<model>__<gpus>g__r<line>.toml`
in this directory (see prismbench/baselines.py for the format); every other row is listed
with its reasons in the generated block of README.md. The mapping rules are the literal
dicts below, and README.md explains each choice. Deterministic: the same CSV gives the
same bytes. Numbers are never changed to make a row pass.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root: runs without installing

from prismbench.baselines import Baseline, Measured, Provenance, baseline_to_toml  # noqa: E402
from prismbench.spec import CUSTOM_MODEL_NAME, SpecError, job_spec_from_dict  # noqa: E402
from workloads.config import stage_layer_counts  # noqa: E402
from workloads.flavors import FLAVORS, find_flavors, parameter_count  # noqa: E402

CSV_PATH = HERE / "published_baselines.csv"
README_PATH = HERE / "README.md"
BEGIN = "<!-- BEGIN make_baselines.py: generated, do not edit by hand -->"
END = "<!-- END make_baselines.py -->"


@dataclass(frozen=True)
class SourceRule:
    """How one source's rows read: flavor names, FLOP and memory conventions, SP."""

    slug: str
    flavor_prefix: str  # the registry names this source's models take (workloads/flavors.py)
    tflops_kind: str  # shared/data/README.md: which FLOPs the source's TFLOP/s count
    mfu_kind: str  # which FLOPs its utilisation percentage counts
    peak_mem_kind: str | None
    sequence_parallel: bool | None  # None: read from the recompute text (Korthikanti)
    framework: str  # workloads.kernels framework whose kernels the source's code runs
    gpus_per_node_unstated: int | None = None  # used when the row leaves gpus_per_node empty
    # the position encoding the source's runs used where it is not the flavor's (a learned
    # table is sized to the run's seq_len, as the run's max_seq_len), with the reason
    positions: tuple[str, str] | None = None
    # the attention dropout of the source's runs where it is not 0, with the reason
    attention_dropout: tuple[float, str] | None = None
    # why the source's runs launched kernels blocking (CUDA_LAUNCH_BLOCKING=1), if they did
    launch_blocking: str | None = None
    # `[kernels]` fields where the source's code is not its framework's choice: (field, value,
    # why), each written to the baseline's assumptions
    kernels: tuple[tuple[str, Any, str], ...] = ()


# Megatron-LM's `--attention-dropout` defaults to 0.1 (megatron/arguments.py at a8d172b31e and
# 2e90a342f5; bigscience's Megatron-DeepSpeed fork the same, megatron/arguments.py at 007719ad5c)
# and none of these sources' launch scripts sets it.
_MEGATRON_DROPOUT = "train.attention_dropout: Megatron's default 0.1 (--attention-dropout in megatron/arguments.py); the source's launch script ({script}) does not set it"
MEGATRON_DROPOUT = {
    "narayanan2021": (0.1, _MEGATRON_DROPOUT.format(
        script="examples/sc21/CONFIG.sh and run_table_1.sh at 4d1c207597^")),
    "megatron-readme2022": (0.1, _MEGATRON_DROPOUT.format(
        script="examples/pretrain_gpt3_175B.sh at 2e90a342f5")),
    "korthikanti2022": (0.1, _MEGATRON_DROPOUT.format(
        script="none published; the paper's activation count (section 4.1) includes the "
        "attention dropout mask and output")),
    "bigscience": (0.1, _MEGATRON_DROPOUT.format(
        script="train/tr11-176B-ml/tr11-176B-ml.slurm at 003b250")),
}

# Megatron-LM launched the input-gradient all-reduce of a column-parallel linear before its
# weight-gradient GEMM from Feb 2022 (83b1e42f30); older code reduced after both.
_NO_TP_GRAD_OVERLAP = "kernels.tp_grad_overlap: false, {code} reduces a column-parallel linear's input gradient in copy_to_tensor_model_parallel_region's backward, after its weight gradient (no async all-reduce)"
_BF16_ALL_REDUCE = "kernels.dp_grad_collective: DeepSpeed's PipelineEngine under bf16 reduces gradients in _exec_reduce_grads -> _bf16_reduce_grads (deepspeed/runtime/pipe/engine.py), an all-reduce (buffered_allreduce_fallback) of the BF16 optimizer's whole flat fp32 gradients (BF16_Optimizer.get_grads_for_reduction, deepspeed/runtime/bf16_optimizer.py); the optimizer then steps its partition and all-gathers the bf16 parameters. Read in DeepSpeed's source and its 2022 forks (the same call in each); the commit BLOOM ran is not pinned here"

# Keyed by the start of the `source` column; a row must match exactly one.
SOURCES = {
    "Narayanan et al. 2021": SourceRule(
        "narayanan2021", "megatron-gpt-", "hardware", "hardware", None, sequence_parallel=False,
        framework="megatron", attention_dropout=MEGATRON_DROPOUT["narayanan2021"],
        kernels=(("tp_grad_overlap", False, _NO_TP_GRAD_OVERLAP.format(
            code="Megatron-LM at a8d172b31e (megatron/mpu/layers.py)")),)),
    "NVIDIA/Megatron-LM README.md (commit 2e90a342f5": SourceRule(
        "megatron-readme2022", "megatron-gpt-", "hardware", "hardware", None,
        sequence_parallel=False, framework="megatron",
        attention_dropout=MEGATRON_DROPOUT["megatron-readme2022"]),
    "Korthikanti et al. 2022": SourceRule(
        "korthikanti2022", "megatron-gpt-", "model", "model", None, sequence_parallel=None,
        framework="megatron", attention_dropout=MEGATRON_DROPOUT["korthikanti2022"]),
    # Megatron-Core of 2024 (flash attention, overlapped gradient reduction) is the code NeMo
    # trains with; the `megatron` framework is Megatron-LM of 2021-22 (workloads/kernels.py)
    "NVIDIA/Megatron-LM README.md 'Training Speed": SourceRule(
        "mcore2024", "mcore-gpt-", "model", "model", None, sequence_parallel=False,
        framework="nemo"),
    "pytorch/torchtitan": SourceRule(
        "torchtitan2024", "llama3.1-", "model", "model", "allocator_reserved",
        sequence_parallel=True, framework="torchtitan"),
    "mosaicml/llm-foundry": SourceRule(
        "llmfoundry", "mpt-", "model", "model", None, sequence_parallel=False,
        framework="llm-foundry", gpus_per_node_unstated=8, positions=(
            "learned", "model.positions: the benchmark's pretrain yamls set no `alibi`, so MPT's "
            "defaults hold (llmfoundry/models/mpt/configuration_mpt.py: alibi False, "
            "learned_pos_emb True) and submit_benchmarks.py sets max_seq_len to the run's "
            "seq_len; the row's NumParams equals this model's parameter count (checked)")),
    "bigscience-workshop/bigscience": SourceRule(
        "bigscience", "bloom-", "hardware", "hardware", "nvidia_smi", sequence_parallel=False,
        framework="megatron", attention_dropout=MEGATRON_DROPOUT["bigscience"],
        launch_blocking="kernels.launch_blocking: tr11-176B-ml.slurm (at 003b250) exports "
        "CUDA_LAUNCH_BLOCKING=1 ('do not remove or the training will hang')",
        kernels=(("tp_grad_overlap", False, _NO_TP_GRAD_OVERLAP.format(
            code="bigscience-workshop/Megatron-DeepSpeed at b1359ee054 (megatron/mpu/layers.py)")),
                 ("dp_grad_collective", "all-reduce", _BF16_ALL_REDUCE))),
    "karpathy/llm.c": SourceRule(
        "llmc", "gpt2-", "model", "model", None, sequence_parallel=False, framework="llm.c"),
}  # fmt: skip

ZERO_STAGES = {
    "none": 0,
    "none (Megatron DDP)": 0,
    "ZeRO-0 (DeepSpeed)": 0,
    "ZeRO-1 (DeepSpeed)": 1,
    "ZeRO-1 (-z 1)": 1,
    "FSDP SHARD_GRAD_OP (ZeRO-2-like)": 2,
    "FSDP FULL_SHARD (ZeRO-3-like)": 3,
    "FSDP2 (fully sharded, ZeRO-3-like)": 3,
}

# precision text -> (spec precision, what the spec cannot say about it or None)
PRECISIONS = {
    "fp16": ("fp16", None),
    "fp16 mixed (--fp16)": ("fp16", None),
    "mixed (16-bit)": (
        "fp16",
        "precision: the source says only '16-bit'; fp16 is used (A100 fp16 and "
        "bf16 tensor-core peaks are equal, 312 TFLOP/s, and both are 2 bytes)",
    ),
    "bf16": ("bf16", None),
    "bf16 (llm.c default)": ("bf16", None),
    "bf16 (BF16_Optimizer, fp32 grad accum)": (
        "bf16",
        "precision: fp32 gradient accumulation is not a spec field",
    ),
    "bf16 (new BF16_Optimizer, fp32 grad accum)": (
        "bf16",
        "precision: fp32 gradient accumulation is not a spec field",
    ),
    "amp_bf16 (MP mode DEFAULT)": (
        "bf16",
        "precision: FSDP mixed-precision DEFAULT reduces "
        "gradients in fp32; the spec cannot say the reduce dtype",
    ),
    "bf16 (MP mode PURE)": ("bf16", None),
    "amp_fp8 (MP mode DEFAULT)": (
        "fp8",
        "precision: FSDP mixed-precision DEFAULT reduces gradients "
        "in fp32; the spec cannot say the reduce dtype",
    ),
    "bf16 + Float8 linears": ("fp8", None),  # spec: fp8 = torchtitan Float8 linears, bf16 elsewhere
}

RECOMPUTE = {
    "none": "none",
    "none (-r 0)": "none",
    "selective": "selective",
    "selective (attention core) + sequence parallelism": "selective",
    "selective + sequence parallelism": "selective",
    "full": "full",
    "full (uniform, 1 layer/ckpt)": "full",
    "full (--activations-checkpoint-method uniform)": "full",
    "full recompute, no sequence parallelism": "full",
    "full (FSDP activation checkpointing)": "full",
    "full (DeepSpeed activation checkpointing)": "full",
}
# Korthikanti's recompute column also says whether sequence parallelism was on.
SEQUENCE_PARALLEL_IN_RECOMPUTE = {
    "full recompute, no sequence parallelism": False,
    "selective (attention core) + sequence parallelism": True,
    "selective + sequence parallelism": True,
}

# gpu text -> (gpu preset, assumption or None)
GPUS = {
    "A100 SXM4 80GB": ("a100-sxm-80g", None),
    "A100 80GB SXM": ("a100-sxm-80g", None),
    "A100 80GB": (
        "a100-sxm-80g",
        "gpu: 'A100 80GB' read as the SXM4 part (NVLink/"
        "NVSwitch nodes of 8; the PCIe card has no NVSwitch)",
    ),
    "A100 40GB": (
        "a100-sxm-40g",
        "gpu: 'A100 40GB' read as the SXM4 part (NVLink/"
        "NVSwitch nodes of 8; the PCIe card has no NVSwitch)",
    ),
    "H100 80GB": (
        "h100-sxm-80g",
        "gpu: 'H100 80GB' read as the SXM5 part (HGX nodes of 8; the PCIe card has no NVSwitch)",
    ),
    "H100 80GB SXM": ("h100-sxm-80g", None),
    "H100 96GB HBM2e (2.4 TB/s), 500W power limit (Grand Teton)": ("h100-hbm2e-96g", None),
}  # "H100" alone (Megatron-Core 2024) names no part and is refused

# interconnect text -> inter-node network preset (None: not stated)
NETWORKS = {
    "NVLink/NVSwitch intra-node; 8x Mellanox HDR 200Gb/s InfiniBand HCAs per node (1 per GPU); "
    "3-level fat tree": "ib-hdr-8x200",
    "Selene (see Narayanan rows)": "ib-hdr-8x200",
    "1600 Gbps node-node RoCE": "roce-8x200",
    "NVLink intra-node (8 GPUs); 4 Omni-Path (OPA) links per node inter-node": "opa-4x100",
    "NVLink intra-node (8 GPUs); RDMA backend 400 Gb/s per GPU": "roce-8x400",
    "not stated": None,
    "": None,
}
NETWORK_ASSUMPTIONS = {
    "roce-8x200": "inter_node: '1600 Gbps node-node RoCE' read as 8 x 200 Gb/s NICs (one per GPU)",
    "roce-8x400": "inter_node: torchtitan says 'backend RDMA network with 400 Gb/s per GPU' without "
    "naming RoCE or InfiniBand; roce-8x400 (Meta's Grand Teton RoCE clusters) is used; "
    "its NIC bandwidth equals ib-ndr-8x400's, so the choice does not change the cost",
    "opa-4x100": "inter_node: 4 Omni-Path links per node read as 4 x 100 Gb/s (Omni-Path's rate)",
}

# Settings in the notes that the spec cannot say (pattern -> reason): none at present.
UNSAYABLE: dict[str, str] = {}
# Settings in the notes that the spec says (pattern -> `[kernels]` field and value): torchtitan's
# tables name torch.compile and AsyncTP per run ("FSDP + torch.compile", "2D + AsyncTP");
# Narayanan's run_table_1.sh sets `--DDP-impl torch` for 1.7B-18B, and Megatron-LM then wraps
# the model in torch DDP, which all-reduces gradient buckets during the last micro-batch's
# backward (schedules.py runs the others under `no_sync`, at a8d172b31e): overlapped, where
# `--DDP-impl local` (the framework's choice) reduces after backward.
NOTED_KERNELS = {
    r"\bcompile\b": ("compile", True),
    r"\bAsyncTP\b": ("async_tp", True),
    r"DDP impl=torch": ("grad_reduce", "overlapped"),
}
REQUIRED = ("layers", "hidden", "heads", "seq_len", "tp", "pp", "dp", "zero_stage", "micro_batch",
            "global_batch", "precision", "recompute", "gpu")  # fmt: skip
POSITIONS_BY_NAME = {"mpt": "alibi", "bloom": "alibi", "llama": "rope", "gpt": "learned"}


def source_rule(source: str) -> SourceRule:
    matches = [rule for prefix, rule in SOURCES.items() if source.startswith(prefix)]
    if len(matches) != 1:
        raise SystemExit(f"source {source[:60]!r} matches {len(matches)} rules in SOURCES")
    return matches[0]


def _int(text: str) -> int | None:
    return int(text) if text.strip() else None


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")


class Refused(Exception):
    """A row the spec cannot express; args are its (key, message) reasons."""


_TORCHTITAN = "torchtitan at 9dec370, the benchmark's commit"


def torchtitan_stage_layers(layers: int, stages: int) -> tuple[int, ...]:
    """The layers per stage torchtitan's generate_split_points gives when no split points are
    set (torchtitan/parallelisms/pipelining_utils.py at 9dec370): layers // stages each, the
    remainder one layer each to the middle stages from the second on."""
    base, extra = divmod(layers, stages)
    counts = [base] * stages
    for stage in range(1, 1 + extra):
        counts[stage] += 1
    return tuple(counts)


def torchtitan_unstated(row: dict) -> tuple[dict[str, str], list[str]]:
    """Columns a torchtitan row leaves empty that torchtitan's code fixes when the command
    line does not set them, and why. The pipelined runs (Tables 5 and 6) state only their
    local batch; with pp > 1 torchtitan splits it into pp micro-batches, and a looped schedule
    without split points gets 2 stages per rank. A row whose generated layer split is not the
    spec's gets nothing filled (and is refused for what it lacks)."""
    local = re.search(r"local batch (\d+)", row["notes"])
    pp, dp, layers = _int(row["pp"]) or 1, _int(row["dp"]), _int(row["layers"])
    if local is None or pp == 1 or dp is None or layers is None:
        return {}, []
    local_batch = int(local[1])
    filled, why = {}, []
    if not row["vpp"].strip() and "interleaved 1f1b" in row["notes"].lower():
        filled["vpp"] = "2"
        why.append("parallel.vpp: not stated; with no --experimental.pipeline_parallel_split_points "
                   f"torchtitan's generate_split_points ({_TORCHTITAN}) gives a looped schedule "
                   "2 stages per rank")  # fmt: skip
    stages = pp * int(filled.get("vpp") or row["vpp"].strip() or 1)
    counts = stage_layer_counts(layers, stages)
    if torchtitan_stage_layers(layers, stages) != counts:
        return {}, []
    if not row["micro_batch"].strip() and local_batch % pp == 0:
        filled["micro_batch"] = str(local_batch // pp)
        why.append("batch.micro_batch: not stated; torchtitan's build_pipeline_schedule "
                   f"({_TORCHTITAN}) splits the local batch into pipeline_parallel_degree "
                   "micro-batches when --experimental.pipeline_parallel_microbatches is not set: "
                   f"{local_batch} / {pp}")  # fmt: skip
    if not row["global_batch"].strip():
        filled["global_batch"] = str(local_batch * dp)
        why.append("batch.global_batch: not stated; the local batch times the data-parallel "
                   "(FSDP) degree, torchtitan's global batch (as Table 2's rows derive it): "
                   f"{local_batch} x {dp}")  # fmt: skip
    if filled:
        why.append(f"parallel.pp: torchtitan's generated split of {layers} layers into {stages} "
                   f"stages ({', '.join(map(str, counts))}) is the spec's "
                   "(workloads.config.stage_layer_counts)")  # fmt: skip
    return filled, why


# Per framework: the columns its code fixes where a row leaves them empty.
UNSTATED_BY_FRAMEWORK = {"torchtitan": torchtitan_unstated}


def model_table(row: dict, rule: SourceRule, assumptions: list[str]) -> dict:
    """The registry flavor with the row's dims (exactly one under the source's prefix), else dims."""
    dims = {"layers": _int(row["layers"]), "hidden": _int(row["hidden"]), "heads": _int(row["heads"]),
            "ffn_hidden": _int(row["ffn"]), "kv_heads": _int(row["kv_heads"]),
            "vocab": _int(row["vocab"])}  # fmt: skip
    names = [n for n in find_flavors(**dims) if n.startswith(rule.flavor_prefix)]
    if len(names) > 1:  # identical dims under two names (bloom-176b): the one the row names
        names = [n for n in names if _slug(row["model"]).startswith(n)] or names
    if len(names) > 1:
        raise Refused(("ambiguous flavor", f"dims match several flavors: {names}"))
    if names:
        if dims["vocab"] is None:
            assumptions.append(
                f"model.vocab: the row gives none; flavor {names[0]}'s "
                f"{FLAVORS[names[0]].vocab} is used (see workloads/flavors.py)"
            )
        if rule.positions is None:
            return {"name": names[0]}
        positions, why = rule.positions
        assumptions.append(why)
        table = {"name": names[0], "positions": positions}
        return table | ({"max_seq_len": int(row["seq_len"])} if positions == "learned" else {})
    lacking = [k for k in ("ffn_hidden", "vocab") if dims[k] is None]
    if lacking:
        raise Refused(
            *[(f"{k} not stated", f"no flavor matches and the row gives no {k}") for k in lacking]
        )
    name = row["model"].lower()
    family = "llama" if "llama" in name else "gpt"
    positions = next(p for key, p in POSITIONS_BY_NAME.items() if key in name or key == "gpt")
    table = {"family": family, "positions": positions, **dims}
    if table["kv_heads"] is None:
        table["kv_heads"] = table["heads"]
    if positions == "learned":
        table["max_seq_len"] = int(row["seq_len"])
    return table


def check_row(row: dict) -> None:
    """Reasons visible without building the spec: missing fields, settings it cannot say."""
    reasons = [(f"{col} not stated", f"the row does not state {col}") for col in REQUIRED
               if not row[col].strip()]  # fmt: skip
    reasons += [(why.split(" (")[0], f"notes name {why}") for pattern, why in UNSAYABLE.items()
                if re.search(pattern, row["notes"])]  # fmt: skip
    if _int(row["ep"]) not in (None, 1):
        reasons.append(
            ("expert parallelism", f"ep={row['ep']}: the spec has no expert parallelism")
        )
    if "interleaved 1f1b" in row["notes"].lower() and not row["vpp"].strip():
        reasons.append(("vpp not stated", "notes say Interleaved 1F1B but the row gives no vpp"))
    if row["gpu"].strip() and row["gpu"] not in GPUS:
        reasons.append(("GPU part not identified", f"gpu {row['gpu']!r} names no preset's part"))
    for column, known in (("zero_stage", ZERO_STAGES), ("precision", PRECISIONS),
                          ("recompute", RECOMPUTE), ("interconnect", NETWORKS)):  # fmt: skip
        if row[column].strip() and row[column] not in known:
            raise SystemExit(f"{column} text {row[column]!r} is not in the mapping; add it")
    if reasons:
        raise Refused(*reasons)


def job_tables(row: dict, rule: SourceRule, assumptions: list[str]) -> dict:
    tp, pp, dp = int(row["tp"]), int(row["pp"]), int(row["dp"])
    gpus = _int(row["gpus_total"])
    cp = _int(row["cp"])
    if cp is None:
        if gpus is None or gpus % (tp * pp * dp):
            raise Refused(
                ("cp not stated", "the row gives neither cp nor a world size that fixes it")
            )
        cp = gpus // (tp * pp * dp)
        assumptions.append(
            f"parallel.cp: not in the row; gpus_total/(tp*pp*dp) = {gpus}/{tp * pp * dp} = {cp}"
        )
    if gpus is not None and gpus != tp * pp * dp * cp:
        raise Refused(
            ("world size mismatch", f"tp*pp*dp*cp = {tp * pp * dp * cp} but gpus_total = {gpus}")
        )
    vpp = _int(row["vpp"]) or 1
    sp = rule.sequence_parallel
    if sp is None:
        sp = SEQUENCE_PARALLEL_IN_RECOMPUTE[row["recompute"]]
    gpu, gpu_note = GPUS[row["gpu"]]
    precision, precision_note = PRECISIONS[row["precision"]]
    assumptions += [note for note in (gpu_note, precision_note) if note]
    # the intra-node link is left to the spec: the GPU's own board's (`GpuPreset.intra_node`)
    cluster = {"gpu": gpu, "gpus_per_node": _int(row["gpus_per_node"])}
    if cluster["gpus_per_node"] is None:
        if rule.gpus_per_node_unstated is None:
            raise Refused(("gpus_per_node not stated", "the row does not state gpus_per_node"))
        cluster["gpus_per_node"] = rule.gpus_per_node_unstated
        assumptions.append(
            f"cluster.gpus_per_node: not in the row; {rule.gpus_per_node_unstated} "
            "(every run of this source uses a multiple of 8 GPUs, 8 at least)"
        )
    network = NETWORKS[row["interconnect"]]
    if network is None:
        if gpus is None or gpus > cluster["gpus_per_node"]:
            raise Refused(("network not stated", "multi-node job and the row names no network"))
        assumptions.append(
            "cluster.inter_node: not stated; the job fits in one node, so the "
            "network is unused and the spec's default stands"
        )
    else:
        cluster["inter_node"] = network
        if network in NETWORK_ASSUMPTIONS:
            assumptions.append(NETWORK_ASSUMPTIONS[network])
    assumptions.append(
        "train.optimizer: the CSV does not say; adamw, the spec's only optimizer "
        "(all these codebases train with Adam or AdamW)"
    )
    return {
        "parallel": {"tp": tp, "sequence_parallel": sp and tp > 1, "pp": pp, "vpp": vpp,
                     "schedule": "interleaved-1f1b" if vpp > 1 else "1f1b", "cp": cp, "dp": dp,
                     "zero": ZERO_STAGES[row["zero_stage"]]},
        "batch": {"seq_len": int(row["seq_len"]), "micro_batch": int(row["micro_batch"]),
                  "global_batch": int(row["global_batch"])},
        "train": {"precision": precision, "recompute": RECOMPUTE[row["recompute"]],
                  "optimizer": "adamw", **_attention_dropout(rule, assumptions)},
        "kernels": {"framework": rule.framework,
                    **{field: value for pattern, (field, value) in NOTED_KERNELS.items()
                       if re.search(pattern, row["notes"])},
                    **_launch_blocking(rule, assumptions),
                    **_source_kernels(rule, assumptions)},
        "cluster": cluster,
    }  # fmt: skip


def _source_kernels(rule: SourceRule, assumptions: list[str]) -> dict:
    assumptions.extend(why for _, _, why in rule.kernels)
    return {field: value for field, value, _ in rule.kernels}


def _launch_blocking(rule: SourceRule, assumptions: list[str]) -> dict:
    if rule.launch_blocking is None:
        return {}
    assumptions.append(rule.launch_blocking)
    return {"launch_blocking": True}


def _attention_dropout(rule: SourceRule, assumptions: list[str]) -> dict:
    if rule.attention_dropout is None:
        return {}
    probability, why = rule.attention_dropout
    assumptions.append(why)
    return {"attention_dropout": probability}


def _num(text: str) -> float | None:
    return float(Decimal(text)) if text.strip() else None


def measured(row: dict, rule: SourceRule, derived: dict[str, str]) -> Measured:
    mfu = float(Decimal(row["mfu"]) / 100) if row["mfu"].strip() else None
    figures = {
        "iteration_time_s": _num(row["iter_time_s"]),
        "tokens_per_s_per_gpu": _num(row["tokens_per_s_per_gpu"]),
        "tflops_per_gpu": _num(row["tflops_per_gpu"]),
        "mfu": mfu,
        "peak_mem_bytes": int(round(Decimal(row["peak_mem_gib"]) * 2**30))
        if row["peak_mem_gib"].strip() else None,
    }  # fmt: skip
    if figures["peak_mem_bytes"] is not None:
        derived["peak_mem_bytes"] = f"{row['peak_mem_gib']} GiB x 2^30, rounded to the byte"
    if "tokens/s/GPU =" in row["notes"]:
        derived["tokens_per_s_per_gpu"] = "worked out in the CSV (see notes)"
    gbs, seq, gpus = int(row["global_batch"]), int(row["seq_len"]), _int(row["gpus_total"])
    if figures["iteration_time_s"] is None and figures["tokens_per_s_per_gpu"] and gpus:
        tps = row["tokens_per_s_per_gpu"]
        figures["iteration_time_s"] = gbs * seq / (figures["tokens_per_s_per_gpu"] * gpus)
        derived["iteration_time_s"] = (
            f"global_batch*seq_len / (tokens_per_s_per_gpu*gpus) = {gbs}*{seq} / ({tps}*{gpus})"
        )
    if not any(v is not None for v in figures.values()):
        oom = "OOM" in row["notes"]
        raise Refused(
            (
                "no measured figure",
                "the run went out of memory" if oom else "the row reports no figure",
            )
        )
    kinds = {
        "tflops_kind": rule.tflops_kind if figures["tflops_per_gpu"] else None,
        "mfu_kind": rule.mfu_kind if mfu else None,
        "peak_mem_kind": rule.peak_mem_kind if figures["peak_mem_bytes"] else None,
    }
    return Measured(**figures, **kinds)


def check_parameter_count(model, row: dict) -> None:
    """A row that states its model's parameter count ("NumParams=N" in its notes) must describe
    the model the spec builds: the count decides what the program computes and holds."""
    stated = re.search(r"NumParams=(\d+)", row["notes"])
    if stated and int(stated[1]) != parameter_count(model):
        raise SystemExit(
            f"{row['source'][:40]!r} {row['model']} s{row['seq_len']}: NumParams={stated[1]} "
            f"but the spec's model has {parameter_count(model)}; fix the flavor or the rule"
        )


def convert(line: int, row: dict) -> Baseline:
    """The baseline of one CSV row (line = its line in the file); raises Refused with reasons."""
    rule = source_rule(row["source"])
    assumptions: list[str] = []
    fill = UNSTATED_BY_FRAMEWORK.get(rule.framework)
    if fill is not None:
        filled, why = fill(row)
        row = {**row, **filled}
        assumptions += why
    check_row(row)
    if rule.peak_mem_kind == "nvidia_smi" and row["peak_mem_gib"].strip():
        assumptions.append(
            "measured.peak_mem_bytes: the source's 'GB' read as GiB (nvidia-smi reports MiB)"
        )
    tables = {"model": model_table(row, rule, assumptions), **job_tables(row, rule, assumptions)}
    try:
        job = job_spec_from_dict(tables)
    except SpecError as err:
        rule_text = re.sub(r"\(\d+\)", "(N)", str(err).split(":")[0])
        raise Refused(("spec: " + rule_text, str(err))) from None
    check_parameter_count(job.model, row)
    derived: dict[str, str] = {}
    figures = measured(row, rule, derived)
    name = f"{rule.slug}__{_slug(job.model.name if job.model.name != CUSTOM_MODEL_NAME else row['model'])}"
    return Baseline(
        name=f"{name}__{job.world_size}g__r{line:03d}",
        job=job,
        measured=figures,
        provenance=Provenance(source=row["source"], csv_row=line, model=row["model"],
                              notes=row["notes"], approximate="approximate" in row["notes"],
                              derived=derived, assumptions=tuple(assumptions)),
    )  # fmt: skip


def convert_all(csv_path: Path) -> tuple[list[Baseline], list[tuple[int, dict, tuple]]]:
    """Every row: the baselines made and the rows refused with their reasons."""
    made, refused = [], []
    with open(csv_path, newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            try:
                made.append(convert(line, row))
            except Refused as why:
                refused.append((line, row, why.args))
    return made, refused


def readme_block(made: list[Baseline], refused: list[tuple[int, dict, tuple]]) -> str:
    """The generated README block: counts per source and reason, and every refused row."""
    total = Counter(source_rule(b.provenance.source).slug for b in made)
    skipped = Counter(source_rule(row["source"]).slug for _, row, _ in refused)
    reasons = Counter(key for _, _, why in refused for key, _ in why)
    out = [BEGIN, "", "| source | rows | baselines | not expressible |", "|---|--:|--:|--:|"]
    for rule in SOURCES.values():
        n, m = total[rule.slug], skipped[rule.slug]
        out.append(f"| {rule.slug} | {n + m} | {n} | {m} |")
    out.append(f"| **all** | {len(made) + len(refused)} | {len(made)} | {len(refused)} |")
    out += ["", "Reasons (a row may have several):", "", "| reason | rows |", "|---|--:|"]
    out += [
        f"| {key} | {count} |"
        for key, count in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    ]
    out += ["", "Rows not expressible (row = line in `published_baselines.csv`, header = 1):", "",
            "| row | source | model | reasons |", "|--:|---|---|---|"]  # fmt: skip
    for line, row, why in refused:
        unstated = [
            key.removesuffix(" not stated") for key, _ in why if key.endswith(" not stated")
        ]
        messages = [message for key, message in why if not key.endswith(" not stated")]
        if unstated:
            messages.insert(0, f"not stated: {', '.join(unstated)}")
        text = "; ".join(messages).replace("|", "\\|")
        out.append(f"| {line} | {source_rule(row['source']).slug} | {row['model']} | {text} |")
    return "\n".join([*out, "", END])


def write(out_dir: Path, readme: Path | None, csv_path: Path = CSV_PATH) -> list[Path]:
    """Write every baseline into out_dir (stale *.toml there removed) and the README block."""
    made, refused = convert_all(csv_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("*.toml"):
        stale.unlink()
    paths = []
    for baseline in made:
        path = out_dir / f"{baseline.name}.toml"
        header = (
            f"Generated by make_baselines.py from published_baselines.csv line "
            f"{baseline.provenance.csv_row}; do not edit by hand."
        )
        path.write_text(baseline_to_toml(baseline, header))
        paths.append(path)
    if readme is not None:
        text = readme.read_text()
        head = text.split(BEGIN)[0].rstrip("\n")
        tail = text.split(END, 1)[1] if END in text else "\n"
        readme.write_text(f"{head}\n\n{readme_block(made, refused)}{tail}")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="directory for the .toml files")
    parser.add_argument(
        "--readme",
        type=Path,
        default=README_PATH,
        help="README whose generated block is rewritten ('-' for none)",
    )
    args = parser.parse_args(argv)
    readme = None if str(args.readme) == "-" else args.readme
    paths = write(args.out, readme)
    print(f"{len(paths)} baselines written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
