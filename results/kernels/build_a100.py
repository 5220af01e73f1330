"""Build the kernel tables of GPUs we cannot measure: A100 SXM 80 GB and 40 GB, H100 HBM2e 96 GB.

    python results/kernels/build_a100.py      (from the repository root; reads only committed
                                               files: results/kernels/sources/ and
                                               results/kernels/h100-sxm-80g.csv; ~10 s)

Writes results/kernels/a100-sxm-80g.csv, a100-sxm-40g.csv and h100-hbm2e-96g.csv (columns:
`emulator.costs.kernel_table.COLUMNS`) and prints the checks README.md and
results/calibration/a100.md quote. Every row's `source` says where it comes from:

**a100-sxm-80g, published kernel measurements** (sources/README.md has the provenance):
- `vidur:<model>:tp<t>:<op>@<tokens>`: microsoft/vidur's A100 profiles (kernel-only: profiler
  kernel records summed per operation, fp16, forward): the four linear layers of eight models
  as GEMMs, and, where the op is one torch kernel the capture records as one op, the residual
  add, the embedding (tp 1) and phi-2's LayerNorm and GELU. vidur's custom kernels (RMSNorm,
  SiLU-and-mul, rotary) are left out: no op of ours runs them.
- `llmcompass:<kind>:<line>`: LLMCompass's A100 GEMM (bf16) and GELU (fp16) sweeps. They time
  one call with time.time() around a synchronize, so each carries host time: the sweep's smallest
  problem (whose kernel takes a few us) sets that overhead, which is subtracted, and only rows of
  at least 10x it are kept (LayerNorm and softmax have none and are left out).
- `mamf:<accelerator>`: stas00/ml-engineering's maximum achievable matmul FLOPS (one shape).
- `fa2:<causal>:d<head_dim>:s<seq>`: the FlashAttention-2 A100 80GB SXM4 forward+backward
  benchmark (README figure), split into forward and backward by FA2_BWD_OVER_FWD_RATE.
16-bit rows appear twice, as fp16 and bf16 (the A100's tensor-core and HBM rates are the same
for both [GA100-WP]; Megatron's published runs are fp16, the others bf16): `[as bf16]`/`[as fp16]`.

**transferred rows** (`rule:<src>-><dst>; <the source row>`), by `transfer_factor`: the time
on the source GPU times attainable_src / attainable_dst, the attainable rate being the roofline
min(dense peak of the dtype, intensity x achieved HBM bandwidth) at the op's arithmetic
intensity (FLOPs / bytes; memory-bound classes: 0, i.e. the ratio of achieved bandwidths), with
datasheet peaks and the presets' achieved HBM figures (`hbm_bandwidth_GBps x hbm_efficiency`).
That is "the same fraction of the attainable roofline at the same intensity"; `vidur_pair_check`
tests it on vidur's own A100/H100 pairs, `h200_pair_check` on the shared H100 and H200
microbenchmarks (same shapes, same method, both measured). Which rows are transferred:
- h100-sxm-80g -> a100-sxm-80g: every H100 row whose shape no published A100 row of its own group
  covers within the interpolation radius (factor 2), except fp8 (no fp8 on A100) and attention
  (on the H100 torch's SDPA ran cuDNN's kernel; the A100 runs FlashAttention-2, measured above).
- a100-sxm-80g -> a100-sxm-40g: every row (same SMs and peaks; HBM2 at 1555 against HBM2e at
  2039 GB/s [A100-DS], the same achieved fraction assumed: the 40 GB preset has no own figure).
- h100-sxm-80g -> h100-hbm2e-96g: every row (HBM2e 2.4 TB/s, from torchtitan's benchmark notes
  as emulator/hardware/h100-hbm2e-96g.toml cites them). Its 500 W power cap enters through the
  preset's peaks: torchtitan puts the part's peak between the SXM's and the NVL's, and the
  preset takes the midpoint (its comment cites both figures). No published bf16 tensor-core
  throughput at 500 W was found (arXiv 2604.11391 power-caps an H100 HBM2e 94 GB, but with fp64
  DGEMM), so this is a documented assumption, not a measurement.
"""

