"""Memory categories the program declares during capture, and the gradients that follow.

`Declarations.tag(obj, category)` names the category of existing tensors (parameters,
buffers, optimizer state); the `.grad` of a declared parameter is declared "gradient" as
autograd accumulates it (a post-accumulate-grad hook, live while the recorder is entered)
and again when the optimizer phase begins. Categories land in the recorder's storage ledger
(emulator.capture.storages), keyed by the storage that holds the memory.
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

from emulator.capture.storages import StorageLedger


def _dtensor_type():
    from torch.distributed.tensor import DTensor

    return DTensor


class Declarations:
    def __init__(self, ledger: StorageLedger, is_paused) -> None:
        self._ledger, self._is_paused = ledger, is_paused
        self._params = WeakIdKeyDictionary()  # declared parameters (keys only)
        self._hooks: list | None = None  # None: not watching gradients (recorder not entered)
        self.dtensor = _dtensor_type()

    def tag(self, obj, category: str) -> None:
        """Declare the category of existing tensors: a tensor, an nn.Module (its parameters
        get `category`, its buffers "buffer"), an optimizer (its state tensors), or an
        iterable of those."""
        if isinstance(obj, torch.Tensor):
            self._declare(obj, category)
        elif isinstance(obj, torch.nn.Module):
            self.tag(obj.parameters(), category)
            self.tag(obj.buffers(), "buffer")
        elif isinstance(obj, torch.optim.Optimizer):
            states = [
                t for s in obj.state.values() for t in s.values() if isinstance(t, torch.Tensor)
            ]
            self.tag(states, category)
        else:
            for item in obj:
                self.tag(item, category)

    def tag_gradients(self) -> None:
        """Declare the current `.grad` of every declared parameter (the optimizer begins)."""
        for p in list(self._params.keys()):
            if p.grad is not None:
                self.tag(p.grad, "gradient")

    def watch_gradients(self) -> None:
        self._hooks = []
        for p in list(self._params.keys()):
            self._hook_grad(p)

    def unwatch_gradients(self) -> None:
        for handle in self._hooks or ():
            handle.remove()
        self._hooks = None

    def _hook_grad(self, param: torch.Tensor) -> None:
        if param.requires_grad and param.is_leaf:
            self._hooks.append(param.register_post_accumulate_grad_hook(self._on_grad))

    def is_own_hook(self, hook) -> bool:
        """Whether `hook` is the post-accumulate-grad hook that declares gradients."""
        return hook == self._on_grad

    def _on_grad(self, param: torch.Tensor) -> None:
        if param.grad is not None and not self._is_paused():
            self._declare(param.grad, "gradient")

    def _declare(self, tensor: torch.Tensor, category: str) -> None:
        # a DTensor (TP- or FSDP-sharded parameter, its grad, its optimizer state) owns no
        # memory of its own: its local shard does
        local = tensor._local_tensor if isinstance(tensor, self.dtensor) else tensor
        storage = local.untyped_storage()
        known = self._ledger.live.get(id(storage))
        if known is None:
            self._ledger.see(storage, category, declared=True)
        else:
            known.declared = True
            self._ledger.categories[known.uid] = category
        if category == "parameter" and tensor not in self._params:
            self._params[tensor] = True
            if self._hooks is not None:
                self._hook_grad(tensor)
