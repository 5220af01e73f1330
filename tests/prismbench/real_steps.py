"""Real CPU training steps recorded as the capture records them, for the real-vs-capture tests.

`op_classes` sums a trace's compute rows by (phase, aten op); `differing` lists the classes two
traces disagree on. `fused_rms_norm_on_cpu` gives `aten::_fused_rms_norm_backward` a CPU kernel
(the capture routes RMSNorm to CUDA's fused pair, `emulator.capture.fused_ops`, whose backward
has none), so the real run takes the capture's routing.

`C10dRecorder` records what a real (gloo) run communicates as the virtual world records it: the
capture's `VirtualProcessGroup` is called by the c10d ops' C++ kernels and writes a `CommEvent`;
a real run's c10d ops (`c10d::allreduce_`, `c10d::send`, `_c10d_functional::all_gather_into_tensor`,
...) pass through torch's dispatcher as well, where a TorchDispatchMode sees them before gloo runs
them. It writes the same CommEvent (kind, group, reduce op, dtype, full-buffer size, peer) by the
rules of `emulator.world.virtual_pg` and `emulator.world.fake_collectives`, so the two traces'
comm rows compare field by field.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import numpy as np
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _disable_current_modes,
    is_traceable_wrapper_subclass_type,
)

from emulator.capture.trace import COMM, COMPUTE, PHASES
from emulator.world.collectives import all_to_all_kind
from emulator.world.comm_events import CommEvent, Recorder, backend_fills


def _rms_norm_backward_cpu(grad_out, x, normalized_shape, rstd, weight, output_mask):
    """derivatives.yaml's `_fused_rms_norm_backward` in float32 (torch's CUDA kernel's math)."""
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    g, xf = grad_out.float(), x.float()
    x_hat = xf * rstd
    g_hat = g * weight.float() if weight is not None else g
    grad_x = rstd * (g_hat - x_hat * (g_hat * x_hat).mean(dim=dims, keepdim=True))
    grad_weight = None
    if weight is not None and output_mask[1]:
        outer = tuple(range(x.dim() - len(normalized_shape)))
        grad_weight = (g * x_hat).sum(dim=outer).to(weight.dtype)
    return grad_x.to(x.dtype), grad_weight


@contextlib.contextmanager
def fused_rms_norm_on_cpu():
    """`aten::_fused_rms_norm_backward` runnable on CPU inside the block."""
    library = torch.library.Library("aten", "IMPL")
    library.impl("_fused_rms_norm_backward", _rms_norm_backward_cpu, "CPU")
    try:
        yield
    finally:
        library._destroy()


