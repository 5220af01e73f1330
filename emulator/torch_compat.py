"""Every torch internal the emulator leans on, in one place: what capture patches, what it reads.

`SEAMS` lists each torch attribute that capture replaces for the length of a capture
(`patched`), and each private member it calls or reads, with the torch source it mirrors.
Everything else in the emulator reaches those members through this module, so a torch
upgrade that moves one fails `tests/emulator/test_torch_compat.py` (which checks that every
seam exists, with the parameters we call or wrap it with) in one place, naming the seam.
Checked against torch 2.13 and 2.11. Not listed: the extension points torch documents for
code like ours, imported where they are used from their underscored modules
(`FakeTensorMode`, `FakeTensor` and `is_fake`; `TorchDispatchMode`; the `ProcessGroup` a
virtual process group subclasses and the collectives' option classes it is called with).
"""

from __future__ import annotations

import contextlib
import importlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch._guards import active_fake_mode  # noqa: F401  (re-exported: the seams' one name)
from torch._subclasses.fake_tensor import unset_fake_temporarily  # noqa: F401  (re-exported)
from torch.distributed._tools.mod_tracker import ModTracker
from torch.utils._pytree import tree_flatten


@dataclass(frozen=True)
class Seam:
    path: str  # dotted: module, then attributes
    parameters: tuple[str, ...] | None  # leading parameters we wrap or call it with (None:
    # not checked: an attribute, or a builtin without a signature)
    mirrors: str  # the torch source, and why we touch it
    since: str = ""  # the torch release that brought it; before, capture needs no patch there


