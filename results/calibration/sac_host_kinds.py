"""What op-level selective recompute (SAC) costs the host, per block and per aten call.

    python results/calibration/sac_host_kinds.py [--device cpu|cuda] [--measured JSON ...]
                                                 [--rounds N] [--out FILE]
                                                 (from the repository root; ~40 s, one core)

On a CPU (the default) the tensors are CPU tensors; with `--device cuda` they live on the GPU
and what is timed is the host side of a GPU run (no synchronisation inside a timed forward),
the figure the emulator's host model needs: step `sac_kinds` of `results/device_checks.sh`,
with `--measured` the same host's full-size figures from `sac_host_gpu.py` (its
`sac_host.json`, one per job), which then replace the H100 figures below in the comparison.
(Written as `sac_host_cpu.py`, which made `sac_host_cpu.md` at 29d6992.)

The H100 measured op-level SAC's host time per block for the 760M GPT (2 287 us, 38 policy
calls a block) and Llama 2 7B (4 157 us, 99 calls) with `prism-86a4f47` kernels, and one
figure per call misses each by ~18 % (README, "The same on an H100, and Llama 2 beside it").
This asks, on this machine's host, what the cost depends on. Tiny versions of the two
recorded jobs (`results/baselines/recorded/h100shared__*.toml`: same model code, policy and
recompute wrapping; 4 blocks, hidden 64, 32 tokens, bf16, real tensors, one CPU thread):
1. per block, the aten calls the SAC policy sees by kind (forward only), those it saves
   (MUST_SAVE) with their outputs, and the tensors autograd saves (saved-tensor hook calls);
2. the host time per block of the forward under none / full / SAC (median of interleaved
   rounds, (T_mode - T_none) / blocks; each forward followed by an untimed backward);
3. per kind, the host cost of one call: modules running N = 8 or 48 ops of that kind, with and
   without the jobs' SAC (`workloads.recompute._op_context`), a full checkpoint and an
   all-MUST_SAVE policy; cost per op = slope over N of the median forward time. From these:
   h (full - none, per autograd-saved tensor: the checkpoint's pack hook), s (all-save - SAC,
   per output of a view or pointwise op: a MUST_SAVE), the mode's own cost per call of each
   kind (SAC - full - its MUST_SAVE outputs x s) and the region's fixed cost;
4. a model of SAC's per-block cost, sum of calls x the kind's cost + h x autograd-saved
   tensors + s x MUST_SAVE outputs + fixed, against (2); the GPT/Llama ratio against the
   H100's, and the scale from this CPU to the H100's host each job implies.

Caveats: torch here is the CPU build installed (2.13 when written) against 2.11 on the H100;
CPU flash attention returns 2 outputs where cuDNN's returns more; RMSNorm decomposes into
~6 aten calls on CPU where CUDA runs `_fused_rms_norm`, so the "llama-proxy" rows (the ones
compared with the H100) run each RMSNorm as one `layer_norm` call: 99 calls a block, as the
H100 profiled; "llama" is the CPU's own program. The tensors are tiny but real (kernels run),
so the timings include a little compute; kinds the microbenchmarks lack are priced as the mean
pointwise op. A lead for a model, not a calibration: one CPU, two jobs.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "results"))
from shared_gpu import command_line, recorded_job, report  # noqa: E402

CASES = {"gpt": "gpt3-760m-s2048-mb4-sel", "llama": "llama2-7b-l4-s4096-mb1-sel"}
JOBS = ("gpt", "llama-proxy", "llama")
LAYERS = 4
# The H100's host, per block under selective recompute minus none (the policy calls per block,
# 38 and 99, are counted by each run): results/calibration/README.md, "The same on an H100, and
# Llama 2 beside it".
H100_US = {"gpt": 2287.0, "llama-proxy": 4157.0}
NLO, NHI = 8, 48  # ops per microbenchmark module


def tiny_job(fam: str, recompute: str):
    job = recorded_job(CASES[fam], "h100-sxm-80g")
    model = dataclasses.replace(
        job.model, layers=LAYERS, hidden=64, ffn_hidden=256, heads=4, kv_heads=4, vocab=128,
        max_seq_len=64,
    )  # fmt: skip
    batch = dataclasses.replace(job.batch, seq_len=32, micro_batch=1, global_batch=1)
    return dataclasses.replace(
        job, model=model, batch=batch, train=dataclasses.replace(job.train, recompute=recompute)
    )


def tiny_model(which: str, recompute: str, device: str):
    """The job's first pipeline part on `device` and its tokens; "llama-proxy": RMSNorm as one
    aten call (`layer_norm`, without bias), as CUDA's `_fused_rms_norm` is one."""
    import torch
    import torch.nn.functional as F

    from workloads.models.norms import RMSNorm
    from workloads.train import build_training

    job = tiny_job(which.split("-")[0], recompute)
    model = build_training(job, None, device=device).parts[0]
    if which == "llama-proxy":
        for m in model.modules():
            if isinstance(m, RMSNorm):
                m.forward = functools.partial(
                    lambda m, x: F.layer_norm(x, m.normalized_shape, m.weight, None, m.eps), m
                )
    return model, torch.zeros((1, job.batch.seq_len), dtype=torch.long, device=device)


