"""The torch canary: every torch internal the emulator leans on exists as we use it.

A failure here after a torch upgrade names the seam (emulator/torch_compat.py SEAMS) and
the torch source it mirrors: fix it there, in one place.
"""

import inspect

import pytest
import torch

from emulator import torch_compat
from emulator.torch_compat import SEAMS, patched


@pytest.mark.parametrize("seam", SEAMS, ids=[s.path for s in SEAMS])
def test_seam_exists_with_the_parameters_we_rely_on(seam):
    if not torch_compat.present(seam):
        pytest.skip(f"{seam.path} came with torch {seam.since}; this is {torch.__version__}")
    try:
        obj = torch_compat.resolve(seam.path)
    except (ImportError, AttributeError) as err:
        pytest.fail(f"torch {torch.__version__} has no {seam.path} ({seam.mirrors}): {err}")
    if seam.parameters is not None:
        names = tuple(inspect.signature(obj).parameters)
        assert names[: len(seam.parameters)] == seam.parameters, (
            f"torch {torch.__version__}: {seam.path} takes {names}, we rely on "
            f"{seam.parameters} ({seam.mirrors})"
        )


def test_a_patch_is_undone_even_on_an_inherited_method():
    owner = torch.UntypedStorage
    # inherited from torch._C.StorageBase unless something pinned it (torch's MemTracker does):
    # either way the class must be left as it was found
    before = owner.__dict__.get("resize_")
    with patched("torch.UntypedStorage.resize_", lambda original: "replaced"):
        assert owner.resize_ == "replaced"
    assert owner.__dict__.get("resize_") is before
    with patched("torch.nn.functional.rms_norm", lambda original: None) as original:
        assert torch.nn.functional.rms_norm is None
    assert torch.nn.functional.rms_norm is original


def test_only_declared_seams_are_patched():
    with pytest.raises(ValueError, match="not a declared torch seam"):
        with patched("torch.nn.functional.layer_norm", lambda original: None):
            pass


def test_the_fake_mode_hook_is_taken_out_with_the_virtual_world():
    from torch._subclasses import fake_impls

    from emulator.world.virtual_world import destroy_virtual_world, init_virtual_world

    before = list(fake_impls.op_implementations_checks)
    init_virtual_world(0, 4)
    assert len(fake_impls.op_implementations_checks) == len(before) + 1
    destroy_virtual_world()
    assert fake_impls.op_implementations_checks == before
