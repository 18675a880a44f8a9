"""A forked child owns none of its parent's exporter.

``os.fork`` (multiprocessing's "fork" start method, PyTorch ``DataLoader``
workers) copies the parent's exporter objects, exit hooks, SIGTERM handler
and open sockets into the child, but not the threads that serve them. Left
alone, a worker's exit would run the server's stop (waiting out its grace on
threads that do not exist: 5.5 s per DataLoader epoch), its SIGTERM would
run it too, and the child would keep the parent's listening port open after
the parent is gone. So everything the hook starts records the pid that
started it and does nothing in another process, and right after a fork the
child lets go of what it inherited:

* the SIGTERM handler goes back to the one the hook found (:func:`restore_sigterm`),
  so the child's SIGTERM does what it would without the hook;
* its copies of the parent's sockets are closed (:func:`close_sockets_on_port`,
  and :func:`close_unix_sockets_at` for the local socket), so only the parent
  serves and the port is freed when the parent exits;
* every object registered with :func:`owned` (the exporter, the Prometheus
  endpoint, the serving helper's link) has its ``let_go_after_fork()`` called;
* the recorder's locks start free (:func:`free_locks`): a server thread
  building a snapshot when the program forked held some, and it does not
  exist in the child, whose first record would otherwise wait forever
  (28 of 100 children hung with a thread reading snapshots in a loop);
* the exit hooks stay registered (``threading``'s list of them is private)
  but return at once, having checked the pid.

A child that calls ``metrics.install()`` itself starts an exporter of its
own (another port, its own discovery record), as any process would.

This module imports only the standard library: ``metrics`` uses it at import.

Example:
    >>> from metrics import forksafe
    >>> forksafe.in_child(lambda: None)  # runs in every fork child from now on
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["in_child", "owned", "free_locks", "act_as", "unwrapped", "restore_sigterm",
           "close_sockets_on_port", "close_unix_sockets_at"]

_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))

# The attribute on each of the hook's SIGTERM handlers naming the handler it replaced.
PREVIOUS = "tpu_info_previous"


def in_child(fn: Callable[[], None]) -> None:
    """Runs ``fn`` in every child forked from now on, before the child
    goes on; its exceptions are swallowed (the child must never fail for us).
    It runs with one thread alive, so it must not wait for locks that other
    threads of the parent may have held."""

    def guarded() -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001, S110 - nothing to report to, nothing to fail
            pass

    os.register_at_fork(after_in_child=guarded)


class LetsGo(Protocol):
    def let_go_after_fork(self) -> None: ...


_owned: weakref.WeakSet[Any] = weakref.WeakSet()


def owned(obj: LetsGo) -> int:
    """Registers ``obj`` to let go of what it holds in each fork child
    (``obj.let_go_after_fork()``, once); returns the owner's pid, for
    ``obj`` to compare with ``os.getpid()`` before it acts."""
    _owned.add(obj)
    return os.getpid()


def free_locks(*objects: Any) -> None:
    """Makes every lock held in an attribute of ``objects`` free again, in
    place (for a fork child: whoever held one is not in this process). What
    the holder was changing stays as it was left: a count may be lost, the
    child does not hang."""
    for obj in objects:
        names = list(getattr(obj, "__dict__", {}))
        for cls in type(obj).__mro__:
            names += list(getattr(cls, "__slots__", ()))
        for name in names:
            lock = getattr(obj, name, None)
            if isinstance(lock, _LOCK_TYPES):
                reinit = getattr(lock, "_at_fork_reinit", None)
                if reinit is not None:
                    reinit()
                else:
                    setattr(obj, name, type(lock)())


def _let_go_all() -> None:
    held = list(_owned)
    _owned.clear()
    for obj in held:
        try:
            obj.let_go_after_fork()
        except Exception:  # noqa: BLE001, S110 - the child goes on regardless
            pass


def unwrapped(handler: Any) -> Any:
    """The handler the hook found, under any number of the hook's own."""
    seen = 0
    while hasattr(handler, PREVIOUS) and seen < 16:
        handler = getattr(handler, PREVIOUS)
        seen += 1
    return handler


def act_as(previous: Any, signum: int, frame: Any) -> None:
    """Does what ``signum`` would have done with ``previous`` installed:
    calls it, ignores the signal, or terminates the process by it."""
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL or previous is None:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    # SIG_IGN: the program chose to ignore it; so do we.


def restore_sigterm() -> None:
    """Puts back the SIGTERM handler the hook found, if the hook's is installed."""
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGTERM)
    if hasattr(current, PREVIOUS):
        found = unwrapped(current)
        signal.signal(signal.SIGTERM, signal.SIG_DFL if found is None else found)


def _fd_dir() -> str | None:
    for path in ("/proc/self/fd", "/dev/fd"):
        if os.path.isdir(path):
            return path
    return None


def close_sockets_on_port(port: int) -> int:
    """Closes this process's TCP sockets whose local port is ``port`` (the
    listening socket and the connections it accepted); returns how many.

    For a fork child: its copies are closed, the parent's stay open.
    """
    if not port:
        return 0
    return _close_sockets(lambda s: s.family in (socket.AF_INET, socket.AF_INET6)
                          and s.type == socket.SOCK_STREAM and s.getsockname()[1] == port)


def close_unix_sockets_at(path: str) -> int:
    """Closes this process's Unix sockets bound to ``path`` (a listening
    socket and the connections it accepted); returns how many. For a fork
    child, as :func:`close_sockets_on_port`."""
    if not path:
        return 0
    return _close_sockets(lambda s: s.family == socket.AF_UNIX and s.getsockname() == path)


def _close_sockets(matches: Callable[[socket.socket], bool]) -> int:
    directory = _fd_dir()
    if directory is None:
        return 0
    closed = 0
    for name in os.listdir(directory):
        try:
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=fd)
        except (ValueError, OSError):
            continue
        try:
            ours = matches(sock)
        except OSError:
            ours = False
        finally:
            sock.detach()  # the fd is not ours to close unless it matched
        if ours:
            try:
                os.close(fd)
                closed += 1
            except OSError:
                pass
    return closed


in_child(restore_sigterm)
in_child(_let_go_all)
