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

Under tensor and sequence parallelism the tensorwise recipe shards with torchao's float8 styles
(`float8_tensor_parallel_styles`), as torchtitan does: the block inputs are cast on their
sequence shard and all-gathered as float8, half the bytes of a bf16 all-gather.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator

import torch
from torch import nn

_GEMM_MULTIPLE = 16  # cuBLASLt fp8 GEMM needs dims divisible by 16
PRISM_RECIPE = "prism-86a4f47"  # not torchao's: workloads.prism_float8
# the recipes torchao's float8 tensor-parallel styles take (one scale per tensor)
TENSOR_PARALLEL_RECIPES = ("tensorwise",)


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


@contextlib.contextmanager
def _quiet_torchao() -> Iterator[None]:
    """Import torchao with the loggers its import writes to quiet. On a CPU-only torch its
    import loads its CUDA extensions and logs a warning per library it cannot load; float8
    training needs none of them (its casts and `_scaled_mm` are torch ops). Everywhere, torch
    2.13's pytree logs a deprecation notice for torchao's own `register_constant` of an Enum
    (`KernelPreference`), once per process: once per captured rank, hundreds of lines in a
    `validate` log about a dependency's call, none about the job."""
    names = ["torch.utils._pytree"] + ([] if torch.cuda.is_available() else ["torchao"])
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _torchao_float8():
    """torchao.float8, imported on first use (`_quiet_torchao`)."""
    with _quiet_torchao():
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    return Float8LinearConfig, convert_to_float8_training


def float8_tensor_parallel_styles() -> tuple[type, type, type]:
    """torchao's float8 tensor-parallel styles (column, row, module input), which cast a
    sequence-parallel input to float8 on its shard and all-gather it in float8: torchtitan's TP
    plan for float8 linears (`apply_tp` in torchtitan/parallelisms/parallelize_llama.py at
    9dec370). They exist for tensorwise scaling only (`TENSOR_PARALLEL_RECIPES`)."""
    with _quiet_torchao():
        from torchao.float8.float8_tensor_parallel import (
            Float8ColwiseParallel,
            Float8RowwiseParallel,
            PrepareFloat8ModuleInput,
        )
    return Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput


def is_float8_linear(module: nn.Module) -> bool:
    """Whether `convert_linears_to_float8` made `module` a torchao float8 linear."""
    if type(module) is nn.Linear:  # torchao not imported for a plain linear
        return False
    with _quiet_torchao():
        from torchao.float8.float8_linear import Float8Linear
    return isinstance(module, Float8Linear)
