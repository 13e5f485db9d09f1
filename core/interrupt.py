"""A Ctrl-C that always stops a command, wherever it lands.

CPython raises SIGINT's ``KeyboardInterrupt`` in whatever Python code the main thread runs at that moment. When that
code is a callback whose exceptions have nowhere to go (an import lock's weakref clean-up while torch loads, a
``__del__``), CPython prints "Exception ignored in …" with a traceback and carries on: a command interrupted while it
starts up would print a traceback and then run to its end. Inside ``ctrl_c_always_stops`` such an interrupt is not
printed but raised again in the main thread once it has left the callback, or when the block ends, whichever comes
first, so the command's own ``except KeyboardInterrupt`` reports it in one line.
"""

from __future__ import annotations

import _thread
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

REDELIVERY_DELAY_S = 0.05
"""How long after a swallowed interrupt it is raised again: long enough for the callback it landed in to return."""


class _OwedInterrupt:
    """A swallowed interrupt not yet raised again; the lock makes the timer's delivery and the block's end exclusive."""

    def __init__(self):
        self._lock = threading.Lock()
        self._owed = False

    def owe(self) -> None:
        with self._lock:
            self._owed = True
        timer = threading.Timer(REDELIVERY_DELAY_S, self._deliver)
        timer.daemon = True
        timer.start()

    def _deliver(self) -> None:
        with self._lock:
            if self._owed:
                self._owed = False
                _thread.interrupt_main()  # SIGINT again: the main thread raises it at its next bytecode

    def settle(self) -> bool:
        """Whether an interrupt was still owed; the timer delivers none after this."""
        with self._lock:
            owed, self._owed = self._owed, False
        return owed


@contextmanager
def ctrl_c_always_stops() -> Iterator[None]:
    """Within the block, an interrupt CPython would print and ignore is raised again in the main thread instead."""
    owed = _OwedInterrupt()
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            owed.owe()
        else:
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous
        still_owed = owed.settle()  # dropped when the block ends in an exception of its own
    if still_owed:
        raise KeyboardInterrupt
