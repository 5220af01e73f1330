"""The execution graph of an iteration and its replay.

Modules: `build` (class traces -> ExecutionGraph: per-rank streams, waits, collectives joined
across ranks), `replay` (mesh-vectorised discrete-event replay: iteration time, breakdown,
critical path), `results` (what a replay gives: timelines, breakdown, critical path),
`timeline` (Perfetto trace of replayed ranks).
"""
