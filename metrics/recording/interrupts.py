"""Which exceptions raised inside a hook are the program's, not the hook's.

Python runs a signal handler on the main thread at the next Python code it
reaches; when the signal came while the engine ran, that code is often a
hook's (a journal fold, a wrapper's record). A handler that raises (a
preemption handler raising its own ``Preempted`` on SIGTERM, a ``SIGALRM``
timeout raising ``TimeoutError``) raises inside the hook, where the hook's
``except Exception`` would count it as a hook failure and swallow it: the
program would never see its own timeout or preemption. ``SystemExit`` and
``KeyboardInterrupt`` are not ``Exception`` and pass anyway; this finds the
rest: an exception whose traceback runs through a function installed as a
signal handler.

Example:
    >>> import signal
    >>> def on_alarm(signum, frame): raise TimeoutError("step took too long")
    >>> _ = signal.signal(signal.SIGALRM, on_alarm)
    >>> try:
    ...     on_alarm(signal.SIGALRM, None)
    ... except TimeoutError as e:
    ...     from_signal_handler(e)
    True
    >>> _ = signal.signal(signal.SIGALRM, signal.SIG_DFL)
"""

from __future__ import annotations

import os
import signal
import threading
from types import CodeType, TracebackType
from typing import Any

_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # metrics/


def from_signal_handler(error: BaseException) -> bool:
    """Whether ``error`` was raised by (or under) a Python signal handler now
    installed: then it is the program's, and a hook raises it again.

    Cheap for the hook's own failures: their traceback stays in ``metrics/``
    (or runs on another thread, where no handler runs), and only a traceback
    with a frame of other code looks the handlers up (~80 us).
    """
    if threading.current_thread() is not threading.main_thread():
        return False  # handlers run on the main thread only
    codes = _codes(error.__traceback__)
    if not any(not c.co_filename.startswith(_OURS) for c in codes):
        return False
    handlers = _handler_codes()
    return any(c in handlers for c in codes)


def _codes(tb: TracebackType | None) -> list[CodeType]:
    out = []
    while tb is not None and len(out) < 64:
        out.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    return out


def _handler_codes() -> set[CodeType]:
    """The code of every Python function installed as a signal handler (and
    of the handlers the hook's own SIGTERM handlers call on)."""
    from metrics.recording import forksafe

    codes: set[CodeType] = set()
    for sig in signal.valid_signals():
        try:
            handler: Any = signal.getsignal(sig)
        except (OSError, ValueError, RuntimeError):
            continue
        for _ in range(16):  # the hook's wrappers keep what they wrap
            code = _code_of(handler)
            if code is not None:
                codes.add(code)
            handler = getattr(handler, forksafe.PREVIOUS, None)
            if handler is None:
                break
    return codes


def _code_of(handler: Any) -> CodeType | None:
    call = vars(type(handler)).get("__call__")  # a callable object's method
    for candidate in (handler, getattr(handler, "__func__", None), getattr(handler, "func", None),
                      call):
        code = getattr(candidate, "__code__", None)
        if isinstance(code, CodeType):
            return code
    return None