def output_count(func) -> int:
    """The outputs SAC stores when the policy saves `func`'s result: the entries of the tuple
    it returns (a tensor list or a single tensor is one), read from the op's schema. Not from
    the output itself: torch 2.13's `SelectiveCheckpointContext.op_output` holds it, torch
    2.11's context has no such field (its policy runs before the op)."""
    return max(1, len(func._schema.returns))


class PolicyCounter:
    """Counts, while installed, the forward calls the SAC policy sees by op, the MUST_SAVE
    ones and their outputs (wraps `workloads.recompute._op_policy`)."""

    def __enter__(self):
        import workloads.recompute as R

        self.calls, self.saved, self.saved_outputs = (collections.Counter() for _ in range(3))
        self.orig = orig = R._op_policy

        def wrapped(granularity="op"):
            policy = orig(granularity)

            def counting(ctx, func, *args, **kwargs):
                decision = policy(ctx, func, *args, **kwargs)
                if not ctx.is_recompute:
                    self.calls[str(func)] += 1
                    if decision == R.CheckpointPolicy.MUST_SAVE:
                        self.saved[str(func)] += 1
                        self.saved_outputs[str(func)] += output_count(func)
                return decision

            return counting

        R._op_policy = wrapped
        return self

    def __exit__(self, *exc):
        import workloads.recompute as R

        R._op_policy = self.orig


def count_saved(model, tokens, regions) -> int:
    """Tensors autograd saves inside `regions` (modules) in one forward, without recompute."""
    import torch

    inside, packs = [False], [0]
    for r in regions:
        r.register_forward_pre_hook(lambda *a: inside.__setitem__(0, True))
        r.register_forward_hook(lambda *a: inside.__setitem__(0, False))

    def pack(t):
        packs[0] += inside[0]
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(tokens).float().sum().backward()
    return packs[0]


def interleaved_medians(runs: dict, rounds: int, reps: int, backward: bool, device: str) -> dict:
    """Median host microseconds of `fn(x)` per key of `runs` ({key: (fn, x)}), run in
    interleaved rounds so that drift hits every key alike. On CUDA the GPU is drained after
    each (untimed) backward, so that no timed launch waits for a full queue."""
    import torch

    drain = torch.cuda.synchronize if device == "cuda" else lambda: None
    samples = collections.defaultdict(list)
    for _ in range(rounds + 1):  # the first round warms up
        for key, (fn, x) in runs.items():
            for _ in range(reps):
                t0 = time.perf_counter()
                y = fn(x)
                samples[key].append(time.perf_counter() - t0)
                if backward:
                    y.float().sum().backward()
                    for p in fn.parameters():
                        p.grad = None
                del y
                drain()
    return {k: statistics.median(v[reps:]) * 1e6 for k, v in samples.items()}


