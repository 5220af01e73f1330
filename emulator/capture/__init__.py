"""Capture: run one rank of a program under fake tensors and record its iteration as a trace.

Modules: `rank` (capture_rank, the context a program runs in), `op_recorder` (dispatch-level
recording of compute, storage lifetimes, phases), `chunk_reuse` (one pipeline chunk recorded,
the others injected), `micro_batch_reuse` (the same for gradient accumulation without
pipelining), `streams` (CUDA stream and event tracking), `opmap` and `fused_ops`
(what an aten op is priced as; the fused kernels a GPU would run), `trace` (RankTrace, the
columnar record handed to the graph and the memory model).
"""
