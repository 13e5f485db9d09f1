"""A Ctrl-C that always stops a command, wherever it lands.

CPython raises SIGINT's ``KeyboardInterrupt`` in whatever Python code the main thread runs at that moment. When that
code is a callback whose exceptions have nowhere to go (an import lock's weakref clean-up while torch loads, a
``__del__``), CPython prints "Exception ignored in …" with a traceback and carries on: a command interrupted while it
starts up would print a traceback and then run to its end. Inside ``ctrl_c_always_stops`` such an interrupt is not
printed but raised again in the main thread once it has left the callback, so the command's own
``except KeyboardInterrupt`` reports it in one line. A block that finishes before that has done its work: the
interrupt is dropped, as it would be had it come a moment later.
"""

from __future__ import annotations

import _thread
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

REDELIVERY_DELAY_S = 0.05
"""How long after a swallowed interrupt it is raised again: long enough for the callback it landed in to return."""


def _interrupt_main_thread() -> None:
    """SIGINT to the main thread again. A real signal wakes a main thread blocked in a sleep, a lock or a wait
    (``_thread.interrupt_main`` only sets a flag it reads when it next runs Python code); it is sent only while
    SIGINT has a Python handler, which turns it into ``KeyboardInterrupt`` rather than ending the process."""
    if callable(signal.getsignal(signal.SIGINT)):
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    else:
        _thread.interrupt_main()


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
                _interrupt_main_thread()

    def drop(self) -> None:
        """Deliver nothing from now on."""
        with self._lock:
            self._owed = False


@contextmanager
def ctrl_c_always_stops() -> Iterator[None]:
    """Within the block, an interrupt CPython would print and ignore is raised again in the main thread instead."""
    owed = _OwedInterrupt()
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        # SIGINT is handled in the main thread only: another thread's KeyboardInterrupt is no Ctrl-C
        if (unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt)
                and threading.current_thread() is threading.main_thread()):
            owed.owe()
        else:
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        try:
            owed.drop()  # first: once dropped, no interrupt arrives while the hook is put back
        finally:
            sys.unraisablehook = previous
