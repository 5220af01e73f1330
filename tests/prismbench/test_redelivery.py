"""Interrupts Python dropped in a finalizer, delivered again while the block runs."""

import os
import signal
import sys
import time
import weakref

import pytest

from prismbench.redelivery import redelivered


class Stop(BaseException):
    pass


def _stop(_signum, _frame):
    raise Stop


def _signal_in_a_finalizer(signum):
    class Held:
        pass

    held = Held()
    weakref.finalize(held, os.kill, os.getpid(), signum)  # its handler runs in there: dropped
    del held


def test_a_dropped_stop_is_raised_in_the_block_by_its_signal_sent_again():
    previous = signal.signal(signal.SIGUSR2, _stop)
    try:
        started = time.monotonic()
        with pytest.raises(Stop), redelivered({Stop: signal.SIGUSR2}):
            _signal_in_a_finalizer(signal.SIGUSR2)
            time.sleep(30)
        assert time.monotonic() - started < 10
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_a_block_that_ends_first_raises_the_exception_and_no_signal_comes_after():
    sent = []

    def record_and_stop(signum, frame):
        sent.append(signum)
        _stop(signum, frame)

    previous = signal.signal(signal.SIGUSR2, record_and_stop)
    try:
        with pytest.raises(Stop), redelivered({Stop: signal.SIGUSR2}):
            _signal_in_a_finalizer(signal.SIGUSR2)  # the block ends at once, within the delay
        sent_in_the_block = len(sent)
        time.sleep(0.05)  # a re-delivery left armed would arrive here
        assert len(sent) == sent_in_the_block
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_other_dropped_exceptions_go_to_the_hook_before_it(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: seen.append(unraisable.exc_type))

    class Broken:
        def __del__(self):
            raise ValueError("in a finalizer")

    with redelivered({Stop: signal.SIGUSR2}):
        Broken()
    assert seen == [ValueError]