_PIPE = "torch.distributed.pipelining"
# the pipelining classes capture patches (emulator.capture.rank, emulator.capture.chunk_reuse)
PIPELINE_STAGE = f"{_PIPE}.stage._PipelineStageBase"
PIPELINE_SCHEDULES = f"{_PIPE}.schedules"
SEAMS = (
    # patched for the length of a capture
    Seam(
        f"{PIPELINE_SCHEDULES}._PipelineSchedule._warmup_p2p",
        ("self", "stages", "has_backward"),
        "pipelining/schedules.py: the shape-inference vote, replaced by its STATIC outcome",
        since="2.13",  # torch 2.11 stages with example args infer no shapes at run time
    ),
    Seam(f"{_PIPE}.stage.InferenceMode.STATIC", None, "pipelining/stage.py", since="2.13"),
    Seam(
        "torch.distributed.device_mesh.DeviceMesh.__init__",
        ("self", "device_type"),
        "device_mesh.py: rank maps built from real tensors, outside fake mode",
    ),
    Seam("torch.distributed.device_mesh.DeviceMesh.mesh", None, "device_mesh.py: property"),
    Seam(
        "torch.distributed.tensor._sharding_prop.ShardingPropagator."
        "_propagate_tensor_meta_non_cached",
        ("self", "op_schema"),
        "tensor/_sharding_prop.py: DTensor's fake shape propagation, run unrecorded",
    ),
    Seam(
        f"{PIPELINE_STAGE}.forward_one_chunk",
        ("self", "fwd_chunk_id"),
        "pipelining/stage.py: one pipeline action per micro-batch (micro-batch markers)",
    ),
    Seam(f"{PIPELINE_STAGE}.backward_one_chunk", ("self", "bwd_chunk_id"), "pipelining/stage.py"),
    Seam(
        f"{PIPELINE_STAGE}.backward_weight_one_chunk",
        ("self", "bwd_chunk_id"),
        "pipelining/stage.py",
    ),
    Seam(
        f"{PIPELINE_STAGE}.forward_maybe_with_nosync",
        ("self",),
        "pipelining/stage.py: where chunk reuse stands in for a stage's forward",
    ),
    Seam(
        f"{PIPELINE_STAGE}.backward_maybe_with_nosync",
        ("self", "backward_type", "bwd_kwargs"),
        "pipelining/stage.py: where chunk reuse stands in for a stage's backward",
    ),
    Seam(f"{PIPELINE_SCHEDULES}.PipelineScheduleSingle.step", ("self",), "pipelining/schedules.py"),
    Seam(f"{PIPELINE_SCHEDULES}.PipelineScheduleMulti.step", ("self",), "pipelining/schedules.py"),
    Seam("torch.cpu.Stream.record_event", None, "cpu/__init__.py: stream events, tracked"),
    Seam("torch.cpu.Stream.wait_event", None, "cpu/__init__.py"),
    Seam("torch.cpu.Stream.wait_stream", None, "cpu/__init__.py"),
    Seam("torch.cpu.Event.record", None, "cpu/__init__.py"),
    Seam(
        "torch.nn.functional.rms_norm",
        ("input", "normalized_shape", "weight", "eps"),
        "nn/functional.py: routed to the fused op pair a CUDA build runs",
    ),
    Seam(
        "torch.UntypedStorage.resize_",
        None,
        "storage.py: FSDP2 frees and refills unsharded parameters by resizing storage",
    ),
    # private members read or called
    Seam("torch.ops.aten._fused_rms_norm", None, "native_functions.yaml: CUDA's fused RMSNorm"),
    Seam("torch.ops.aten._fused_rms_norm_backward", None, "derivatives.yaml: its backward"),
    Seam("torch._C._AutoDispatchBelowAutograd", None, "autograd: run an op below autograd"),
    Seam("torch._C._current_graph_task_id", None, "autograd engine: -1 outside backward"),
    Seam(
        "torch._ops.OpOverload.decompose",
        ("self",),
        "_ops.py: run an op's CompositeImplicitAutograd kernel (as FakeTensorMode does)",
    ),
    Seam(
        "torch._ops.OpOverload.has_kernel_for_dispatch_key",
        ("self", "k"),
        "_ops.py: whether CompositeImplicitAutograd implements an op",
    ),
    Seam(
        "torch.utils._python_dispatch.TorchDispatchMode.__enter__",
        ("self",),
        "utils/_python_dispatch.py: push a mode (without a subclass's own __enter__)",
    ),
    Seam("torch._guards.active_fake_mode", (), "_guards.py: the fake mode in force"),
    Seam("torch._subclasses.fake_tensor.unset_fake_temporarily", (), "fake_tensor.py"),
    Seam(
        "torch._subclasses.fake_impls.op_implementations_checks",
        None,
        "fake_impls.py register_op_impl: (check, impl) pairs fake mode consults",
    ),
    Seam(
        "torch.distributed.distributed_c10d._resolve_process_group",
        None,
        "distributed_c10d.py: a functional collective's group name -> process group",
    ),
    Seam("torch.distributed.distributed_c10d._get_default_group", (), "distributed_c10d.py"),
    Seam(
        "torch._C._clear_DTensor_sharding_propagator_cache",
        None,
        "DTensor's C++ dispatch fast-path cache (keyed by mesh: stale across ranks)",
    ),
    Seam(
        "torch.distributed.tensor.DTensor._op_dispatcher",
        None,
        "tensor/_dispatch.py: sharding_propagator with its lru caches",
    ),
    Seam(
        "torch.distributed.tensor._redistribute._gen_transform_infos",
        None,
        "tensor/_redistribute.py: lru-cached redistribution plans",
    ),
    Seam(
        "torch.distributed.tensor._collective_utils.MeshTopoInfo.build_from_mesh",
        None,
        "tensor/_collective_utils.py: lru-cached mesh topology",
    ),
    Seam(
        "torch.distributed._tools.mod_tracker.ModTracker._fw_pre_hook",
        ("self", "mod", "input"),
        "_tools/mod_tracker.py: overridden by LeafSafeModTracker",
    ),
    Seam(
        "torch.distributed.fsdp.FSDPModule._get_fsdp_state",
        ("self",),
        "fsdp/_fully_shard/_fully_shard.py: the state whose per-backward flags (set_is_last_"
        "backward, set_requires_gradient_sync, ...) micro-batch reuse compares",
    ),
    Seam(
        "torch.Tensor._post_accumulate_grad_hooks",
        None,
        "_tensor.py register_post_accumulate_grad_hook: the hooks dict, in order",
    ),
)
_PATCHABLE = frozenset(seam.path for seam in SEAMS)


