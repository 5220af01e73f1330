"""Training workloads: GPT and Llama, their parallelisation, and one training iteration.

`build_training(job, mesh)` and `train_step(job, state, tokens, labels)` run a job
spec's real program on one rank; `make_mesh(job)` builds its (dp, pp, cp, tp) mesh.

The training names load on first use (PEP 562), so what needs only the specs and flavors
(`prismbench explain`, `--help`) does not import torch.
"""

import importlib

from workloads.config import ModelSpec, SpecError, stage_layer_counts
from workloads.flavors import find_flavors, get_flavor, parameter_count

_TRAINING_NAMES = ("TrainingState", "build_training", "make_mesh", "train_step")

__all__ = [
    "ModelSpec",
    "SpecError",
    "find_flavors",
    "get_flavor",
    "parameter_count",
    "stage_layer_counts",
    *_TRAINING_NAMES,
]


def __getattr__(name: str):
    if name in _TRAINING_NAMES:
        return getattr(importlib.import_module("workloads.train"), name)
    raise AttributeError(f"module 'workloads' has no attribute {name!r}")