from __future__ import annotations

import argparse
import csv
import functools
import math
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from emulator.costs.kernel_table import (  # noqa: E402
    COLUMNS,
    SHAPE_FIELDS,
    KernelTable,
    _features,
    group_key,
    load_kernel_table,
    row_op,
)
from emulator.costs.ops import ATTENTION_OPS, GEMM_OPS, OpRecord, attention_op, gemm_op  # noqa: E402
from emulator.hardware import GpuPreset, gpu_preset  # noqa: E402

KERNELS = ROOT / "results" / "kernels"
SOURCES = KERNELS / "sources"
# FlashAttention-2 (Dao 2023, sec. 4.1) reports up to 73 % of the A100's peak in the forward pass
# and up to 63 % in the backward: the published forward+backward figure is split with that ratio
# of rates (with it, its best point, 203 TFLOP/s at d=128, gives a 226 TFLOP/s forward: 72 %).
FA2_BWD_OVER_FWD_RATE = 63 / 73
# LLMCompass rows are kept when at least this many times the sweep's host overhead.
HOST_OVERHEAD_MULTIPLE = 10
SIXTEEN_BIT = {"fp16": "bf16", "bf16": "fp16"}
VIDUR_GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")


def achieved_hbm_GBps(gpu: GpuPreset) -> float:
    """The preset's achieved HBM bandwidth (datasheet x its measured STREAM-copy fraction)."""
    return gpu.hbm_bandwidth_GBps * gpu.hbm_efficiency


def attainable_per_s(gpu: GpuPreset, dtype: str, intensity: float) -> float:
    """Roofline rate at `intensity` FLOP/byte: FLOP/s, or bytes/s for memory-bound ops (0)."""
    bandwidth = achieved_hbm_GBps(gpu) * 1e9
    if intensity <= 0:
        return bandwidth
    peak = gpu.peak_tflops(dtype) * 1e12
    return min(peak, intensity * bandwidth)


def transfer_factor(op: OpRecord, src: GpuPreset, dst: GpuPreset) -> float:
    """time on dst / time on src for `op`: the same fraction of the attainable roofline."""
    compute = op.name in GEMM_OPS or op.name in ATTENTION_OPS
    intensity = op.flops / op.bytes_total if compute and op.bytes_total else 0.0
    return attainable_per_s(src, op.dtype, intensity) / attainable_per_s(dst, op.dtype, intensity)


def read_csv(path: Path) -> list[dict]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def row(fields: dict, time_us: float, source: str, gpu: str, *, date: str = "", torch: str = "",
        repetitions="", spread_us="") -> dict:  # fmt: skip
    blank = dict.fromkeys(COLUMNS, "")
    return blank | fields | {"time_us": time_us, "repetitions": repetitions, "spread_us": spread_us,
                             "gpu": gpu, "torch": torch, "date": date, "source": source}  # fmt: skip


def op_fields(op: OpRecord) -> dict:
    from emulator.costs.kernel_table import row_fields

    return row_fields(op)


