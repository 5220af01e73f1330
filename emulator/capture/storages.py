"""Storage lifetimes during capture: one ALLOC row when a storage is first seen, a FREE row
when it dies (weakref) or changes size, and the memory category of each.

`StorageLedger` is owned by the op recorder (emulator.capture.op_recorder), which hands it
the storages it sees and answers, as its `owner`, what the ledger needs to know of the
recording: the phase epoch, the last phase, the stream, whether recording is paused, and
where to emit a row.
"""

from __future__ import annotations

import itertools
import weakref

from emulator.capture.trace import ALLOC, FREE, PHASES

FORWARD, BACKWARD, RECOMPUTE, OPTIMIZER = (
    PHASES.index(p) for p in ("forward", "backward", "recompute", "optimizer")
)
# A storage first seen in a phase, not declared, is of this category.
INFERRED_PHASE_CATEGORY = {
    FORWARD: "activation",
    RECOMPUTE: "activation",
    BACKWARD: "temporary",
    OPTIMIZER: "optimizer_state",
}
# Categories of a storage that dies in the phase epoch it was born in: a temporary after all.
SHORT_LIVED = frozenset({"activation", "optimizer_state"})


class StorageRecord:
    """What the recorder knows about one live untyped storage."""

    __slots__ = ("uid", "nbytes", "epoch", "declared", "ref")

    def __init__(self, uid: int, nbytes: int, epoch: int, declared: bool, ref):
        self.uid, self.nbytes, self.epoch, self.declared, self.ref = (
            uid,
            nbytes,
            epoch,
            declared,
            ref,
        )


class StorageLedger:
    """The live storages of one recording and the category of every storage uid."""

    def __init__(self, owner) -> None:
        self._owner = owner
        self.categories: dict[int, str] = {}  # storage uid -> current category
        self.live: dict[int, StorageRecord] = {}  # id(storage object) -> its record
        self.uids = itertools.count()
        # injected copy's uid -> its original's; ints alone, which the cycle collector never
        # scans (a list of copies per original was rescanned at every micro-batch's collection)
        self.original_of: dict[int, int] = {}
        # injected copies adopted by a live tensor: they die live, and their category is the
        # one the program's rule gives them then, not their original's
        self.adopted: set[int] = set()
        self.held_frees: list[tuple[int, int]] | None = None

    def final_categories(self) -> dict[int, str]:
        """Every uid's category, injected copies ending as their original did."""
        categories = dict(self.categories)
        for copy, uid in self.original_of.items():
            if copy not in self.adopted:
                categories[copy] = categories[uid]
        return categories

    def see(self, storage, category: str | None, declared: bool = False) -> None:
        """Record an allocation for an unseen storage, or a free + alloc when its size changed
        (FSDP2 frees and refills unsharded parameters with `UntypedStorage.resize_`)."""
        key = id(storage)
        known = self.live.get(key)
        if known is not None:
            nbytes = storage.nbytes()
            if nbytes != known.nbytes:
                old_category = self.categories.get(known.uid, "other")
                if known.nbytes:
                    self._owner.emit_storage_event(FREE, known.nbytes, known.uid, old_category)
                known.uid, known.nbytes, known.epoch = next(self.uids), nbytes, self._owner.epoch
                self.categories[known.uid] = old_category
                if nbytes:
                    self._owner.emit_storage_event(ALLOC, nbytes, known.uid, old_category)
            return
        nbytes = storage.nbytes()
        if category is None:
            inferred = INFERRED_PHASE_CATEGORY.get(self._owner.last_phase, "other")
            category = "communication" if self._owner.current_stream() else inferred
        uid = next(self.uids)
        ref = weakref.ref(storage, lambda r, key=key: self.on_free(key, r))
        self.live[key] = StorageRecord(uid, nbytes, self._owner.epoch, declared, ref)
        self.categories[uid] = category
        if nbytes:
            self._owner.emit_storage_event(ALLOC, nbytes, uid, category)

    def on_free(self, key: int, ref) -> None:
        known = self.live.get(key)
        if known is None or known.ref is not ref:
            return
        del self.live[key]
        if self._owner.is_paused and self.held_frees is not None:
            self.held_frees.append((known.uid, known.nbytes))
            return
        category = self.categories[known.uid]
        if not known.declared and known.epoch == self._owner.epoch and category in SHORT_LIVED:
            category = self.categories[known.uid] = "temporary"
        if known.nbytes:
            self._owner.emit_storage_event(FREE, known.nbytes, known.uid, category)
