"""``tpu-info runs``' table: the saved runs, sized for the console.

A saved run's file name already says its program, pid and start
(``train.py-2291-20261204T234031.tpurun``), so on a narrow terminal the File
column shows the name within the folder named above the table (``--from``,
``report --from`` and ``diff`` take that name as it is) and the columns it
repeats give way first: End, then Program and PID, then Start. How it
ended takes its short form (``running``, ``exit 0``, ``no exit work``).
At 80 columns the table is File, Ended, Steps and Findings.

Example:
    >>> ended_short("ended without its exit work (SIGTERM or SIGKILL; saved while running)")
    'no exit work'
    >>> ended_short("running (saved while running)")
    'running'
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from tpu_info.outputs.table_layout import Alt, Cell, Col, FitTable, table

COLUMNS = (
    ("start", Col("Start", optional=2)),
    ("end", Col("End", optional=4)),
    ("ended", Col("Ended", role="text", min=7, want=12, max=80)),
    ("program", Col("Program", role="key", min=8, max=32, optional=3)),
    ("pid", Col("PID", "right", optional=3)),
    ("steps", Col("Steps", "right")),
    ("findings", Col("Findings", "right")),
    ("file", Col("File", role="key", min=12, max=200)),
)


def ended_short(ended: str) -> str:
    """How a run ended, in a word or two (the text before its parenthesis)."""
    if ended.startswith("ended without its exit work"):
        return "no exit work"
    return ended.split(" (", 1)[0]


def _cell(key: str, value: object) -> Cell:
    text = "-" if value is None else str(value)
    if key == "ended":
        return Alt(text, ended_short(text))
    if key == "file":
        return Alt(text, os.path.basename(text))
    return text


def runs_table(rows: Sequence[Mapping[str, object]], folder: str) -> FitTable:
    """The runs (``tpu-info runs --json``'s rows), newest first."""
    return table(f"Saved runs in {folder}, newest first", [c for _, c in COLUMNS],
                 [[_cell(k, r.get(k)) for k, _ in COLUMNS] for r in rows])