def present(seam: Seam) -> bool:
    """Whether this torch has the seam (False only for one newer than this torch)."""
    return not seam.since or torch.__version__ >= seam.since


def seam(path: str) -> Seam:
    return next(s for s in SEAMS if s.path == path)


def resolve(path: str):
    """The object at a dotted path: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(f"torch seam {path!r}: no importable module in the path")


@contextlib.contextmanager
def patched(path: str, make_replacement: Callable) -> Iterator[object]:
    """Replace the seam at `path` by `make_replacement(original)` inside the block.

    Class attributes are read from the class __dict__ (a property stays a property)."""
    if path not in _PATCHABLE:
        raise ValueError(f"{path!r} is not a declared torch seam (emulator.torch_compat.SEAMS)")
    owner_path, name = path.rsplit(".", 1)
    owner = resolve(owner_path)
    inherited = isinstance(owner, type) and name not in owner.__dict__
    original = (
        owner.__dict__[name] if isinstance(owner, type) and not inherited else getattr(owner, name)
    )
    setattr(owner, name, make_replacement(original))
    try:
        yield original
    finally:
        if inherited:
            delattr(owner, name)  # the base class's again
        else:
            setattr(owner, name, original)


# ---- private members, read or called ------------------------------------------------------


def below_autograd():
    """Context that dispatches below the autograd key (an op's own kernel, no graph)."""
    return torch._C._AutoDispatchBelowAutograd()


def is_composite_implicit(op: torch._ops.OpOverload) -> bool:
    """Whether CompositeImplicitAutograd implements `op` (it decomposes at the autograd key, so
    a dispatch mode sees it whole only when called below autograd)."""
    return op.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd)


@contextlib.contextmanager
def mode_reentered(mode) -> Iterator[None]:
    """Push `mode` again from inside its own __torch_dispatch__ (which runs with it popped), so
    the ops dispatched meanwhile come back to it, as FakeTensorMode's `with self:` does to
    decompose an op; the base class's enter and exit, not the mode's own, whose setup runs
    once per capture."""
    base = torch.utils._python_dispatch.TorchDispatchMode
    base.__enter__(mode)
    try:
        yield
    finally:
        base.__exit__(mode, None, None, None)


def in_backward() -> bool:
    """True while the autograd engine runs a backward graph task on this thread."""
    return torch._C._current_graph_task_id() != -1


def post_accumulate_grad_hooks(param: torch.Tensor) -> list[Callable]:
    """The post-accumulate-grad hooks of a parameter, in registration order."""
    return list((param._post_accumulate_grad_hooks or {}).values())


# what FSDP2 reads at every backward to decide how it ends (fsdp/_fully_shard/_fully_shard.py
# set_is_last_backward, set_requires_gradient_sync, set_requires_all_reduce,
# set_reshard_after_backward, set_unshard_in_backward)
_FSDP_GROUP_FLAGS = (
    "reduce_grads",
    "all_reduce_grads",
    "reshard_after_backward",
    "unshard_in_backward",
)


def fsdp_backward_flags(module: torch.nn.Module) -> tuple:
    """The per-backward flags of every FSDP2 module under `module` (empty without FSDP2): two
    backwards with equal flags reduce and reshard alike."""
    from torch.distributed.fsdp import FSDPModule

    flags = []
    for name, sub in module.named_modules():
        if not isinstance(sub, FSDPModule):
            continue
        state = sub._get_fsdp_state()
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:  # torch 2.11: one group or None
            groups = [g for g in [getattr(state, "_fsdp_param_group", None)] if g is not None]
        flags.append(
            (
                name,
                state._state_ctx.is_last_backward,
                tuple(tuple(getattr(g, f, None) for f in _FSDP_GROUP_FLAGS) for g in groups),
            )
        )
    return tuple(flags)