def op_classes(trace) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(phase, aten op) -> (compute rows, FLOPs, bytes read + written)."""
    c = trace.columns
    rows = np.flatnonzero(c["kind"] == COMPUTE)
    aten = trace.text("aten")
    classes: Counter = Counter()
    for i in rows:
        key = (PHASES[c["phase"][i]] if c["phase"][i] >= 0 else "", aten[i])
        count, flops, moved = classes.get(key, (0, 0, 0))
        classes[key] = (
            count + 1,
            flops + int(c["flops"][i]),
            moved + int(c["read_bytes"][i] + c["write_bytes"][i]),
        )
    return dict(classes)


def differing(real, captured) -> dict:
    return {
        key: {"real": real.get(key), "captured": captured.get(key)}
        for key in sorted(set(real) | set(captured))
        if real.get(key) != captured.get(key)
    }


def comm_calls(trace) -> list[tuple]:
    """Every comm row in issue order: (phase, micro-batch, module, kind, group's global ranks,
    reduce op, dtype, bytes (comm_events' full-buffer convention), coalesced sizes, peer).

    The module is the last compute op's before the call: the row's own label is inherited from
    the recorder row just before it (emulator/capture/trace.py `build_trace`), which may be a
    free, and a real run frees a collective's buffers when gloo's work and Python's refcounts
    let go, so a free labelled by no module lands before the call in some runs and after it in
    others (the tp2-sp-dp2-regather case's output-layer all-gather in backward read
    'Llama.output', not 'Global', in a fresh-clone CI run at cb9335a and in 1 of 13 runs here)."""
    c = trace.columns
    groups = {name: tuple(int(r) for r in ranks) for name, ranks in trace.groups().items()}
    offsets, sizes = trace.ragged["sizes_offsets"], trace.ragged["sizes"]
    ops = np.flatnonzero(c["kind"] == COMPUTE)
    calls = []
    for i in np.flatnonzero(c["kind"] == COMM):
        phase = int(c["phase"][i])
        before = np.searchsorted(ops, i) - 1
        module = trace.strings[c["module"][ops[before]]] if before >= 0 else ""
        calls.append(
            (
                PHASES[phase] if phase >= 0 else "",
                int(c["micro_batch"][i]),
                module,
                trace.strings[c["name"][i]],
                groups[trace.strings[c["group"][i]]],
                trace.strings[c["reduce_op"][i]],
                trace.strings[c["dtype"][i]],
                int(c["size_bytes"][i]),
                tuple(int(s) for s in sizes[offsets[i] : offsets[i + 1]]),
                int(c["peer"][i]),
            )
        )
    return calls


@contextlib.contextmanager
def waits_are_backend_fills():
    """Ops gloo runs on this thread when a work is waited are the backend writing the
    collective's output, not the rank's compute: its reduce-scatter copies the reduced shard into
    the output tensor at `Work.wait()` (one `aten.copy_` of the shard, in whatever phase the wait
    falls: the optimizer's, for the data-parallel gradient buffer). The virtual backend runs its
    output fills inside `backend_fills()`, which the OpRecorder skips (on a GPU the collective's
    own kernel writes the output: emulator.world.virtual_pg); so do these. A blocking call's
    copies are unseen anyway: they run inside the c10d op, under the dispatch mode."""
    original = dist.Work.wait

    def wait(self, *args, **kwargs):
        with backend_fills():
            return original(self, *args, **kwargs)

    dist.Work.wait = wait
    try:
        yield
    finally:
        dist.Work.wait = original


# -- the real run's collectives -----------------------------------------------------------------


def _flat(values) -> list[torch.Tensor]:
    out = []
    for v in values:
        out.extend(_flat(v) if isinstance(v, (list, tuple)) else [v])
    return out


def _process_group(args) -> dist.ProcessGroup:
    names = [a for a in args if isinstance(a, str)]
    if names:  # the functional ops name their group last (after a reduce op's name)
        return dist.distributed_c10d._resolve_process_group(names[-1])
    for a in args:
        if isinstance(a, torch.ScriptObject):
            try:
                return dist.ProcessGroup.unbox(a)
            except RuntimeError:  # the reduce op, also a ScriptObject
                continue
    raise ValueError(f"no process group among {[type(a).__name__ for a in args]}")


def _reduce_op(args) -> str | None:
    names = [a for a in args if isinstance(a, str)]
    if len(names) == 2:  # a functional reduction: (reduce op, group)
        return names[0].upper()
    for a in args:  # c10d's ReduceOp: a ScriptObject whose op() is its RedOpType's value
        if isinstance(a, torch.ScriptObject) and "op" in a._method_names():
            return _RED_OP_NAMES[a.op()]
    return None


_RED_OP_NAMES = {int(v): name for name, v in dist.ReduceOp.RedOpType.__members__.items()}


# op name -> (kind, which tensors the full buffer is: "arg<i>" or "out", coalesced); the rules of
# emulator.world.virtual_pg (c10d) and emulator.world.fake_collectives (_c10d_functional)
_C10D = {
    "allreduce_": ("all_reduce", 0, False),
    "allreduce_coalesced_": ("all_reduce_coalesced", 0, True),
    "allgather_": ("all_gather", 0, False),
    "_allgather_base_": ("all_gather", 0, False),
    "allgather_into_tensor_coalesced_": ("all_gather_coalesced", 0, True),
    "reduce_scatter_": ("reduce_scatter", 1, False),
    "_reduce_scatter_base_": ("reduce_scatter", 1, False),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter_coalesced", 1, True),
    "broadcast_": ("broadcast", 0, False),
    "reduce_": ("reduce", 0, False),
    "send": ("send", 0, False),
    "recv_": ("recv", 0, False),
    "alltoall_base_": ("all_to_all", 1, False),
}
_FUNCTIONAL = {
    "all_reduce": ("all_reduce", 0, False),
    "all_reduce_": ("all_reduce", 0, False),
    "all_reduce_coalesced": ("all_reduce_coalesced", 0, True),
    "all_reduce_coalesced_": ("all_reduce_coalesced", 0, True),
    "all_gather_into_tensor": ("all_gather", "out", False),
    "all_gather_into_tensor_out": ("all_gather", "out", False),
    "all_gather_into_tensor_coalesced": ("all_gather_coalesced", "out", True),
    "reduce_scatter_tensor": ("reduce_scatter", 0, False),
    "reduce_scatter_tensor_out": ("reduce_scatter", 0, False),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_coalesced", 0, True),
    "all_to_all_single": ("all_to_all", 0, False),
    "broadcast": ("broadcast", 0, False),
    "broadcast_": ("broadcast", 0, False),
}
_NOT_CALLS = {"wait_tensor", "_wrap_tensor_autograd"}


class C10dRecorder(TorchDispatchMode):
    """Writes a CommEvent into `sink` for every collective and p2p call (module docstring).

    Enter it after the OpRecorder, with the recorder's sequence behind `sink`, so that the comm
    rows fall between the compute rows as the capture's do. A `c10d` op runs with every mode
    off, unseen by the recorder, as in the capture: `dist.send`, `dist.all_reduce`, ... call the
    virtual group's Python methods there, and no op reaches the dispatcher (a recorder that saw
    the op would resolve the phase there, and the next comm row would inherit that phase). The
    functional collectives reach the recorder both ways and are passed on to it."""

    def __init__(self, sink: Recorder):
        super().__init__()
        self.sink = sink
        self.unknown: list[str] = []  # c10d ops this recorder has no rule for

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(is_traceable_wrapper_subclass_type(t) for t in types):
            return NotImplemented  # DTensor unwraps; its local ops and collectives come back
        if func.namespace == "c10d":
            rule = _C10D.get(func._opname)
        elif func.namespace in ("_c10d_functional", "_c10d_functional_autograd"):
            rule = _FUNCTIONAL.get(func._opname)
            if rule is None and func._opname in _NOT_CALLS:
                return func(*args, **kwargs)
        else:
            return func(*args, **kwargs)
        # the call's seq is drawn before the op runs: the virtual backend records it while the
        # op runs, before the recorder records the output's allocation
        seq = self.sink.next_seq()
        if func.namespace == "c10d":
            with _disable_current_modes():
                out = func(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        if rule is None:
            self.unknown.append(str(func))
        else:
            self._record(seq, func._opname, rule, args, out)
        return out

    def _record(self, seq, name, rule, args, out) -> None:
        kind, where, coalesced = rule
        pg = _process_group(args)
        ranks = np.asarray(dist.get_process_group_ranks(pg), dtype=np.int64)
        tensors = _flat(_flat([out]) if where == "out" else [args[where]])
        if coalesced and len(tensors) == 1:
            kind, coalesced = kind.removesuffix("_coalesced"), False
        peer = None
        if kind in ("send", "recv"):
            peer = dist.get_global_rank(pg, args[2])
        if kind == "all_to_all":
            splits = args[4] if name == "alltoall_base_" else args[2]
            kind = all_to_all_kind(splits, pg.rank())
        sizes = tuple(int(t.numel()) for t in tensors)
        self.sink.add_group(pg.group_name, ranks)
        self.sink.events.append(
            CommEvent(
                seq=seq,
                kind=kind,
                group_id=pg.group_name,
                group_size=len(ranks),
                op=_reduce_op(args),
                dtype=str(tensors[0].dtype).removeprefix("torch.") if tensors else "none",
                numel=sum(sizes),
                nbytes=sum(sizes) * (tensors[0].element_size() if tensors else 0),
                async_op=False,
                peer=peer,
                sizes=sizes if coalesced else None,
            )
        )
