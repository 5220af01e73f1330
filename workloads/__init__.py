"""Training workloads: GPT and Llama, their parallelisation, and one training iteration.

`build_training(job, mesh)` and `train_step(job, state, tokens, labels)` run a job
spec's real program on one rank; `make_mesh(job)` builds its (dp, pp, cp, tp) mesh.
"""

from workloads.config import ModelSpec, SpecError, stage_layer_counts
from workloads.flavors import find_flavors, get_flavor, parameter_count
from workloads.train import TrainingState, build_training, make_mesh, train_step

__all__ = [
    "ModelSpec",
    "SpecError",
    "TrainingState",
    "build_training",
    "find_flavors",
    "get_flavor",
    "make_mesh",
    "parameter_count",
    "stage_layer_counts",
    "train_step",
]
