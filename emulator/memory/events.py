"""The event table a memory replay walks: a trace's alloc/free rows plus workspaces.

Two kinds of workspace come through the caching allocator without being tensors the capture
sees: the cuBLAS and cuBLASLt workspaces of each handle (made at its first matmul and at its
first cuBLASLt matmul, kept), and the scratch a kernel allocates for its own duration (the
trace's `workspace_bytes`, e.g. the attention backward's float32 dQ accumulator: torch's cuDNN
SDPA backward takes it as one `CUDACachingAllocator::allocate(workspace_size)` after
allocating dQ, dK, dV and frees it when the op returns, aten/src/ATen/native/cudnn/MHA.cpp
run_cudnn_SDP_bprop). A kernel's scratch is one block allocated at the op's row, after its
outputs, and freed right after.

Per event: its trace row, whether it frees, size, storage uid (workspaces get uids -2, -3,
...), stream and category code (into `categories`: the trace's strings plus
WORKSPACE_CATEGORY and KERNEL_WORKSPACE_CATEGORY). emulator.memory.iterations cuts it into a
first and a steady iteration.
"""

from __future__ import annotations

import numpy as np

from emulator.capture.trace import ALLOC, BACKWARD_PHASES, COMPUTE, FREE, RankTrace
from emulator.costs.ops import GEMM_OPS

WORKSPACE_CATEGORY = "cublas_workspace"
KERNEL_WORKSPACE_CATEGORY = "kernel_workspace"


def replay_events(
    trace: RankTrace,
    cublas_workspace_bytes: int,
    workspaces: bool = True,
    cublaslt_workspace_bytes: int = 0,
) -> dict:
    """The alloc/free rows and, with `workspaces`: one cuBLAS workspace allocation (never
    freed) at the first matmul of each (thread, stream), since autograd runs backward on its own
    thread, whose cuBLAS handle gets its own workspace (CublasHandlePool.cpp keys workspaces by
    handle and stream); one cuBLASLt workspace (never freed) at the first cuBLASLt matmul of each
    (thread, stream), after the cuBLAS one (`_first_lt_matmuls`); and each op's own scratch
    (`workspace_bytes` > 0), allocated and freed at its row."""
    c = trace.columns
    kind = c["kind"]
    rows = np.flatnonzero((kind == ALLOC) | (kind == FREE))
    categories = (*trace.strings, WORKSPACE_CATEGORY, KERNEL_WORKSPACE_CATEGORY)
    none = np.zeros(0, np.int64)
    ws_rows = _first_matmuls(trace) if workspaces and cublas_workspace_bytes else none
    lt_rows = _first_lt_matmuls(trace) if workspaces and cublaslt_workspace_bytes else none
    op_rows = np.flatnonzero((kind == COMPUTE) & (c["workspace_bytes"] > 0)) if workspaces else none
    kept = np.concatenate([ws_rows, lt_rows])  # made once, never freed
    n_kept, n_op = len(kept), len(op_rows)
    op_uids = -2 - n_kept - np.arange(n_op, dtype=np.int64)
    # a stable sort keeps a row's cuBLAS workspace before its cuBLASLt one and each op's
    # scratch allocation before its free
    all_rows = np.concatenate([rows, kept, op_rows, op_rows])
    order = np.argsort(all_rows, kind="stable")
    code = len(trace.strings)
    return {
        "rows": all_rows[order],
        "is_free": np.concatenate(
            [kind[rows] == FREE, np.zeros(n_kept + n_op, bool), np.ones(n_op, bool)]
        )[order],
        "size": np.concatenate(
            [
                c["size_bytes"][rows],
                np.full(len(ws_rows), cublas_workspace_bytes, np.int64),
                np.full(len(lt_rows), cublaslt_workspace_bytes, np.int64),
                np.tile(c["workspace_bytes"][op_rows].astype(np.int64), 2),
            ]
        )[order],
        "uid": np.concatenate(
            [c["storage"][rows], -2 - np.arange(n_kept, dtype=np.int64), op_uids, op_uids]
        )[order],
        "stream": np.concatenate(
            [c["stream"][rows], c["stream"][kept], np.tile(c["stream"][op_rows], 2)]
        ).astype(np.int64)[order],
        "category": np.concatenate(
            [
                c["category"][rows],
                np.full(n_kept, code, np.int32),
                np.full(2 * n_op, code + 1, np.int32),
            ]
        )[order],
        "categories": categories,
    }


def _first_matmuls(trace: RankTrace) -> np.ndarray:
    c = trace.columns
    names = [trace.strings.index(m) for m in GEMM_OPS if m in trace.strings]
    rows = np.flatnonzero((c["kind"] == COMPUTE) & np.isin(c["name"], names))
    return _first_per_thread_and_stream(trace, rows)


def _first_lt_matmuls(trace: RankTrace) -> np.ndarray:
    """The first row of each (thread, stream) that runs through cuBLASLt: `_scaled_mm`, and
    `addmm` with a 1-D bias (torch's addmm_out_cuda_impl takes cuBLASLt's bias epilogue for it,
    gemm_and_bias, unless DISABLE_ADDMM_CUDA_LT=1). Plain mm/bmm go through cuBLAS (torch's
    default BLAS backend on CUDA) and make no cuBLASLt workspace."""
    c = trace.columns
    name = {trace.strings.index(m): m for m in ("addmm", "scaled_mm") if m in trace.strings}
    rows = np.flatnonzero((c["kind"] == COMPUTE) & np.isin(c["name"], list(name)))
    lt = [r for r in rows.tolist() if name[c["name"][r]] == "scaled_mm" or _has_1d_bias(trace, r)]
    return _first_per_thread_and_stream(trace, np.array(lt, np.int64))


def _has_1d_bias(trace: RankTrace, row: int) -> bool:
    tensors = trace.tensors(row)
    return bool(tensors) and not tensors[0][2] and len(tensors[0][0]) == 1


def _first_per_thread_and_stream(trace: RankTrace, rows: np.ndarray) -> np.ndarray:
    c = trace.columns
    if not len(rows):
        return np.zeros(0, np.int64)
    thread = np.isin(c["phase"][rows], BACKWARD_PHASES).astype(np.int64)
    key = thread * (1 << 20) + c["stream"][rows].astype(np.int64)
    _, first = np.unique(key, return_index=True)
    return np.sort(rows[first])