def block_figures(rounds: int, device: str) -> dict:
    """Per job: policy calls, MUST_SAVE outputs and autograd-saved tensors per block, and the
    host us per block of none / full / selective."""
    out = {}
    for which in JOBS:
        model, tokens = tiny_model(which, "selective", device)
        with PolicyCounter() as c:
            model(tokens).float().sum().backward()
        model, tokens = tiny_model(which, "none", device)
        saved = count_saved(model, tokens, model.layers.values())
        runs = {
            mode: (tiny_model(which, mode, device)[0], tokens)
            for mode in ("none", "full", "selective")
        }
        med = interleaved_medians(runs, rounds, reps=15, backward=True, device=device)
        out[which] = {
            "calls": {k: v / LAYERS for k, v in c.calls.items()},
            "saved": {k: v / LAYERS for k, v in c.saved.items()},
            "saved_outputs": sum(c.saved_outputs.values()) / LAYERS,
            "autograd_saved": saved / LAYERS,
            "us": {m: (med[m] - med["none"]) / LAYERS for m in med},
        }
        print(f"{which}: {out[which]['us']}", file=sys.stderr, flush=True)
    return out


def kinds():
    """Microbenchmark kinds: (input shape, op applied N times in a chain, parameters)."""
    import torch
    import torch.nn.functional as F

    x3 = (1, 32, 64)
    return {
        "view": (x3, lambda m, y, i: y.view(32, 64) if i % 2 == 0 else y.view(x3), []),
        "t": ((32, 64), lambda m, y, i: y.t(), []),
        "transpose": (x3, lambda m, y, i: y.transpose(0, 1), []),
        "unsqueeze": (x3, lambda m, y, i: y.unsqueeze(0), []),
        "select": ((1,) * NHI + (32, 64), lambda m, y, i: y[0], []),
        "_unsafe_view": ((32, 64), lambda m, y, i: torch.ops.aten._unsafe_view(y, (32, 64)), []),
        "add": (x3, lambda m, y, i: y + m.a, [("a", x3)]),
        "mul": (x3, lambda m, y, i: y * m.a, [("a", x3)]),
        "neg": (x3, lambda m, y, i: -y, []),
        "cos": (x3, lambda m, y, i: y.cos(), []),
        "gelu": (x3, lambda m, y, i: F.gelu(y, approximate="tanh"), []),
        "_to_copy": (
            x3,
            lambda m, y, i: y.float() if y.dtype == torch.bfloat16 else y.bfloat16(),
            [],
        ),
        "mean": (x3, lambda m, y, i: y.mean(-1, keepdim=True), []),
        "mm": ((32, 64), lambda m, y, i: y @ m.w, [("w", (64, 64))]),
        "addmm": (
            (32, 64),
            lambda m, y, i: torch.addmm(m.b, y, m.w),
            [("w", (64, 64)), ("b", (64,))],
        ),
        "native_layer_norm": (
            x3,
            lambda m, y, i: F.layer_norm(y, (64,), m.g, m.b),
            [("g", (64,)), ("b", (64,))],
        ),
        "sdpa": (
            (1, 4, 32, 16),
            lambda m, y, i: F.scaled_dot_product_attention(y, y, y, is_causal=True),
            [],
        ),
        "stack": (x3, lambda m, y, i: torch.stack((y, y))[0], []),  # a stack and a select
        "arange": (
            x3,
            lambda m, y, i: (torch.arange(0, 16, 2, dtype=torch.float32, device=y.device), y)[1],
            [],
        ),
    }


def kind_module(kind: str, n: int, mode: str, granularity: str, device: str):
    import torch
    from torch import nn
    from torch.distributed._composable import checkpoint
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    import workloads.recompute as R

    shape, op, params = kinds()[kind]

    class Chain(nn.Module):
        def forward(self, x):
            for i in range(n):
                x = op(self, x, i)
            return x * 1.0 if kind == "arange" else x  # a grad-requiring output

    m = Chain()
    for name, s in params:
        setattr(m, name, nn.Parameter(torch.randn(*s, dtype=torch.bfloat16, device=device) * 0.1))
    options = {"early_stop": True, "preserve_rng_state": False}
    if mode == "sac":
        checkpoint(m, context_fn=functools.partial(R._op_context, granularity), **options)
    elif mode == "allsave":

        def allsave():
            save = create_selective_checkpoint_contexts(lambda *a, **k: CheckpointPolicy.MUST_SAVE)
            return tuple(R._ignoring_bookkeeping(c) for c in save)

        checkpoint(m, context_fn=allsave, **options)
    elif mode == "full":
        checkpoint(m, **options)
    return m, torch.randn(*shape, dtype=torch.bfloat16, device=device, requires_grad=True)


