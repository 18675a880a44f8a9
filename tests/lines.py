"""Where a test's own source says something: for asserting a finding's line."""

from __future__ import annotations


def line_of(path: str, text: str) -> int:
    """The number of the first line of ``path`` that holds ``text`` (not the
    line asking for it)."""
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if text in line and "line_of(" not in line:
                return i
    raise AssertionError(f"{text!r} is not in {path}")
