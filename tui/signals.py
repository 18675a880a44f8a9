"""Signals to a process of the Processes panel: only to your own, and only
to the process that was confirmed.

nvitop's keys: ``i`` SIGINT, ``t`` SIGTERM, ``k`` SIGKILL. :func:`pin` decides
whether a row may be signalled at all, before any dialog is offered: it must
be a process of this host, its real uid (read in ``/proc``, never the hook's
word) must be the dashboard's user, and the pid must still be the process
the row shows (a hooked row's: started no later than its hook; a chip
owner's, seen by a host scan up to seconds old: the same command line), not
a younger process that reused the pid. Then
it holds the process by a pidfd (Linux 5.3 on), so the signal sent after the
confirmation reaches that process or nothing: a process that ended
meanwhile is "gone", never a stranger that took its pid. Where pidfds do not
exist the process's start time is checked again just before ``kill``.

Example:
    >>> from tui.procs import Proc
    >>> pin(Proc("libtpu", None, why_no_pid="libtpu's service")).words
    "libtpu: no process to signal (libtpu's service)"
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from tpu_info.contract.discovery_record import process_start_unix
from tpu_info.host.processes import PROC_ROOT, describe, real_uid
from tui.procs import Proc

# The keys of the Processes panel, nvitop's.
SIGNALS: dict[str, signal.Signals] = {"i": signal.SIGINT, "t": signal.SIGTERM,
                                      "k": signal.SIGKILL}
# What each does to a program, for the confirmation dialog.
EFFECT = {
    signal.SIGINT: "as Ctrl-C: a Python program raises KeyboardInterrupt where it is",
    signal.SIGTERM: "asks the program to end; the hook saves its run on the way out",
    signal.SIGKILL: "ends the program at once: nothing is saved, no clean-up runs",
}
START_SLACK_S = 1.0  # the start read from /proc may be up to this late (still_running's rule)

# Why a row cannot be signalled.
NO_PID, ELSEWHERE, NOT_YOURS, GONE, REUSED, UNKNOWN = (
    "no_pid", "elsewhere", "not_yours", "gone", "reused", "unknown")
# What happened to a signal that was sent.
SENT, ENDED, NOT_PERMITTED = "sent", "gone", "not_permitted"


def signal_name(sig: int) -> str:
    """``SIGTERM`` (``signal 0`` for a number without a name)."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


@dataclass(frozen=True, slots=True)
class Refusal:
    """A row that will not be signalled, and why (``kind``: one of
    :data:`NO_PID`, :data:`ELSEWHERE`, :data:`NOT_YOURS`, :data:`GONE`,
    :data:`REUSED`, :data:`UNKNOWN`)."""

    proc: Proc
    kind: str
    words: str


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of a confirmed signal (``kind``: :data:`SENT`,
    :data:`ENDED`: the process had ended, :data:`NOT_PERMITTED`)."""

    proc: Proc
    sig: int
    kind: str
    words: str


class Pinned:
    """A process checked as yours and held until :meth:`send` or :meth:`close`."""

    def __init__(self, proc: Proc, uid: int, started_unix: float | None, fd: int | None,
                 proc_root: str = PROC_ROOT) -> None:
        self.proc = proc
        self.uid = uid
        self.started_unix = started_unix
        self.fd = fd
        self.proc_root = proc_root

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None
        return self.proc.pid

    def send(self, sig: int) -> Outcome:
        """Sends ``sig`` to the pinned process (once), then lets it go."""
        name, who = signal_name(sig), self.proc.label()
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
            else:
                if not self._same():
                    raise ProcessLookupError
                os.kill(self.pid, sig)
        except ProcessLookupError:
            return Outcome(self.proc, sig, ENDED,
                           f"{who} is gone: it ended before {name} was sent")
        except PermissionError as e:
            return Outcome(self.proc, sig, NOT_PERMITTED,
                           f"not permitted to send {name} to {who}: {e.strerror or e}")
        except OSError as e:
            return Outcome(self.proc, sig, NOT_PERMITTED,
                           f"{name} was not sent to {who}: {e.strerror or e}")
        finally:
            self.close()
        return Outcome(self.proc, sig, SENT, f"sent {name} to {who}")

    def _same(self) -> bool:
        """Without a pidfd: the pid is still the process that was checked."""
        if real_uid(self.pid, self.proc_root) != self.uid:
            return False
        try:
            return self.started_unix is None or abs(
                process_start_unix(self.pid, self.proc_root) - self.started_unix) < 0.5
        except (OSError, ValueError, ImportError):
            return False

    def close(self) -> None:
        """Lets the process go (a cancelled dialog)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _open_pidfd(pid: int) -> int | None:
    """A pidfd of ``pid`` (None where the OS has none).

    Raises:
        ProcessLookupError: no process ``pid``.
    """
    opener = getattr(os, "pidfd_open", None)
    if opener is None or not hasattr(signal, "pidfd_send_signal"):
        return None
    try:
        return opener(pid)
    except ProcessLookupError:
        raise
    except OSError:  # ENOSYS (an older kernel, a sandbox), EMFILE: checked by start time
        return None


