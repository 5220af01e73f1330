"""What Inductor makes of one compiled graph's rows (emulator.capture.inductor_scheduler):
repeated casts found once, fusible nodes grouped by data dependence, and an order the data
allows; on hand-written rows of one block."""

from emulator.capture.inductor_scheduler import (
    common_subexpressions,
    dead_code,
    fused_groups,
    graph_order,
    schedule,
)
from emulator.capture.trace import COMPUTE, PHASES
from tests.emulator.capture.hand_rows import D, N, Rows, as_classes


def _run(events):
    return [i for i, e in enumerate(events) if e.kind == COMPUTE]


def test_a_cast_repeated_on_the_same_input_is_a_common_subexpression():
    x, s1, c1, s2, c2 = range(5)
    rows = Rows()
    for scale, cast in ((s1, c1), (s2, c2)):
        rows.op("amax", (x,), (scale,), out_shape=())
        rows.op("_to_copy", (x, scale), (cast,), in_shapes=[(N, D), ()])
    events = as_classes(rows.events, {"amax": "reduction", "_to_copy": "copy"})
    run = _run(events)
    repeated, alias = common_subexpressions(events, run, transient=frozenset({s2, c2}))
    assert repeated == set(run[2:]) and alias == {s2: s1, c2: c1}
    # outputs that outlive the graph (saved for backward, say) are not dropped
    assert common_subexpressions(events, run, transient=frozenset()) == (set(), {})


def test_an_input_written_in_between_or_a_hidden_scalar_makes_no_repeat():
    x, y, s1, s2, m1, m2 = range(6)
    rows = Rows()
    rows.op("amax", (x,), (s1,), out_shape=())
    rows.op("add_", (x, y), (x,))  # x changes: the second amax reads another value
    rows.op("amax", (x,), (s2,), out_shape=())
    rows.op("mul", (y,), (m1,))  # y * 2 and y * 3 record alike: no scalar in a row
    rows.op("mul", (y,), (m2,))
    events = as_classes(rows.events, {"amax": "reduction"})
    assert common_subexpressions(events, _run(events), frozenset(range(6))) == (set(), {})


def test_recomputed_rows_whose_outputs_nothing_reads_are_dead_and_so_are_their_producers():
    """Op-level SAC kept a GEMM's output, so the recomputation's float8 cast before it (and the
    upcast before that) feeds nothing: the compiled graph drops both. A backward row's reader
    may be missing from the trace (a dropped layout copy): only recomputed rows are judged."""
    w, up, c, g, dg, b = range(6)
    recompute, backward = PHASES.index("recompute"), PHASES.index("backward")
    rows = Rows()
    rows.op("_to_copy", (w,), (up,), phase=recompute)  # read only by a dead row: dead too
    rows.op("_to_copy", (up,), (c,), phase=recompute)  # its GEMM's output was kept
    rows.op("mm", (g, w), (dg,), phase=backward)
    rows.op("_to_copy", (w,), (b,), phase=backward)  # read through a copy the trace dropped
    events = as_classes(rows.events, {"_to_copy": "copy"})
    run = _run(events)
    freed = frozenset({up, c, b})
    assert dead_code(events, run, frozenset(), freed_inside=freed) == set(run[:2])
    # a value that outlives the graph's last row (its output) is not dead
    assert dead_code(events, run, frozenset(), freed_inside=frozenset({up})) == set()


