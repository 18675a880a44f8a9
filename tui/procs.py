"""The Processes panel's rows as processes, and the filter by user and pid.

A row of the Processes panel is a hooked target or a chip owner without the
hook; :class:`Proc` says who it is (pid, program, user, host) for the filter
(``u``, ``/`` on the panel, ``--user`` / ``--pid``) and for signals
(:mod:`tui.signals`). :class:`ProcessFilter` is the one parser of what a user
types in the filter box and of the command line's values, so both mean the
same: bare digits are a pid, a bare word a user, ``pid:`` and ``user:`` say
which; terms of one kind are alternatives (``alice bob``: either user), the
two kinds must both hold (``alice 4242``: alice's pid 4242), as nvitop's
``--user`` and ``--pid`` do. A user is a name or a uid (``user:1000``
matches alice when alice's uid is 1000, and the other way round).

Example:
    >>> f = ProcessFilter.parse("alice, pid:4242")
    >>> f.words(), f.matches(Proc("k", 4242, "train.py", "alice"))
    ('user alice, pid 4242', True)
    >>> f.matches(Proc("k", 4243, "train.py", "alice"))
    False
    >>> ProcessFilter.parse("pid:x")
    Traceback (most recent call last):
    ValueError: pid:x: a pid is a positive integer
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tpu_info.contract.model import OwnerRecord

if TYPE_CHECKING:
    from tui.state import TargetData  # the state holds a filter: it imports this module

MAX_PID = 1 << 31
OWNER_PREFIX = "pid|"  # the key of a chip owner's row: pid|4242
_SPLIT = re.compile(r"[\s,]+")


@dataclass(frozen=True, slots=True)
class Proc:
    """Who one row of the Processes panel is.

    Attributes:
        key: the row's key (a target, or ``pid|<pid>`` for a chip owner).
        pid: None when there is no process to name (libtpu's service, a
            target not read yet); ``why_no_pid`` says why.
        name: the program (``train.py``), as the row names it.
        user: the user the row shows ("" when unknown); the filter matches it.
            Signals never trust it: :mod:`tui.signals` reads the uid in ``/proc``.
        host: the host the process runs on ("" when it did not say).
        started_unix: when the hook started (hooked rows), to tell a pid reused
            by a younger process from the program.
        hooked: a hooked target (else a chip owner seen in ``/proc``).
        command: the command line, where known.
    """

    key: str
    pid: int | None
    name: str = ""
    user: str = ""
    host: str = ""
    started_unix: float = 0.0
    hooked: bool = True
    command: str = ""
    why_no_pid: str = ""

    def label(self) -> str:
        """``pid 4242 (train.py)``, or the key when there is no pid."""
        if self.pid is None:
            return self.key
        return f"pid {self.pid} ({self.name})" if self.name else f"pid {self.pid}"


def target_proc(d: TargetData) -> Proc:
    """A hooked target's process, as its hook described it."""
    s = d.snapshot
    if s is None:
        return Proc(d.target, None, why_no_pid=d.error or "not read yet")
    p = s.process
    if p is None:
        why = ("libtpu's service reports devices, not processes" if d.source == "libtpu"
               else "the target sent no process record")
        return Proc(d.target, None, why_no_pid=why)
    return Proc(d.target, p.pid, p.name, p.user, p.host, p.start_time_unix,
                command=" ".join(p.argv))


def owner_proc(pid: int, owner: OwnerRecord | None, host: str) -> Proc:
    """A chip owner without the hook, as the host scan named it."""
    o = owner or OwnerRecord(pid)
    return Proc(f"{OWNER_PREFIX}{pid}", pid, o.name, o.user, host, hooked=False,
                command=o.command)


def _also_as_uid(users: Iterable[str]) -> frozenset[str]:
    """Each user as given, with its uid (a name) or its name (a uid) added."""
    out = set()
    for u in users:
        out.add(u)
        try:
            import pwd

            out.add(pwd.getpwuid(int(u)).pw_name if u.isdigit() else str(pwd.getpwnam(u).pw_uid))
        except (ImportError, KeyError, ValueError, OverflowError):
            pass  # no such uid or name here: matched as written
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class ProcessFilter:
    """Rows whose user is one of ``users`` (by name or uid) and whose pid is
    one of ``pids`` (an empty set: any)."""

    users: frozenset[str] = frozenset()
    pids: frozenset[int] = frozenset()
    names: frozenset[str] = field(default=frozenset(), compare=False)  # users, and their uids

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", _also_as_uid(self.users))

    @classmethod
    def parse(cls, text: str) -> ProcessFilter:
        """What the filter box (or ``--user``/``--pid``, joined) says.

        Raises:
            ValueError: a ``pid:`` that is not a pid, or an empty ``user:``.
        """
        users: set[str] = set()
        pids: set[int] = set()
        for term in _SPLIT.split(text.strip()):
            if not term:
                continue
            kind, sep, value = term.partition(":")
            if not sep:
                kind, value = ("pid" if term.isascii() and term.isdigit() else "user"), term
            kind = kind.lower()
            if kind == "pid":
                pids.add(pid_value(value, term))
            elif kind == "user" and value:
                users.add(value)
            elif kind == "user":
                raise ValueError(f"{term}: name a user after 'user:'")
            else:
                users.add(term)  # a user name with a colon in it: taken whole
        return cls(frozenset(users), frozenset(pids))

    @classmethod
    def of(cls, users: Iterable[str] = (), pids: Iterable[int] = ()) -> ProcessFilter:
        """The filter of the command line's ``--user`` and ``--pid`` values."""
        return cls(frozenset(users), frozenset(pids))

    def __bool__(self) -> bool:
        return bool(self.users or self.pids)

    def matches(self, p: Proc) -> bool:
        """Whether row ``p`` is shown (a row without a pid never matches a pid)."""
        if self.users and p.user not in self.names:
            return False
        return not self.pids or p.pid in self.pids

    def text(self) -> str:
        """What the filter box shows for this filter (parses back to it)."""
        return " ".join([f"user:{u}" for u in sorted(self.users)]
                        + [f"pid:{p}" for p in sorted(self.pids)])

    def words(self) -> str:
        """``user alice, pid 4242``: the panel's title says it so."""
        parts = []
        if self.users:
            parts.append(f"user {' or '.join(sorted(self.users))}")
        if self.pids:
            parts.append(f"pid {' or '.join(map(str, sorted(self.pids)))}")
        return ", ".join(parts)


def pid_value(value: str, term: str | None = None) -> int:
    """``value`` as a pid.

    Raises:
        ValueError: not a positive integer below 2**31.
    """
    if not (value.isascii() and value.isdigit()) or not 0 < int(value) < MAX_PID:
        raise ValueError(f"{term or value}: a pid is a positive integer")
    return int(value)
