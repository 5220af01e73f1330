"""Tests for emulator/capture/trace.py: the columnar RankTrace, its merge, save/load and summary."""

import gc

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from emulator.capture import trace as tr
from emulator.capture.op_recorder import OpRecorder
from emulator.world.comm_events import CommEvent, Recorder, WaitEvent


def recorded_with_comms():
    """Compute ops from the recorder interleaved with backend events on one EventSequence."""
    sequence = tr.EventSequence()
    backend = Recorder(_counter=sequence)
    backend.add_group("tp0", np.arange(4))
    rec = OpRecorder(sequence=sequence)
    with FakeTensorMode(), rec, rec.micro_batch(1):
        x = torch.ones(8, 16)
        y = x @ torch.ones(16, 4)
        ar = backend.emit(
            CommEvent,
            kind="all_reduce",
            group_id="tp0",
            group_size=4,
            op="SUM",
            dtype="float32",
            numel=32,
            nbytes=128,
            async_op=True,
        )
        backend.emit(
            CommEvent,
            kind="all_gather_coalesced",
            group_id="tp0",
            group_size=4,
            op=None,
            dtype="float32",
            numel=12,
            nbytes=48,
            async_op=False,
            sizes=(4, 8),
        )
        backend.emit(WaitEvent, comm_seq=ar.seq)
        _ = y + 1
    return rec.trace(backend.events, backend.groups)


def test_merge_orders_by_the_shared_sequence_and_inherits_context():
    t = recorded_with_comms()
    kinds = t["kind"].tolist()
    assert np.all(np.diff(t["seq"]) > 0)
    comm = kinds.index(tr.COMM)
    assert kinds[comm + 2] == tr.WAIT and t["comm_seq"][comm + 2] == t["seq"][comm]
    assert tr.COMPUTE in kinds[:comm] and tr.COMPUTE in kinds[comm:]
    assert t["micro_batch"][comm] == 1 and t["stream"][comm] == 0  # issued from the default stream
    coalesced = comm + 1
    off = t.ragged["sizes_offsets"]
    assert t.ragged["sizes"][off[coalesced] : off[coalesced + 1]].tolist() == [4, 8]


def test_tensor_shapes_are_kept_per_event():
    t = recorded_with_comms()
    mm = t.text("name").index("mm")
    assert t.tensors(mm) == [
        ((8, 16), "float32", False),
        ((16, 4), "float32", False),
        ((8, 4), "float32", True),
    ]


def test_summary_counts_flops_comm_bytes_and_peak():
    s = recorded_with_comms().summary()
    assert s.flops == 2 * 8 * 16 * 4
    assert s.comm_bytes_by_kind == {"all_reduce": 128, "all_gather_coalesced": 48}
    assert s.comm_bytes_by_group == {"tp0": 176}
    x, w, y = 8 * 16 * 4, 16 * 4 * 4, 8 * 4 * 4
    assert s.peak_live_bytes == x + w + y  # w is a temporary, freed before y + 1 runs
    assert s.final_live_bytes == x + y + y


def test_save_load_round_trip(tmp_path):
    t = recorded_with_comms()
    t.save(tmp_path / "rank.npz")
    back = tr.RankTrace.load(tmp_path / "rank.npz")
    assert back.strings == t.strings
    for name in tr.COLUMNS:
        np.testing.assert_array_equal(back[name], t[name], err_msg=name)
    for name in tr.RAGGED:
        np.testing.assert_array_equal(back.ragged[name], t.ragged[name], err_msg=name)
    assert back.groups()["tp0"].tolist() == [0, 1, 2, 3]
    assert back.summary() == t.summary()


def test_load_refuses_another_schema_version(tmp_path):
    t = recorded_with_comms()
    t.save(tmp_path / "rank.npz")
    with np.load(tmp_path / "rank.npz") as z:
        arrays = dict(z)
    arrays["schema_version"] = np.array(tr.SCHEMA_VERSION + 1)
    np.savez(tmp_path / "old.npz", **arrays)
    with pytest.raises(ValueError, match="schema_version"):
        tr.RankTrace.load(tmp_path / "old.npz")


def test_columns_of_unequal_length_are_refused():
    t = recorded_with_comms()
    columns = dict(t.columns, flops=t["flops"][:-1])
    with pytest.raises(ValueError, match="flops"):
        tr.RankTrace(columns=columns, ragged=t.ragged, strings=t.strings)


def test_event_sequence_is_shared_as_an_iterator():
    sequence = tr.EventSequence(start=5)
    backend = Recorder(_counter=sequence)
    assert [sequence.next_seq(), backend.next_seq(), next(sequence)] == [5, 6, 7]


def test_summary_flops_pass_int64_without_wrapping():
    # each op within int64 (the job spec's rule), their sum beyond it: numpy's sum wrapped to a
    # negative count, and `emulate` printed a negative hardware TFLOP/s
    big = 2**62
    backward = _event(1, flops=big)._replace(phase=1)
    t = tr.build_trace([_event(0, flops=big), backward, _event(2, flops=big)])
    assert t.summary().flops == 3 * big
    assert t.summary().flops_by_phase == {"forward": 2 * big, "backward": big, "recompute": 0,
                                          "optimizer": 0}  # fmt: skip


def test_empty_trace_builds_and_summarizes():
    s = tr.build_trace().summary()
    assert (s.events, s.flops, s.peak_live_bytes) == (0, 0, 0)


def _event(seq: int, **fields) -> tr.OpEvent:
    return tr.OpEvent(seq, tr.COMPUTE, "mm", "aten.mm", 0, "layer", 0, 0, **fields)


def test_event_log_reads_back_the_op_events_it_was_given():
    log = tr.EventLog([_event(0), _event(1, tensors=(((8, 16), "bf16", False),))])
    log.append(_event(2, flows=(5, 6)))
    assert [e.seq for e in log] == [0, 1, 2]
    assert isinstance(log[1], tr.OpEvent) and log[1].tensors == (((8, 16), "bf16", False),)
    assert log[-1].flows == (5, 6) and [e.seq for e in log[1:]] == [1, 2]
    log[0] = log[0]._replace(flops=7)
    del log[1]
    log[1:] = [_event(9)]
    assert [(e.seq, e.flops) for e in log] == [(0, 7), (9, 0)]


def test_event_log_refuses_what_is_not_an_op_event():
    with pytest.raises(TypeError, match="OpEvent"):
        tr.EventLog().append(tuple(_event(0)))


def test_event_log_leaves_its_rows_to_no_cycle_collection():
    # a capture collects before every micro-batch: events it keeps tracked make that O(N^2)
    log = tr.EventLog()
    gc.collect()
    before = len(gc.get_objects())
    for seq in range(2000):
        log.append(_event(seq, tensors=(((seq, 16), "bf16", True),), flows=(seq,)))
    for _ in range(4):  # a collection may untrack only the innermost tracked level of a row
        gc.collect()
    assert len(gc.get_objects()) - before < 100