def test_a_recomputed_gemm_whose_output_nothing_reads_is_dead_with_the_cast_it_read():
    """Full checkpointing reruns a block's last float8 GEMM (torchao saves its inputs only
    after it runs), though the backward reads nothing it writes: the compiled graph, which
    recomputes only what the backward reads, runs neither it nor its weight's cast."""
    w, c, x, y, g, dx = range(6)
    recompute, backward = PHASES.index("recompute"), PHASES.index("backward")
    rows = Rows()
    rows.op("_to_copy", (w,), (c,), phase=recompute)
    rows.op("mm", (x, c), (y,), phase=recompute)  # y: read by no backward row
    rows.op("mm", (g, w), (dx,), phase=backward)
    events = as_classes(rows.events, {"_to_copy": "copy"})
    run = _run(events)
    assert dead_code(events, run, frozenset(), freed_inside=frozenset({c, y})) == set(run[:2])
    # the backward's GEMM itself is never judged, though nothing in the run reads dx
    backward_only = dead_code(events, run[2:], frozenset(), freed_inside=frozenset({dx}))
    assert backward_only == set()


def test_two_reductions_fuse_before_a_reduction_and_a_pointwise_node_that_share_more():
    """Inductor sorts each round's candidate pairs by kind first (two reductions, or two
    pointwise kernels) and by shared bytes only then (InductorChoices.score_fusion). A fp8
    SwiGLU backward's amaxes go together and its casts, which need the finished amaxes, go
    together; ranked by bytes alone, one amax joins the casts and leaves a third kernel."""
    y, z, s1, w, s2 = range(5)
    rows = Rows()
    rows.op("amax", (y,), (s1,), out_shape=())
    rows.op("cast", (y, z, s1), (w,), in_shapes=[(N, D), (N, D), ()])  # needs s1 finished
    rows.op("dot", (y, z), (s2,), out_shape=())  # shares y and z with the cast, y with amax
    events = as_classes(rows.events, {"amax": "reduction", "dot": "reduction"})
    run = _run(events)
    nodes, groups = fused_groups(events, run)
    kernels = sorted(sorted(nodes[j].row for j in group) for group in groups)
    assert kernels == [[run[0], run[2]], [run[1]]]


def _norm_and_amax(amax_input: str):
    """A norm's row statistics and a tensorwise amax over 1 024 x 1 024 elements (large enough
    for Inductor to split the amax into a partial and a final reduction), the amax over the
    normed value or over the norm's input itself; the cast that needs the finished amax."""
    rows_, cols = 1024, 1024
    x, stats, normed, scale, cast = range(5)
    rows = Rows()
    rows.op("mean", (x,), (stats,), in_shapes=[(rows_, cols)], out_shape=(rows_, 1))
    rows.op("mul", (x, stats), (normed,), in_shapes=[(rows_, cols), (rows_, 1)],
            out_shape=(rows_, cols))  # fmt: skip
    source = {"normed": normed, "input": x}[amax_input]
    rows.op("amax", (source,), (scale,), in_shapes=[(rows_, cols)], out_shape=())
    rows.op("cast", (normed, scale), (cast,), in_shapes=[(rows_, cols), ()],
            out_shape=(rows_, cols))  # fmt: skip
    events = as_classes(rows.events, {"mean": "reduction", "amax": "reduction"})
    run = _run(events)
    nodes, groups = fused_groups(events, run, transient={stats, normed, scale})
    return run, sorted(sorted(r for j in group for r in nodes[j].rows) for group in groups)


def test_an_amax_of_a_normed_value_splits_along_the_norms_rows_and_fuses_with_its_statistics():
    """Inductor splits a large reduction to one element along the ranges of a row reduction
    its input's recipe reads (`extract_input_node_reduction_ranges`): the partial amax runs
    the norm's loop, and the two are one kernel (the row statistics and a normed input's
    amax in a Llama 3 8B block); the cast, which needs the finished amax, is another."""
    run, kernels = _norm_and_amax("normed")
    mean, mul, amax, cast = run
    assert kernels == [[mean, mul, amax], [mul, cast]]


def test_an_amax_of_a_stored_input_splits_by_its_own_size_and_stays_apart():
    """Over the norm's input (a graph input: nothing of a reduction's in its recipe) the amax
    splits by a size of its own, whose partial loop is not the norm's: two kernels."""
    run, kernels = _norm_and_amax("input")
    mean, mul, amax, cast = run
    assert kernels == [[mean, mul, cast], [amax]]