def vidur_gemm_shape(r: dict) -> dict[str, tuple[int, int, bool]]:
    """(n, k, bias) of the four linear layers of one vidur row's model at its TP degree."""
    heads, kv, hidden, ffn, tp = (
        int(r[c]) for c in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "tp")
    )
    head_dim, gate = hidden // heads, 2 if r["use_gated_mlp"] == "True" else 1
    bias_all, bias_qkv = "phi-2" in r["model"], "Qwen" in r["model"] or "phi-2" in r["model"]
    return {
        "attn_pre_proj": ((heads + 2 * kv) * head_dim // tp, hidden, bias_qkv),
        "attn_post_proj": (hidden, heads * head_dim // tp, bias_all),
        "mlp_up_proj": (gate * ffn // tp, hidden, bias_all),
        "mlp_down_proj": (hidden, ffn // tp, bias_all),
    }


@functools.cache
def _recorded(bench_op: str, shape: tuple[int, ...]) -> dict:
    from prismbench.microbench_rows import recorded_fields

    return recorded_fields(bench_op, list(shape))


def recorded_fields(bench_op: str, shape: list[int]) -> dict:
    """The fields of the op the capture records for a benchmark call (`prismbench.microbench_rows`),
    replayed once per shape."""
    return dict(_recorded(bench_op, tuple(shape)))


def vidur_memory_fields(r: dict) -> dict | None:
    """The captured op of one of vidur's memory-bound timings, or None when none of ours is it."""
    tokens, hidden, tp = int(r["num_tokens"]), int(r["n_embd"]), int(r["tp"])
    phi = "phi-2" in r["model"]
    if r["op"] == "add" and not phi:  # phi-2 adds three tensors (two kernels)
        fields = recorded_fields("add", [tokens, hidden])
    elif r["op"] == "emb" and tp == 1:  # tp > 1 also masks the vocabulary
        fields = recorded_fields("embedding_fwd", [tokens, int(r["vocab_size"]), hidden])
    elif r["op"] == "input_layernorm" and phi:  # torch.nn.LayerNorm (the others: vLLM's RMSNorm)
        fields = recorded_fields("layer_norm_fwd", [tokens, hidden])
    elif r["op"] == "mlp_act" and phi:  # torch.nn.GELU (the others: vLLM's SiLU-and-mul)
        fields = recorded_fields("gelu_fwd", [tokens, int(r["n_expanded_embd"]) // tp])
    else:
        return None
    return fields | {"dtype": "fp16"}


def vidur_rows(gpu_label: str) -> list[dict]:
    rows = []
    for r in read_csv(SOURCES / "vidur_mlp.csv"):
        if r["gpu"] != "a100":
            continue
        where = f"vidur:{r['model']}:tp{r['tp']}:{r['op']}@{r['num_tokens']}"
        time_us = float(r["median_ms"]) * 1e3
        if r["op"] in VIDUR_GEMMS:
            n, k, bias = vidur_gemm_shape(r)[r["op"]]
            op = gemm_op("addmm" if bias else "mm", int(r["num_tokens"]), n, k, dtype="fp16")
            fields = op_fields(replace(op, aten="aten.addmm" if bias else "aten.mm"))
        else:
            fields = vidur_memory_fields(r)
            if fields is None:
                continue
        rows.append(
            row(
                fields,
                time_us,
                where,
                gpu_label,
                date="2024-11-19",
                spread_us=float(r["std_ms"]) * 1e3,
            )
        )
    return rows


def llmcompass_rows(gpu_label: str) -> list[dict]:
    published = read_csv(SOURCES / "llmcompass_a100.csv")
    rows = []
    for kind in ("matmul", "gelu"):
        sweep = [(line, r) for line, r in enumerate(published, start=2) if r["kind"] == kind]
        overhead = min(float(r["latency_us"]) for _, r in sweep)
        for line, r in sweep:
            latency = float(r["latency_us"])
            if latency < HOST_OVERHEAD_MULTIPLE * overhead:
                continue
            if kind == "matmul":
                op = gemm_op("mm", int(r["m"]), int(r["n"]), int(r["k"]), dtype="bf16")
                fields = op_fields(replace(op, aten="aten.mm"))
            else:
                fields = recorded_fields("gelu_fwd", [int(r["m"]) // 1024, 1024]) | {
                    "dtype": "fp16"
                }
            where = f"llmcompass:{kind}:{line} (less {overhead:.1f} us host time)"
            rows.append(row(fields, latency - overhead, where, gpu_label, date="2025-10-24"))
    return rows


def mamf_rows(gpu_label: str) -> list[dict]:
    rows = []
    for r in read_csv(SOURCES / "mamf.csv"):
        if "A100" not in r["accelerator"]:
            continue
        m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
        op = replace(gemm_op("mm", m, n, k, dtype=r["dtype"]), aten="aten.mm")
        time_us = op.flops / (float(r["mamf_tflops"]) * 1e12) * 1e6
        rows.append(row(op_fields(op), time_us, f"mamf:{r['accelerator']}", gpu_label,
                        date="2026-08-22", torch=r["torch"], repetitions=100))  # fmt: skip
    return rows


def fa2_rows(gpu_label: str) -> list[dict]:
    """Forward and backward rows of each FA2 benchmark point: time = FLOPs / rate (FA2's own
    counting: forward 4 s^2 d h b, halved when causal; backward 2.5x), the rates split so that
    rate_bwd = FA2_BWD_OVER_FWD_RATE x rate_fwd."""
    rows = []
    for r in read_csv(SOURCES / "fa2_a100_fwd_bwd.csv"):
        causal = r["causal"] == "true"
        batch, heads, seq, dim = (int(r[c]) for c in ("batch", "heads", "seqlen", "head_dim"))
        fwd_flops = 4.0 * batch * seq * seq * heads * dim / (2 if causal else 1)
        total_s = 3.5 * fwd_flops / (float(r["fwd_bwd_tflops"]) * 1e12)
        fwd_rate = fwd_flops * (1 + 2.5 / FA2_BWD_OVER_FWD_RATE) / total_s
        times = {
            "flash_attn_fwd": fwd_flops / fwd_rate,
            "flash_attn_bwd": 2.5 * fwd_flops / (FA2_BWD_OVER_FWD_RATE * fwd_rate),
        }
        for name, seconds in times.items():
            aten = "aten._scaled_dot_product_flash_attention" + (
                "_backward" if name == "flash_attn_bwd" else ""
            )
            op = attention_op(name, batch=batch, heads_q=heads, heads_kv=heads, seq_q=seq, seq_kv=seq,
                              head_dim=dim, causal=causal, dtype="fp16")  # fmt: skip
            where = f"fa2:{'causal' if causal else 'noncausal'}:d{dim}:s{seq} ({r['read']})"
            rows.append(
                row(
                    op_fields(replace(op, aten=aten)),
                    seconds * 1e6,
                    where,
                    gpu_label,
                    date="2023-07-17",
                )
            )
    return rows


def with_twins(rows: list[dict]) -> list[dict]:
    """Each 16-bit row, then its copy under the other 16-bit dtype (equal A100 rates)."""
    out = []
    for r in rows:
        out.append(r)
        if r["dtype"] in SIXTEEN_BIT:
            twin = SIXTEEN_BIT[r["dtype"]]
            out.append(r | {"dtype": twin, "source": f"{r['source']} [as {twin}]"})
    return out


def as_table(rows: list[dict]):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.csv"
        write_rows(rows, path)
        return load_kernel_table(path)


def write_rows(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows({c: r.get(c, "") for c in COLUMNS} for r in rows)


def covers(table: KernelTable, op: OpRecord, max_log2_distance: float = 1.0) -> bool:
    """Whether the op's own group (not the class-level fallback of memory-bound ops) holds a row
    within the interpolation radius of `KernelTable.lookup`: a shape the published rows measure."""
    features = table.groups.get(group_key(op), (None,))[0]
    if features is None:
        return False
    return bool((abs(features - _features(op)).max(axis=1) <= max_log2_distance).any())


def transferred(
    rows: list[dict], src: GpuPreset, dst: GpuPreset, *, skip=lambda op: False
) -> list[dict]:
    out = []
    for r in rows:
        op = row_op(r)
        if skip(op):
            continue
        time_us = float(r["time_us"]) * transfer_factor(op, src, dst)
        source = r["source"] if r["source"].startswith("rule:") else f"{src.name}:{r['source']}"
        out.append(r | {"time_us": time_us, "source": f"rule:{src.name}->{dst.name}; {source}",
                        "gpu": f"{r['gpu']} (transferred)", "spread_us": ""})  # fmt: skip
    return out


def build_a100_80(h100_rows: list[dict]) -> list[dict]:
    label = "NVIDIA A100 SXM4 80GB (published)"
    measured = with_twins(
        vidur_rows(label) + llmcompass_rows(label) + mamf_rows(label) + fa2_rows(label)
    )
    table = as_table(measured)
    h100, a100 = gpu_preset("h100-sxm-80g"), gpu_preset("a100-sxm-80g")

    def skip(op: OpRecord) -> bool:
        return op.dtype == "fp8" or op.name in ATTENTION_OPS or covers(table, op)

    return measured + with_twins(transferred(h100_rows, h100, a100, skip=skip))


def vidur_pair_check() -> list[str]:
    """vidur's A100 time over the rule's transfer of vidur's H100 time, same model, tokens, TP
    and op (both fp16, kernel-only, one method): median and 10-90 % range per op."""
    published = read_csv(SOURCES / "vidur_mlp.csv")
    h100_time = {
        (r["model"], r["num_tokens"], r["tp"], r["op"]): float(r["median_ms"])
        for r in published
        if r["gpu"] == "h100"
    }
    a100, h100 = gpu_preset("a100-sxm-80g"), gpu_preset("h100-sxm-80g")
    ratios: dict[str, list[float]] = {}
    for r in published:
        key = (r["model"], r["num_tokens"], r["tp"], r["op"])
        if r["gpu"] != "a100" or key not in h100_time:
            continue
        if r["op"] in VIDUR_GEMMS:
            n, k, _ = vidur_gemm_shape(r)[r["op"]]
            op, name = gemm_op("mm", int(r["num_tokens"]), n, k, dtype="fp16"), "gemm"
        else:
            op, name = OpRecord(name="elementwise", dtype="fp16", bytes_read=1.0), r["op"]
        predicted = h100_time[key] * transfer_factor(op, h100, a100)
        ratios.setdefault(name, []).append(float(r["median_ms"]) / predicted)
    return [
        summary(f"vidur A100 / rule(vidur H100), {name}", values)
        for name, values in sorted(ratios.items())
    ]


def h200_pair_ratios() -> dict[str, list[float]]:
    """The H200's measured time over the rule's transfer of the H100's, for every op and shape
    both shared microbenchmarks measured (the same 171-row script on both GPUs), per op class
    ("op dtype aten")."""
    names = ("op", "dtype", "aten", *SHAPE_FIELDS)  # what names an op and its shape

    def microbench(gpu: str) -> dict[tuple, float]:
        return {
            tuple(r[c] for c in names): float(r["time_us"])
            for r in read_csv(KERNELS / f"{gpu}.csv")
            if r["source"].startswith("microbench-kernels.csv:")
        }

    h100, h200 = gpu_preset("h100-sxm-80g"), gpu_preset("h200-141g")
    h100_time, ratios = microbench("h100-sxm-80g"), {}
    for key, time_us in microbench("h200-141g").items():
        if key in h100_time:
            op = row_op(dict(zip(names, key, strict=True)))
            predicted = h100_time[key] * transfer_factor(op, h100, h200)
            ratios.setdefault(f"{op.name} {op.dtype} {op.aten}", []).append(time_us / predicted)
    return dict(sorted(ratios.items()))


def h200_pair_check() -> list[str]:
    """`h200_pair_ratios`: median and 10-90 % range per op class."""
    return [summary(f"H200 / rule(H100), {k}", v) for k, v in h200_pair_ratios().items()]


def summary(what: str, values: list[float]) -> str:
    q = statistics.quantiles(values, n=10) if len(values) > 1 else values * 9
    spread = statistics.median(abs(math.log(v)) for v in values)
    return f"  {what}: n={len(values)} median {statistics.median(values):.3f}, 10-90 % {q[0]:.2f}-{q[-1]:.2f}, median |log| {spread:.3f}"


def source_checks(a100_rows: list[dict], h100_rows: list[dict]) -> list[str]:
    """Each published A100 source against the rule's transfer of the H100 table (interpolated),
    and the MAMF H100 figure against the H100 table: how far the sources are from each other."""
    h100_table = as_table(h100_rows)
    a100, h100 = gpu_preset("a100-sxm-80g"), gpu_preset("h100-sxm-80g")
    ratios: dict[str, list[float]] = {}
    for r in a100_rows:
        if r["source"].startswith("rule:") or "[as" in r["source"] or r["op"] not in GEMM_OPS:
            continue
        op = replace(row_op(r), dtype="bf16")
        found = h100_table.lookup(op, h100.sm_count)
        if found is not None:
            predicted = found[0] * 1e6 * transfer_factor(op, h100, a100)
            ratios.setdefault(r["source"].split(":")[0], []).append(float(r["time_us"]) / predicted)
    lines = [
        summary(f"{name} GEMMs / rule(H100 table)", values)
        for name, values in sorted(ratios.items())
    ]
    same_chip = []
    for r in read_csv(SOURCES / "vidur_mlp.csv"):
        if r["gpu"] == "h100" and r["op"] in VIDUR_GEMMS:
            n, k, _ = vidur_gemm_shape(r)[r["op"]]
            found = h100_table.lookup(gemm_op("mm", int(r["num_tokens"]), n, k), h100.sm_count)
            if found is not None:
                same_chip.append(float(r["median_ms"]) * 1e-3 / found[0])
    lines.append(summary("vidur H100 GEMMs / H100 table (same chip)", same_chip))
    for r in read_csv(SOURCES / "mamf.csv"):
        if "H100" in r["accelerator"]:
            op = replace(gemm_op("mm", int(r["m"]), int(r["n"]), int(r["k"])), aten="aten.mm")
            found = h100_table.lookup(op, h100.sm_count)
            mamf_us = op.flops / (float(r["mamf_tflops"]) * 1e12) * 1e6
            lines.append(
                f"  mamf H100 {r['m']}x{r['n']}x{r['k']}: {mamf_us:.1f} us, H100 table ({found[1]}) {found[0] * 1e6:.1f} us"
            )
    return lines


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    h100_rows = read_csv(KERNELS / "h100-sxm-80g.csv")
    a100_80 = build_a100_80(h100_rows)
    a100_40 = transferred(a100_80, gpu_preset("a100-sxm-80g"), gpu_preset("a100-sxm-40g"))
    hbm2e = transferred(h100_rows, gpu_preset("h100-sxm-80g"), gpu_preset("h100-hbm2e-96g"))
    for name, rows in (
        ("a100-sxm-80g", a100_80),
        ("a100-sxm-40g", a100_40),
        ("h100-hbm2e-96g", hbm2e),
    ):
        write_rows(rows, KERNELS / f"{name}.csv")
        kinds: dict[str, int] = {}
        for r in rows:
            kind = r["source"].split(":")[0].split(";")[0]
            kinds[kind] = kinds.get(kind, 0) + 1
        print(f"wrote {len(rows)} rows to results/kernels/{name}.csv: {kinds}")
    print("the transfer rule on vidur's paired profiles (1 = the rule is exact):")
    print("\n".join(vidur_pair_check()))
    print("the transfer rule on the shared H100 and H200 microbenchmarks (1 = the rule is exact):")
    print("\n".join(h200_pair_check()))
    print("published A100 sources against the rule applied to the H100 table:")
    print("\n".join(source_checks(a100_80, h100_rows)))


if __name__ == "__main__":
    main()
