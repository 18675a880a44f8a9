"""Which process the dashboard shows first.

Until the user picks one, the selection follows this user's most recently
started hooked process: one that discovery found a record of (records are
this user's only: :func:`tpu_info.net.discovery.scan` skips others' files and
ports another user holds), newest ``start_time`` first; then any target whose
process says it runs as this user; then the rest (another user's process on
libtpu's port 8431, a remote target). Among equals, a target with data and a
live connection wins over one without.

Example:
    >>> from tui.state import TargetData
    >>> a, b = TargetData("h:1"), TargetData("h:2")
    >>> best([a, b], {"h:1": 10.0, "h:2": 20.0}, "alice").target
    'h:2'
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from tui.state import TargetData


def this_user() -> str:
    """The login name of the effective uid ("" when it has none)."""
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return ""


def rank(d: TargetData, started: Mapping[str, float], me: str) -> tuple[bool, bool, int, float]:
    """Bigger is better: has data, is connected, whose it is, how new."""
    p = d.snapshot.process if d.snapshot is not None else None
    if d.target in started:
        whose, when = 2, started[d.target]
    elif p is not None and me and p.user == me:
        whose, when = 1, p.start_time_unix or 0.0
    else:
        whose, when = 0, (p.start_time_unix or 0.0) if p is not None else 0.0
    return (d.snapshot is not None, d.connected, whose, when)


def best(targets: Sequence[TargetData], started: Mapping[str, float],
         me: str) -> TargetData | None:
    """The target to show when the user has not picked one (None: no targets);
    the first of equals keeps its place."""
    top: TargetData | None = None
    for d in targets:
        if top is None or rank(d, started, me) > rank(top, started, me):
            top = d
    return top