def test_of_two_pairs_that_share_as_many_bytes_the_nearer_in_the_graph_fuses():
    """A normed input's amax (its recipe reads the norm's input, statistics and weight) shares
    the input with both the recomputed row statistics and the norm backward's row sum, and as
    many bytes again with each (the statistics; the weight, of as many elements): the tie goes
    to the pair nearer in the graph (Inductor's proximity score), not in program order. The
    recomputed statistics lie just before the amax in AOTAutograd's order, the row sum after a
    GEMM; the GEMM reads the statistics and the row sum reads it, so the third node cannot
    join either pair."""
    rows_, cols, fillers = 1024, 1024, 10
    x, stats, normed, scale, w, g, total = range(7)
    recompute, backward = PHASES.index("recompute"), PHASES.index("backward")
    rows = Rows()
    rows.op("mean", (x,), (stats,), in_shapes=[(rows_, cols)], out_shape=(rows_, 1),
            phase=recompute)  # fmt: skip
    for k in range(fillers):
        rows.op("mm", (100 + k,), (101 + k,), phase=backward)
    rows.op("mul", (x, stats, w), (normed,), in_shapes=[(rows_, cols), (rows_, 1), (cols,)],
            out_shape=(rows_, cols), phase=backward)  # fmt: skip
    rows.op("amax", (normed,), (scale,), in_shapes=[(rows_, cols)], out_shape=(),
            phase=backward)  # fmt: skip
    rows.op("mm", (stats,), (g,), in_shapes=[(rows_, 1)], out_shape=(rows_, cols),
            phase=backward)  # fmt: skip
    rows.op("sum", (x, w, g), (total,), in_shapes=[(rows_, cols), (cols,), (rows_, cols)],
            out_shape=(rows_, 1), phase=backward)  # fmt: skip
    events = as_classes(rows.events, {"mean": "reduction", "amax": "reduction", "sum": "reduction"})
    run = _run(events)
    mean, mul, amax = run[0], run[-4], run[-3]
    nodes, groups = fused_groups(events, run, transient={stats, normed, scale})
    fused = [sorted(r for j in group for r in nodes[j].rows) for group in groups if len(group) > 1]
    assert fused == [[mean, mul, amax]]  # the row sum, in no pair, is a kernel of its own


def test_the_swiglu_backward_is_one_group_between_the_gemm_it_needs_and_the_one_it_feeds():
    a, b, g, w2, s, p, dw2, dp, ds, db, da = range(11)
    rows = Rows()
    rows.op("silu", (a,), (s,))
    rows.op("mul", (s, b), (p,))
    rows.op("mm", (g, p), (dw2,))
    rows.op("mm", (g, w2), (dp,))
    rows.op("mul", (dp, b), (ds,))
    rows.op("mul", (dp, s), (db,))
    rows.op("silu_backward", (ds, a), (da,))
    events = as_classes(rows.events)
    run = _run(events)
    nodes, groups = fused_groups(events, run, transient={s, ds})  # s and ds die in the graph
    # silu is inlined into both rows that read it, ds's mul into silu_backward; then one group
    assert sorted(len(n.rows) for n in nodes) == [1, 1, 2, 2, 2]
    kernels = [sorted({r for j in group for r in nodes[j].rows}) for group in groups]
    assert sorted(kernels) == sorted([[run[2]], [run[3]], [run[i] for i in (0, 1, 4, 5, 6)]])
    order, _ = schedule(nodes, groups)
    first_rows = [min(r for j in groups[k] for r in nodes[j].rows) for k in order]
    assert first_rows == [run[3], run[0], run[2]]  # dp's GEMM, the fused kernel, dW2's GEMM