def resolve_process_group(name: str):
    return torch.distributed.distributed_c10d._resolve_process_group(name)


def default_process_group():
    return torch.distributed.distributed_c10d._get_default_group()


def clear_dtensor_caches() -> None:
    """Forget DTensor's sharding and redistribution plans: they are keyed by DeviceMesh, and a
    new rank's mesh compares equal to the old one (DeviceMesh.__eq__ ignores the rank)."""
    from torch.distributed.tensor import DTensor, _collective_utils, _redistribute

    torch._C._clear_DTensor_sharding_propagator_cache()
    propagator = DTensor._op_dispatcher.sharding_propagator
    propagator.propagate_op_sharding.cache_clear()
    propagator._propagate_tensor_meta_cached.cache_clear()
    _redistribute._gen_transform_infos.cache_clear()
    _collective_utils.MeshTopoInfo.build_from_mesh.cache_clear()


def add_fake_op_impl(check: Callable, impl: Callable) -> tuple[Callable, Callable]:
    """Make fake mode run `impl` for the ops `check` accepts (as fake_impls.register_op_impl
    does); returns the entry for `remove_fake_op_impl`."""
    from torch._subclasses import fake_impls

    entry = (check, impl)
    fake_impls.op_implementations_checks.append(entry)
    return entry


def remove_fake_op_impl(entry: tuple[Callable, Callable]) -> None:
    from torch._subclasses import fake_impls

    if entry in fake_impls.op_implementations_checks:
        fake_impls.op_implementations_checks.remove(entry)


# ModTracker's name for the code outside every module (its `parents` always holds it): a
# trace row's module when no module was running
TOP_LEVEL_MODULE = "Global"


class LeafSafeModTracker(ModTracker):
    """torch's ModTracker, except that backward tracking hooks only non-leaf module inputs.

    ModTracker registers a multi-grad hook on every module input that requires grad; on a
    leaf (a pipeline stage's received activation) that breaks `autograd.grad(inputs=...)`,
    which zero-bubble schedules call ("A leaf node was passed to _will_engine_execute_node").
    A module whose inputs are all leaves is closed at the end of backward instead, as
    ModTracker does for modules without grad-requiring inputs. Mirrors ModTracker._fw_pre_hook
    (torch/distributed/_tools/mod_tracker.py) but for that condition.
    """

    @staticmethod
    def _register_pop_once(tensors, pop) -> None:
        """`pop` once every input's gradient is computed, then the hook is dropped.

        A multi-grad hook in its "all" mode keeps the inputs' grad_fns in its closure and is
        registered on those same nodes: a cycle through C++ that Python's gc cannot collect,
        so every graph it is set on stays alive after backward with its leaves (a pipeline
        stage's received activations were never freed under capture). Removing the hook at
        the end of the backward that fired it breaks the cycle."""
        handle = None

        def pop_and_release(*args):
            pop(*args)
            torch.autograd.Variable._execution_engine.queue_callback(handle.remove)

        handle = torch.autograd.graph.register_multi_grad_hook(tensors, pop_and_release)

    def _fw_pre_hook(self, mod, input):
        name = self._get_mod_name(mod)
        w_mod = weakref.ref(mod)
        self._get_append_fn(w_mod, name, False)()
        if self._user_pre_fw_hook is not None:
            self._user_pre_fw_hook(mod, input)
        args, _ = tree_flatten(input)
        tensors = [
            a
            for a in args
            if isinstance(a, torch.Tensor) and a.requires_grad and a.grad_fn is not None
        ]
        if not self.is_bw:
            if tensors:
                self._register_pop_once(tensors, self._get_pop_fn(w_mod, name, True))
            else:
                self._post_bw_callbacks_to_enqueue.append(self._get_pop_fn(w_mod, name, True))
