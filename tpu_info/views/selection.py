"""nvitop's process selection: ``--pid PID[,PID]`` and ``--user USER[,USER]``
keep only those processes in a run's readings (the Processes table, ``-p``,
``--json``'s targets, ``--query``'s process rows, ``-q``'s processes).

A process is kept when its pid is one of ``pids`` (when given) and its user
one of ``users`` (when given): both, as nvitop's filters are. A user is named
or given as its uid (``1000`` matches ``alice`` when alice's uid is 1000, and
the other way round). A target whose process is not known (one that could
not be read, libtpu's service) is no process of anyone's: it is left out;
the chips stay (``-i`` selects those), and a target that failed is still
said on stderr.

Example:
    >>> from tpu_info.views.derived_value import Derived
    >>> pick = ProcessPick(pids=frozenset({42}))
    >>> pick.active, pick.keeps(None)
    (True, False)
    >>> pick.words()
    '--pid 42'
"""

from __future__ import annotations

import pwd
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from tpu_info.views.derived import ProcessRow, RunReadings


def this_user() -> str:
    """Who runs this command: nvitop's ``--user`` without a name (the uid when nameless)."""
    import getpass
    import os

    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry nor LOGNAME: the uid
        return str(os.getuid())


def _also_as_uid(users: Iterable[str]) -> frozenset[str]:
    """Each user as given, with its uid (a name) or its name (a uid) added."""
    out = set()
    for u in users:
        out.add(u)
        try:
            out.add(pwd.getpwuid(int(u)).pw_name if u.isdigit() else str(pwd.getpwnam(u).pw_uid))
        except (KeyError, ValueError, OverflowError):
            pass  # no such uid or name here: matched as written
    return frozenset(out)


@dataclass(frozen=True)
class ProcessPick:
    """The processes to keep (empty sets: no selection on that key)."""

    pids: frozenset[int] = frozenset()
    users: tuple[str, ...] = ()  # as given
    names: frozenset[str] = field(default=frozenset(), compare=False)  # users, and their uids

    @classmethod
    def of(cls, pids: Iterable[int] | None, users: Iterable[str] | None) -> ProcessPick:
        users = tuple(dict.fromkeys(users or ()))
        return cls(frozenset(pids or ()), users, _also_as_uid(users))

    @property
    def active(self) -> bool:
        return bool(self.pids or self.users)

    def keeps(self, row: ProcessRow | None) -> bool:
        """True when ``row`` is one of the processes asked for."""
        if row is None or row.pid.value is None:
            return False
        if self.pids and row.pid.value not in self.pids:
            return False
        return not self.users or row.user.value in self.names

    def words(self) -> str:
        """The selection as the command line says it (``--pid 42 --user alice``)."""
        parts = []
        if self.pids:
            parts.append("--pid " + ",".join(map(str, sorted(self.pids))))
        if self.users:
            parts.append("--user " + ",".join(self.users))
        return " ".join(parts)

    def apply(self, run: RunReadings) -> RunReadings:
        """``run`` with only the processes kept (nothing changed when none is asked)."""
        if not self.active:
            return run
        targets = tuple(t for t in run.targets if self.keeps(t.process))
        owners = tuple(o for o in run.owners if self.keeps(o))
        return replace(run, targets=targets, owners=owners,
                       no_processes=f"No process matches {self.words()}.")