def test_a_transposed_read_shares_nothing_with_a_read_of_the_tensor_in_its_own_order():
    """torchao casts an output gradient twice: row-major for the input gradient's GEMM, and
    transposed for the weight gradient's (`a.contiguous()` of the cast's transpose). Inductor
    runs the second as one loop over its output, reading the gradient transposed: its memory
    score finds no index the two share, and the scale they both read is fewer bytes than two
    kernels that do not depend on each other must share (`SCORE_FUSION_MEMORY_THRESHOLD`).
    The amax and the reciprocal of its result fuse all the same: one reads the other."""
    g, s, r, c0, c1 = range(5)
    rows = Rows()
    rows.op("amax", (g,), (s,), out_shape=())
    rows.op("reciprocal", (s,), (r,), out_shape=(), in_shapes=[()])
    rows.op("_to_copy", (g, s), (c0,), in_shapes=[(N, D), ()])
    rows.op("_to_copy", (g, s), (c1,), in_shapes=[(N, D), ()], out_shape=(D, N))
    events = as_classes(rows.events, {"amax": "reduction", "_to_copy": "copy"})
    run = _run(events)

    def kernels(events):
        nodes, groups = fused_groups(events, run)
        return sorted(sorted(nodes[j].row for j in group) for group in groups)

    # both casts read g in its order: one kernel, one read of g
    assert kernels(events) == [[run[0], run[1]], [run[2], run[3]]]
    events[run[3]] = events[run[3]]._replace(transposed_reads=(g,))
    assert kernels(events) == [[run[0], run[1]], [run[2]], [run[3]]]


def _weight_casts_around_a_backward(first_use: int, gemms: int = 70):
    """A weight cast in the recomputation and again in the backward, `gemms` backward GEMMs
    between them, the recomputed cast first read by the GEMM at `first_use`."""
    w, recomputed, cast, g = 0, 1, 2, 10
    recompute, backward = PHASES.index("recompute"), PHASES.index("backward")
    rows = Rows()
    rows.op("_to_copy", (w,), (recomputed,), phase=recompute)
    for k in range(gemms):
        rows.op("mm", (g + k, recomputed) if k == first_use else (g + k,), (g + k + 1,),
                phase=backward)  # fmt: skip
    rows.op("_to_copy", (w,), (cast,), phase=backward)
    events = as_classes(rows.events, {"_to_copy": "copy"})
    run = _run(events)
    nodes, groups = fused_groups(events, run)
    return run, sorted(sorted(nodes[j].row for j in group) for group in groups if len(group) > 1)


def test_a_recomputed_node_sits_beside_its_first_backward_use_and_distant_nodes_do_not_fuse():
    """Inductor fuses no two independent kernels more than `MAX_HORIZONTAL_DISTANCE` nodes
    apart in the graph, and AOTAutograd puts a recomputed node just before the first backward
    node that needs it: under full checkpointing the recomputed cast of a weight is needed at
    once and stays apart from the backward's cast of it; needed late, it sits beside it and
    the two are one kernel (one read of the weight)."""
    run, fused = _weight_casts_around_a_backward(first_use=0)
    assert fused == []
    run, fused = _weight_casts_around_a_backward(first_use=69)
    assert fused == [[run[0], run[-1]]]


def test_the_graph_order_counts_the_nodes_inductor_makes():
    """A large reduction to one value is two scheduler nodes (a partial and a final
    reduction), an attention kernel a fallback kernel and one node per output, a GEMM one."""
    x, s, q, o, lse, w, y = range(7)
    rows = Rows()
    rows.op("amax", (x,), (s,), in_shapes=[(1024, 256)], out_shape=())
    rows.op("attention", (q,), (o, lse))
    rows.op("mm", (o, w), (y,))
    rows.op("relu", (y,), (x,))
    events = as_classes(rows.events, {"amax": "reduction", "attention": "flash_attn_fwd"})
    nodes, _ = fused_groups(events, _run(events))
    assert graph_order(events, nodes) == [0, 2, 5, 6]
