"""Human-readable rendering (rich tables) of what `prismbench.explain` computes.

Only presentation lives here: unit formatting (GiB, PFLOP, B params) and tables. Every
number comes from the library as raw data; `--json` output bypasses this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from prismbench.explain import NARAYANAN_EQ3, Explanation

GIB = 1024**3
PFLOP = 1e15


def format_params(count: float) -> str:
    """Parameter count in billions or millions: 70553706496 -> '70.55 B'."""
    if count >= 1e9:
        return f"{count / 1e9:.2f} B"
    return f"{count / 1e6:.2f} M"


def format_bytes(count: float) -> str:
    return f"{count / GIB:.2f} GiB"


def format_flops(count: float) -> str:
    return f"{count / PFLOP:,.2f} PFLOP"


def render_workloads(rows: Sequence[dict[str, Any]], console: Console) -> None:
    table = Table(title="Model flavors")
    for header in ("name", "family", "layers", "hidden", "ffn", "heads/kv", "vocab", "params"):
        table.add_column(header, justify="left" if header in ("name", "family") else "right")
    for row in rows:
        table.add_row(
            row["name"],
            row["family"],
            str(row["layers"]),
            str(row["hidden"]),
            str(row["ffn_hidden"]),
            f"{row['heads']}/{row['kv_heads']}",
            str(row["vocab"]),
            f"{format_params(row['params'])} params",
        )
    console.print(table)


def _layout_table(e: Explanation) -> Table:
    table = Table(title=f"World layout: {e.model}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    mesh = ", ".join(f"{n}={s}" for n, s in zip(e.mesh_dim_names, e.mesh_shape, strict=True))
    table.add_row("world size", f"{e.world_size:,} GPUs")
    table.add_row("mesh (row-major, tp fastest)", mesh)
    table.add_row("nodes", f"{e.nodes:,} x {e.gpus_per_node} GPUs")
    for axis in e.axes:
        where = (
            "intra-node"
            if axis.intra_node
            else f"inter-node (rank 0's group spans {axis.nodes_per_group} node(s))"
        )
        table.add_row(f"  {axis.name} groups (size {axis.size}, stride {axis.stride})", where)
    table.add_row("virtual stages per rank", str(e.virtual_stages_per_rank))
    table.add_row("micro-batches per iteration", str(e.microbatches_per_iteration))
    table.add_row("tokens per iteration", f"{e.tokens_per_iteration:,}")
    return table


def _stage_table(e: Explanation) -> Table:
    w, g, o = e.state_bytes_per_param
    table = Table(
        title=(
            f"Per-GPU parameters and model state ({e.precision}: {w}+{g}+{o} B/param, "
            f"ZeRO-{e.zero_stage} over dp*cp={e.dp_shard_group})"
        )
    )
    for header in (
        "pp rank",
        "layers",
        "holds",
        "params/GPU",
        "weights",
        "grads",
        "optimizer",
        "model state",
    ):
        table.add_column(header, justify="right")
    for s in e.stages:
        holds = " + ".join(
            x for x, on in (("embedding", s.has_embedding), ("output", s.has_output)) if on
        )
        table.add_row(
            str(s.pp_rank),
            "+".join(map(str, s.layers_per_virtual_stage)),
            holds or "-",
            format_params(s.params_per_rank),
            format_bytes(s.weights_bytes),
            format_bytes(s.grads_bytes),
            format_bytes(s.optimizer_bytes),
            format_bytes(s.model_state_bytes),
        )
    return table


def _zero_table(e: Explanation) -> Table:
    table = Table(title="Model state per GPU by ZeRO stage (* = this job)")
    table.add_column("pp rank", justify="right")
    for zero in range(4):
        table.add_column(f"ZeRO-{zero}{' *' if zero == e.zero_stage else ''}", justify="right")
    for s in e.stages:
        table.add_row(str(s.pp_rank), *map(format_bytes, s.model_state_bytes_by_zero))
    return table


def _flops_table(e: Explanation) -> Table:
    f = e.flops
    table = Table(
        title="FLOPs per iteration (2 per MAC, backward = 2 x forward)", show_header=False
    )
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("forward per token", f"{f.forward_flops_per_token / 1e9:,.2f} GFLOP")
    table.add_row(
        "  of which attention (QK^T, AV; not causal-halved)",
        f"{f.attention_flops_per_token / 1e9:,.2f} GFLOP",
    )
    table.add_row("  of which logits", f"{f.logits_flops_per_token / 1e9:,.2f} GFLOP")
    table.add_row("model FLOPs (no recompute)", format_flops(f.model_flops_per_iteration))
    table.add_row(
        f"hardware FLOPs (recompute={f.recompute})", format_flops(f.hardware_flops_per_iteration)
    )
    table.add_row(
        "model / hardware FLOPs per GPU",
        f"{format_flops(f.model_flops_per_gpu)} / {format_flops(f.hardware_flops_per_gpu)}",
    )
    table.add_row(
        "Narayanan eq. 3 (4h MLP, MHA, full recompute)",
        format_flops(f.narayanan_eq3_flops_per_iteration),
    )
    table.caption = NARAYANAN_EQ3
    return table


def _gpu_table(e: Explanation) -> Table:
    g = e.gpu
    table = Table(title=f"Against the GPU preset {g.gpu}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("HBM capacity", format_bytes(g.hbm_capacity_bytes))
    table.add_row(
        "model state, worst stage (activations not included)",
        f"{format_bytes(e.max_model_state_bytes)} ({g.model_state_fraction_of_hbm:.0%} of HBM)",
    )
    table.add_row(f"dense {e.precision} peak", f"{g.peak_dense_tflops:,.1f} TFLOP/s")
    table.add_row(
        "iteration time at 100% of peak (lower bound)", f"{g.iteration_time_at_peak_s:.3f} s"
    )
    return table


def render_explanation(e: Explanation, console: Console) -> None:
    console.print(_layout_table(e))
    console.print(f"Parameters: {format_params(e.params_total)} params in total")
    console.print(_stage_table(e))
    console.print(_zero_table(e))
    console.print(_flops_table(e))
    console.print(_gpu_table(e))