def kind_figures(rounds: int, granularity: str, device: str) -> dict:
    """Per kind and per op: host us added by each mode over none, the SAC region's fixed cost,
    and the MUST_SAVE outputs and autograd-saved tensors the policy and autograd see."""
    out = {}
    for kind in kinds():
        per_n = {}
        for n in (NLO, NHI):
            m, x = kind_module(kind, n, "sac", granularity, device)
            with PolicyCounter() as c:
                m(x).float().sum().backward()
            m, x = kind_module(kind, n, "none", granularity, device)
            per_n[n] = (sum(c.saved_outputs.values()), count_saved(m, x, [m]))
        runs = {
            (mode, n): kind_module(kind, n, mode, granularity, device)
            for mode in ("none", "sac", "allsave", "full") for n in (NLO, NHI)
        }  # fmt: skip
        med = interleaved_medians(runs, rounds, reps=20, backward=False, device=device)
        slope = {mode: (med[mode, NHI] - med[mode, NLO]) / (NHI - NLO) for mode, _ in runs}
        fixed = {mode: med[mode, NLO] - NLO * slope[mode] for mode, _ in runs}
        d = NHI - NLO
        out[kind] = {
            **{mode: slope[mode] - slope["none"] for mode in ("sac", "allsave", "full")},
            "fixed": fixed["sac"] - fixed["none"],
            "saved_outputs": (per_n[NHI][0] - per_n[NLO][0]) / d,
            "autograd_saved": (per_n[NHI][1] - per_n[NLO][1]) / d,
        }
    return out


def model_costs(kf: dict) -> tuple[dict, float, float, float, float]:
    """Per-kind mode cost per call, h, s, the region's fixed cost, the pointwise default."""
    one_output = ("view", "t", "transpose", "add", "neg", "_to_copy")
    s = statistics.mean(kf[k]["allsave"] - kf[k]["sac"] for k in one_output)
    h = statistics.mean(kf[k]["full"] / kf[k]["autograd_saved"] for k in kf if kf[k]["autograd_saved"])  # fmt: skip
    per_call = {k: r["sac"] - r["full"] - r["saved_outputs"] * s for k, r in kf.items()}
    per_call["stack"] -= per_call["select"]  # its module runs a select after each stack
    fixed = statistics.mean(kf[k]["fixed"] for k in (*one_output[:-1], "native_layer_norm"))
    pointwise = statistics.mean(per_call[k] for k in ("neg", "cos", "add", "gelu", "_to_copy"))
    return per_call, h, s, fixed, pointwise


def kind_of(op: str) -> str:
    """A policy call's microbenchmark kind: its aten op, any SDPA backend as `sdpa` (the CPU's
    flash, CUDA's flash, cuDNN or memory-efficient kernel: whichever the device ran)."""
    name = op.split(".")[1]
    return "sdpa" if name.startswith("_scaled_dot_product_") else name


def geo_fit(values: list[float]) -> tuple[float, list[float]]:
    """One factor for several: their geometric mean, and each one's miss, factor / value - 1."""
    g = math.exp(statistics.mean(math.log(v) for v in values))
    return g, [g / v - 1 for v in values]


