"""Interrupts Python dropped, delivered again.

A signal handler's exception is raised in whatever code the main thread runs when the signal
arrives; if that is a finalizer or a weakref callback (torch's fake tensors and importlib's
module locks run many), Python prints "Exception ignored" and drops it, and the program goes on
as if no signal had come (seen in CI: a SIGTERM that landed in importlib's module-lock callback
let a capture run to its end and exit 0). `redelivered` catches such a drop in
`sys.unraisablehook` and signals the main thread again. Used by the CLI (SIGTERM, Ctrl-C) and
the capture (a failed lane stopping the parent's, SIGUSR1).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping

# Delay before the signal is sent again: from the main thread, its handler would run at once,
# still inside the code that dropped its exception.
REDELIVERY_DELAY_S = 0.01


@contextlib.contextmanager
def redelivered(
    signals: Mapping[type[BaseException], int],
    on_drop: Callable[[BaseException], None] | None = None,
) -> Iterator[None]:
    """While the block runs, an exception of a type in `signals` (checked in order) that Python
    drops is signalled again, as `signals` maps it, to the main thread REDELIVERY_DELAY_S later,
    after `on_drop(exception)` (to re-arm a handler). The block's end closes the re-delivery, so
    no signal is ever sent into what follows, and raises the exception of one still unsent. Other
    dropped exceptions go to the hook that was there before, which comes back after the block."""
    redelivery = _Redelivery()

    def deliver_again(unraisable) -> None:
        for kind, signum in signals.items():
            if isinstance(unraisable.exc_value, kind):
                if on_drop is not None:
                    on_drop(unraisable.exc_value)
                redelivery.send_soon(signum)
                return
        previous_hook(unraisable)

    previous_hook = sys.unraisablehook
    sys.unraisablehook = deliver_again
    try:
        yield
    finally:
        try:
            undelivered = redelivery.close()
        finally:
            sys.unraisablehook = previous_hook
        if undelivered is not None:
            raise next(kind for kind, signum in signals.items() if signum == undelivered)()


class _Redelivery:
    """A signal sent to the main thread from a timer thread, until closed; `close` returns the
    one still unsent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unsent: int | None = None
        self._closed = False

    def send_soon(self, signum: int) -> None:
        with self._lock:
            self._unsent = signum
        timer = threading.Timer(REDELIVERY_DELAY_S, self._send, (signum,))
        timer.daemon = True
        timer.start()

    def _send(self, signum: int) -> None:
        with self._lock:
            if self._closed or self._unsent is None:
                return
            self._unsent = None
            signal.pthread_kill(threading.main_thread().ident, signum)

    def close(self) -> int | None:
        with self._lock:
            self._closed = True
            return self._unsent
