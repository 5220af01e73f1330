"""The virtual world's life: register the "prism" backend, make this process one rank of a
world, tear the world down so that the process can become another rank.

Kept apart from the backend (virtual_pg) and the fake-mode hook (fake_collectives), which it
joins: the hook is installed with the world and taken out with it.
"""

from __future__ import annotations

import sys

import numpy as np
import torch.distributed as dist

from emulator import torch_compat
from emulator.world import fake_collectives
from emulator.world.virtual_pg import BACKEND_NAME, VirtualProcessGroup


def _create_virtual_pg(common_opts, backend_opts) -> VirtualProcessGroup:
    ranks = common_opts.global_ranks_in_group
    if len(ranks) == 0:  # the default group: every rank of the world
        global_ranks = np.arange(common_opts.group_size, dtype=np.int64)
    else:
        global_ranks = np.asarray(ranks, dtype=np.int64)
    return VirtualProcessGroup(
        common_opts.group_rank, common_opts.group_size, global_ranks, str(common_opts.group_id)
    )


def register_backend() -> None:
    """Register "prism" with torch.distributed (and hook fake mode); idempotent."""
    fake_collectives.install()
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(
        BACKEND_NAME, _create_virtual_pg, extended_api=True, devices=["cpu", "cuda"]
    )


def init_virtual_world(rank: int, world_size: int) -> VirtualProcessGroup:
    """Make this process rank `rank` of a virtual world of `world_size` ranks."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank({rank}) must be in [0, world_size({world_size}))")
    register_backend()
    # init_process_group wraps sys.excepthook to prefix tracebacks with "[rank<r>]: "
    # (torch/distributed/distributed_c10d.py, _distributed_excepthook) and nothing unwraps it:
    # a process that captured n ranks printed an unrelated crash with n prefixes naming
    # virtual ranks. Such a process is no rank of a real job: keep its hook as it was.
    excepthook = sys.excepthook
    dist.init_process_group(BACKEND_NAME, rank=rank, world_size=world_size, store=dist.HashStore())
    sys.excepthook = excepthook
    return torch_compat.default_process_group()


def destroy_virtual_world() -> None:
    """Tear the world down so that this process can become another rank.

    DTensor caches sharding and redistribution plans keyed by DeviceMesh, and a new
    rank's mesh compares equal to the old one (DeviceMesh.__eq__ ignores the rank and the
    group names), so cached specs would hand back the old mesh and its dead groups
    ("Could not resolve the process group"): clear those caches (torch 2.13 names).
    """
    torch_compat.clear_dtensor_caches()
    fake_collectives.uninstall()
    dist.destroy_process_group()
