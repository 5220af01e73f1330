"""Cost models: compute kernels (roofline + kernel tables), NCCL collectives, overlap interference.

Modules: `ops` (the normalized op record), `compute`, `kernel_table`, `calibrate` (GPU only),
`nccl_tuning` (NCCL's tuner constants), `collectives`, `overlap`. Formulas: docs/MODELS.md.
"""
