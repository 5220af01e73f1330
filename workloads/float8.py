"""Float8 training of linear layers with torchao's float8 (what torchtitan runs).

`convert_linears_to_float8(model, recipe)` calls `torchao.float8.convert_to_float8_training`
with `Float8LinearConfig.from_recipe_name(recipe)`: each eligible `nn.Linear` becomes a
torchao `Float8Linear` (same parameter objects, so meta-built, tied and state-dict names
are unchanged and tensor-parallel plans, which match modules by name, still apply).
Dynamic scaling: each GEMM operand gets scales from its current absolute maximum, one per
tensor (`tensorwise`) or one per row of the GEMM's reduction (`rowwise`, powers of two);
forward operands are e4m3, the tensorwise recipe's output gradient e5m2. All three GEMMs of
a linear run as `aten._scaled_mm`, which runs on CPU in torch 2.13 (the numerics here are
those of a real fp8 GEMM) and under FakeTensorMode (the capture sees fp8 GEMMs).

Convert BEFORE parallelize/recompute, as torchtitan's model converters do: a swap after
`parallelize_module` would drop the hooks it installed. Linears with a dimension not
divisible by 16 are left alone (`_scaled_mm` on GPUs needs multiples of 16), as is the
output projection: torchtitan's `Float8LinearConverter` skips both
(torchtitan/components/quantization/float8.py, `_module_filter_fn` with
`filter_fqns=["output"]`).
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import nn

_GEMM_MULTIPLE = 16  # cuBLASLt fp8 GEMM needs dims divisible by 16
PRISM_RECIPE = "prism-86a4f47"  # not torchao's: workloads.prism_float8


def _eligible(module: nn.Module, fqn: str, skip: tuple[str, ...]) -> bool:
    if type(module) is not nn.Linear:
        return False
    if fqn in skip or fqn.rsplit(".", 1)[-1] in skip:
        return False
    return module.in_features % _GEMM_MULTIPLE == 0 and module.out_features % _GEMM_MULTIPLE == 0


def convert_linears_to_float8(
    model: nn.Module, recipe: str = "tensorwise", skip: tuple[str, ...] = ("output",)
) -> nn.Module:
    """Swap eligible nn.Linear modules (not named in `skip`) for torchao Float8Linear, in place.

    `recipe` is a torchao recipe name (`workloads.kernels.FP8_RECIPES`), or "prism-86a4f47":
    the workloads' own float8 linears of that commit (`workloads.prism_float8`)."""
    eligible = functools.partial(_eligible, skip=skip)
    if recipe == PRISM_RECIPE:
        from workloads import prism_float8

        return prism_float8.convert_linears_to_float8(model, eligible)
    Float8LinearConfig, convert_to_float8_training = _torchao_float8()
    return convert_to_float8_training(
        model,
        module_filter_fn=eligible,
        config=Float8LinearConfig.from_recipe_name(recipe),
    )


def _torchao_float8():
    """torchao.float8, imported on first use: torchao's import loads its CUDA extensions and,
    on a CPU-only torch, logs a warning per library it cannot load; float8 training needs
    none of them (its casts and `_scaled_mm` are torch ops), so on such a build the import
    runs with torchao's logger quiet rather than print that noise in every command."""
    torchao_logger = logging.getLogger("torchao")
    level = torchao_logger.level
    if not torch.cuda.is_available():
        torchao_logger.setLevel(logging.ERROR)
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    finally:
        torchao_logger.setLevel(level)
    return Float8LinearConfig, convert_to_float8_training
