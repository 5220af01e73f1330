"""The committed tables an emulation reads (`KERNEL_TABLES`, `HOST_DISPATCH`) and the version of
the result it writes (`RESULT_SCHEMA_VERSION`): what a stored result is keyed by besides the job
and the source (`prismbench.validate.result_cache_key`).

Its own module so that a validate worker whose result is cached computes that key without
importing `prismbench.emulate`, which imports the emulator and torch (~1.3 s a process).
"""

from __future__ import annotations

from prismbench.checkout import REPO

KERNEL_TABLES = REPO / "results" / "kernels"
# measured host time per op (built by results/kernels/build_host_dispatch.py)
HOST_DISPATCH = KERNEL_TABLES / "host-dispatch.json"
# Version of the emulate JSON (EmulationResult.to_dict): raised when a key changes meaning or
# goes away, so stored results (DuckDB, MLflow) can tell which contract they hold.
RESULT_SCHEMA_VERSION = 3  # 2: steady-state peaks, first-iteration peaks beside them;
# 3: breakdown.host_wait_s, no longer inside compute_s
