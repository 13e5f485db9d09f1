"""A Ctrl-C that always stops a command, wherever it lands.

CPython raises SIGINT's ``KeyboardInterrupt`` in whatever Python code the main thread runs at that moment. When that
code is a callback whose exceptions have nowhere to go (an import lock's weakref clean-up while torch loads, a
``__del__``), CPython prints "Exception ignored in …" with a traceback and carries on: a command interrupted while it
starts up would print a traceback and then run to its end. Inside a ``CtrlCGuard`` such an interrupt is not
printed but raised again in the main thread once it has left the callback, so the command's own
``except KeyboardInterrupt`` reports it in one line. A block that finishes before that has done its work: the
interrupt is dropped, as it would be had it come a moment later.
"""

from __future__ import annotations

import _thread
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from core.errors import UserError

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


class CtrlCGuard:
    """``with CtrlCGuard() as ctrl_c:`` around a command's work: within the block, an interrupt CPython would print
    and ignore is raised again in the main thread instead, and ``ctrl_c.received`` tells afterwards whether Ctrl-C
    was pressed at all. A library can catch the interrupt and fail its own way (an import cut in half, then a
    ``RecursionError`` from a module half there): a command reports a failure after a Ctrl-C as the interrupt."""

    def __init__(self):
        self.received = False
        self._owed = _OwedInterrupt()
        self._deferring = False
        self._held = False

    def __enter__(self) -> CtrlCGuard:
        self._previous_hook = sys.unraisablehook
        self._previous_handler = signal.getsignal(signal.SIGINT)
        # only over a Python handler (a main thread's default): one that ignores SIGINT, or a thread, is left alone
        self._handled = callable(self._previous_handler) and threading.current_thread() is threading.main_thread()
        try:
            sys.unraisablehook = self._hook
            if self._handled:
                signal.signal(signal.SIGINT, self._on_sigint)
        except BaseException:  # a Ctrl-C as the guard is put in place: nothing of it stays behind
            self.__exit__()
            raise
        return self

    def _on_sigint(self, signum, frame) -> None:
        self.received = True
        if self._deferring:
            self._held = True
            return
        self._previous_handler(signum, frame)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """``with ctrl_c.deferred():`` around the imports of native libraries: a Ctrl-C inside is held and raised as
        the block ends. torch calls Python from C++ as it loads, where a ``KeyboardInterrupt`` cannot pass: raised
        there, it aborts the process (pybind11's ``terminate``) instead of stopping the command."""
        self._deferring, self._held = True, False
        try:
            yield
        finally:
            self._deferring = False
        if self._held:
            self._held = False
            raise KeyboardInterrupt

    def _hook(self, unraisable) -> None:
        # SIGINT is handled in the main thread only: another thread's KeyboardInterrupt is no Ctrl-C
        if (unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt)
                and threading.current_thread() is threading.main_thread()):
            self._owed.owe()
        else:
            self._previous_hook(unraisable)

    def __exit__(self, *exc) -> None:
        try:
            self._owed.drop()  # first: once dropped, no interrupt arrives while the handlers are put back
        finally:
            sys.unraisablehook = self._previous_hook
            if self._handled:
                try:
                    signal.signal(signal.SIGINT, self._previous_handler)
                except KeyboardInterrupt:  # a pending Ctrl-C runs before the swap: swap, then raise it
                    signal.signal(signal.SIGINT, self._previous_handler)
                    raise


def command_failure(ctrl_c: CtrlCGuard, error: Exception, interrupted: Callable[[BaseException | None], int]) -> int:
    """A command's exit status for ``error``, raised inside ``ctrl_c``'s block: after a Ctrl-C, the interrupt's
    (``interrupted(error)``: a library caught it and failed its own way); else a ``UserError``'s one line and 2; any
    other error is a bug, raised again for its traceback."""
    if ctrl_c.received:
        return interrupted(error)
    if isinstance(error, UserError):
        print(f"error: {error}", file=sys.stderr)
        return 2
    raise error


def interrupted_line(then: BaseException | None = None) -> str:
    """How a command reports a Ctrl-C: "interrupted: stopped by Ctrl-C", and the failure it turned into when a
    library caught it (``then``), named in the same line."""
    if then is None:
        return "interrupted: stopped by Ctrl-C"
    first = (str(then).splitlines() or [""])[0]
    return f"interrupted: stopped by Ctrl-C (then {type(then).__name__}: {first})"


def run_main(main, also: tuple[type[Exception], ...] = ()) -> None:
    """Run a command's ``main()`` as its ``__main__`` block: bad input (a ``UserError``, or one of ``also``, a
    library's own kind of bad input) ends in one line on stderr and exit status 2, Ctrl-C in one line and 130
    (``core.interrupt``: also when a library caught it and failed or exited its own way), a bug in its traceback;
    otherwise exit 0 (whatever ``main`` returns is for callers)."""
    import sys

    def interrupted(then: BaseException | None = None) -> int:
        print(interrupted_line(then), file=sys.stderr)
        return 130

    ctrl_c = CtrlCGuard()
    try:
        with ctrl_c:
            main()
    except KeyboardInterrupt:
        sys.exit(interrupted())
    except SystemExit as e:
        if ctrl_c.received and e.code not in (0, None):  # e.g. Lightning's exit after it caught the Ctrl-C
            sys.exit(interrupted())
        raise
    except Exception as e:
        if isinstance(e, also) and not ctrl_c.received:
            e = UserError(" ".join(str(e).split()))
        sys.exit(command_failure(ctrl_c, e, interrupted))
    sys.exit(0)