def measured_per_block(ap: argparse.ArgumentParser, paths: list[Path]) -> tuple[dict, str]:
    """Selective minus none, host us per block, from `sac_host_gpu.py`'s JSON for each job
    (keyed as the tiny jobs compared with it: "gpt", "llama-proxy"), and the GPU they ran on."""
    key_of = {CASES["gpt"]: "gpt", CASES["llama"]: "llama-proxy"}
    out, gpus = {}, set()
    for path in paths:
        try:
            figures = json.loads(path.read_text())
            case, modes = figures["case"], figures["modes"]
            gpus.add(figures["gpu"])
            per_block = modes["selective"]["per_block_us"] - modes["none"]["per_block_us"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"--measured {path}: not a sac_host_gpu.py sac_host.json ({e!r})")
        if case not in key_of:
            ap.error(f"--measured {path}: case {case!r} is none of {sorted(key_of)}")
        out[key_of[case]] = per_block
    if len(out) != 2:
        ap.error(f"--measured: one file for each of {sorted(key_of)}, got {len(out)} job(s)")
    if len(gpus) != 1:
        ap.error(f"--measured: both files from one GPU's host, got {sorted(gpus)}")
    return out, gpus.pop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where the tensors live (cuda: the host side of a GPU run)")  # fmt: skip
    ap.add_argument(
        "--measured", type=Path, nargs=2, metavar="JSON",
        help="sac_host_gpu.py's sac_host.json for both jobs on this host: compare with them, "
        "not with the H100's figures",
    )  # fmt: skip
    ap.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds")
    ap.add_argument("--out", type=Path, help="also write the markdown report here")
    args = ap.parse_args(argv)
    reference, reference_label = H100_US, "H100 (README)"
    if args.measured:
        reference, gpu = measured_per_block(ap, args.measured)
        reference_label = f"{gpu}, sac_host_gpu.py"

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device on this machine")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    started = time.perf_counter()
    granularity = tiny_job("gpt", "selective").kernels.selective_recompute
    blocks = block_figures(args.rounds, args.device)
    kf = kind_figures(args.rounds, granularity, args.device)
    per_call, h, s, fixed, pointwise = model_costs(kf)

    fmt = lambda v: f"{v:.2f}".rstrip("0").rstrip(".")  # noqa: E731
    ops = sorted({op for b in blocks.values() for op in b["calls"]}, key=lambda op: -blocks["llama"]["calls"].get(op, 0) - blocks["gpt"]["calls"].get(op, 0))  # fmt: skip
    where = (
        f"{torch.cuda.get_device_name()} (CUDA tensors; host time, no synchronisation)"
        if args.device == "cuda" else "CPU tensors, one thread"
    )  # fmt: skip
    lines = [
        f"torch {torch.__version__}, {where}, {LAYERS} blocks, hidden 64, 32 tokens; "
        f"policy `{granularity}`; {args.rounds} interleaved rounds.",
        "",
        "Aten calls the SAC policy sees per block (forward), by op (MUST_SAVE in brackets):",
        "",
        "| op | " + " | ".join(JOBS) + " |",
        "|---|" + "--:|" * len(JOBS),
    ]
    for op in ops:
        cells = [
            fmt(b["calls"].get(op, 0)) + (f" ({fmt(b['saved'][op])})" if op in b["saved"] else "")
            for b in blocks.values()
        ]  # fmt: skip
        lines.append(f"| `{op}` | " + " | ".join(cells) + " |")
    for label, get in (
        ("**calls**", lambda b: sum(b["calls"].values())),
        ("MUST_SAVE outputs", lambda b: b["saved_outputs"]),
        ("autograd-saved tensors", lambda b: b["autograd_saved"]),
    ):
        lines.append(f"| {label} | " + " | ".join(fmt(get(b)) for b in blocks.values()) + " |")

    lines += [
        "",
        "Host us per block added over none (forward), and per policy call:",
        "",
        "| job | full | selective | selective / call |",
        "|---|--:|--:|--:|",
    ]
    for which, b in blocks.items():
        n = sum(b["calls"].values())
        lines.append(f"| {which} | {b['us']['full']:.0f} | {b['us']['selective']:.0f} | {b['us']['selective'] / n:.2f} |")  # fmt: skip

    lines += [
        "",
        f"Per kind, host us per op added over none (slope over {NLO} and {NHI} ops), and the "
        "mode's own cost per call (SAC - full - MUST_SAVE outputs x s):",
        "",
        "| kind | SAC | all-save | full | autograd-saved / op | MUST_SAVE outputs / op "
        "| mode's cost / call |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for k, r in sorted(kf.items(), key=lambda kr: per_call[kr[0]]):
        lines.append(
            f"| {k} | {r['sac']:.2f} | {r['allsave']:.2f} | {r['full']:.2f} "
            f"| {fmt(r['autograd_saved'])} | {fmt(r['saved_outputs'])} | {per_call[k]:.2f} |"
        )
    lines += [
        "",
        f"h = {h:.2f} us per autograd-saved tensor (full / saved, kinds that save); "
        f"s = {s:.2f} us per MUST_SAVE output (all-save - SAC, one-output kinds); "
        f"SAC region's fixed cost {fixed:.1f} us; kinds not measured priced at the pointwise "
        f"mean, {pointwise:.2f} us.",
        "",
        "The model per block against the measured selective - none:",
        "",
        "| job | calls x kind | h x saved | s x MUST_SAVE | fixed | model | measured "
        "| measured / model |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    pred = {}
    for which, b in blocks.items():
        parts = (
            sum(n * per_call.get(kind_of(op), pointwise) for op, n in b["calls"].items()),
            h * b["autograd_saved"],
            s * b["saved_outputs"],
            fixed,
        )
        pred[which] = sum(parts)
        meas = b["us"]["selective"]
        lines.append(
            f"| {which} | " + " | ".join(f"{p:.0f}" for p in parts)
            + f" | {pred[which]:.0f} | {meas:.0f} | {meas / pred[which]:.3f} |"
        )  # fmt: skip

    g, lp = "gpt", "llama-proxy"
    meas = {j: blocks[j]["us"]["selective"] for j in (g, lp)}
    calls = {j: sum(blocks[j]["calls"].values()) for j in (g, lp)}
    factor, f_miss = geo_fit([meas[j] / pred[j] for j in (g, lp)])
    scale, s_miss = geo_fit([reference[j] / pred[j] for j in (g, lp)])
    c_here, c_miss = geo_fit([meas[j] / calls[j] for j in (g, lp)])
    # the calls a block makes are the program's, counted here (38 and 99, as the H100 profiled)
    c_ref, cr_miss = geo_fit([reference[j] / calls[j] for j in (g, lp)])
    pct = lambda xs: " / ".join(f"{100 * x:+.1f} %" for x in xs)  # noqa: E731
    lines += [
        "",
        "GPT / Llama (proxy) and one factor for both jobs (the geometric mean of the two; the "
        "misses are GPT / Llama, fitted / needed - 1):",
        "",
        f"| | tiny, measured | tiny, model | full size, {reference_label} |",
        "|---|--:|--:|--:|",
        f"| per block | {meas[g] / meas[lp]:.3f} | {pred[g] / pred[lp]:.3f} | {reference[g] / reference[lp]:.3f} |",  # fmt: skip
        f"| per call | {(meas[g] / calls[g]) / (meas[lp] / calls[lp]):.3f} "
        f"| {(pred[g] / calls[g]) / (pred[lp] / calls[lp]):.3f} "
        f"| {(reference[g] / calls[g]) / (reference[lp] / calls[lp]):.3f} |",
        "",
        f"- In-block factor, measured / model: {factor:.2f} (misses {pct(f_miss)}).",
        f"- Full size ({reference_label}, us per block) against the tiny blocks measured: "
        f"GPT {reference[g]:.0f} / {meas[g]:.0f}, Llama {reference[lp]:.0f} / {meas[lp]:.0f}.",
        f"- Scale from the model to full size ({reference_label}): GPT "
        f"{reference[g] / pred[g]:.2f}x, Llama {reference[lp] / pred[lp]:.2f}x; one scale "
        f"{scale:.2f}x misses {pct(s_miss)}.",
        f"- One cost per call: tiny {c_here:.2f} us misses {pct(c_miss)}; full size "
        f"{c_ref:.1f} us misses {pct(cr_miss)}.",
        "",
        f"Run time {time.perf_counter() - started:.0f} s.",
    ]
    report(command_line("results/calibration/sac_host_kinds.py", argv), lines, args.out)


if __name__ == "__main__":
    main()