def _alive(fd: int | None) -> bool:
    if fd is None:
        return True
    try:
        signal.pidfd_send_signal(fd, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, whoever's it is (the uid says)
        return True
    return True


def pin(proc: Proc, *, me: int | None = None, host: str = "",
        proc_root: str = PROC_ROOT) -> Pinned | Refusal:
    """Whether ``proc`` may be signalled by this dashboard, and if so holds it.

    Args:
        proc: the row.
        me: the dashboard's uid (default: the effective uid).
        host: this host's name: a process that says it runs elsewhere is refused.
        proc_root: where ``/proc`` is (tests point it at a fixture tree).
    """
    who = proc.label()
    if proc.pid is None:
        return Refusal(proc, NO_PID, f"{who}: no process to signal"
                       + (f" ({proc.why_no_pid})" if proc.why_no_pid else ""))
    if proc.host and host and proc.host != host:
        return Refusal(proc, ELSEWHERE, f"{who} runs on {proc.host}, not on this host "
                       f"({host}): only a process here can be signalled")
    me = os.geteuid() if me is None else me
    try:
        fd = _open_pidfd(proc.pid)
    except ProcessLookupError:
        return Refusal(proc, GONE, f"{who} is gone: nothing to signal")
    try:
        # Read after the pidfd was opened and checked alive after: what /proc
        # said was about the process the pidfd holds.
        uid = real_uid(proc.pid, proc_root)
        started: float | None
        try:
            started = process_start_unix(proc.pid, proc_root)
        except (OSError, ValueError, ImportError):
            started = None
        if not _alive(fd) or uid is None and not os.path.exists(f"{proc_root}/{proc.pid}"):
            _close(fd)
            return Refusal(proc, GONE, f"{who} is gone: nothing to signal")
        if uid is None:
            _close(fd)
            return Refusal(proc, UNKNOWN, f"{who}: its owner cannot be read in "
                           f"{proc_root}/{proc.pid}/status, so it is not signalled")
        if uid != me:
            _close(fd)
            return Refusal(proc, NOT_YOURS, f"{who} belongs to {_user_words(uid)}, "
                           f"not to you (uid {me}): tpu-info --watch signals only your "
                           "own processes")
        if _reused(proc, started, proc_root):
            _close(fd)
            return Refusal(proc, REUSED, f"pid {proc.pid} is no longer "
                           f"{proc.name or 'the program'}: a younger process took its pid, "
                           "so it is not signalled")
    except BaseException:
        _close(fd)
        raise
    return Pinned(proc, uid, started, fd, proc_root)


def _reused(proc: Proc, started: float | None, proc_root: str) -> bool:
    """Whether ``proc.pid`` is now another process than the row's."""
    assert proc.pid is not None
    if proc.hooked:
        return (proc.started_unix > 0 and started is not None
                and started > proc.started_unix + START_SLACK_S)
    now = describe(proc.pid, proc_root).command
    return bool(proc.command and now and now != proc.command)


def _user_words(uid: int) -> str:
    try:
        import pwd

        name = pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        name = ""
    return f"{name} (uid {uid})" if name else f"uid {uid}"


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)
