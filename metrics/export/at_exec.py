"""The program's end by ``exec``: work that ``atexit`` would do, done before
the process becomes another program.

``os.execv`` and friends replace the process without running ``atexit``
handlers (and ``os.register_at_fork`` has no hook for exec), so a program
that ends by exec'ing another would leave no saved run and a discovery
record naming a server that is gone. :func:`register` wraps ``os.execv`` and
``os.execve`` (``os.execl``, ``execlp``, ``execvp`` and the rest call them)
once: before an exec that can succeed (the file exists and is executable),
each registered ``before`` runs, in its owner process only; if the exec
fails after all, each ``after_failure`` undoes it and the program goes on.
A caller that took ``os.execv`` itself before the hook was installed is not
seen. Never raises into the program.

Example:
    >>> register(lambda: print("saving"), lambda: None)  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("metrics.export.at_exec")

_lock = threading.Lock()
_work: list[tuple[int, Callable[[], None], Callable[[], None]]] = []
_wrapped = False


def register(before: Callable[[], None], after_failure: Callable[[], None]) -> None:
    """Runs ``before`` ahead of this process's exec (``after_failure`` if the
    exec then fails); registered for the calling process only (a forked
    child's exec runs nothing of its parent's)."""
    global _wrapped
    with _lock:
        _work.append((os.getpid(), before, after_failure))
        if _wrapped:
            return
        _wrapped = True
    for name in ("execv", "execve"):
        original = getattr(os, name, None)
        if original is not None:
            setattr(os, name, _wrap(original))


def _can_exec(path: Any) -> bool:
    try:
        if isinstance(path, int):  # execve(fd, ...): fexecve
            return True
        return os.path.isfile(path) and os.access(path, os.X_OK)
    except (OSError, TypeError, ValueError):
        return False


def _run(index: int) -> None:
    pid = os.getpid()
    for owner, *calls in list(_work):
        if owner == pid:
            try:
                calls[index]()
            except Exception as e:  # noqa: BLE001 - never in the way of the exec
                log.debug("tpu-info: work at exec failed: %r", e)


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def exec_(path: Any, *args: Any, **kwargs: Any) -> Any:
        if not _can_exec(path):
            return original(path, *args, **kwargs)  # it fails (execvp tries the next)
        _run(0)
        try:
            return original(path, *args, **kwargs)
        except BaseException:
            _run(1)
            raise

    exec_.__wrapped_by_tpu_info__ = True  # type: ignore[attr-defined]
    return exec_
