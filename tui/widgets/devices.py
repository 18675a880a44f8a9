"""Devices: HBM used / total with a bar and its history, busy % and its history.

One row per device of every target read so far; a last row marks, on the same
time axis as the history sparklines, the updates that brought compile events
(``▲``), so a compile lines up with the HBM or busy-% change it caused. Rows
are updated cell by cell; the table is rebuilt only when its shape changes
(devices come or go, the terminal is resized). A reading that is missing says
why in its history column (and in the panel's tooltip), in the words of
``tpu-info doctor`` (:func:`tpu_info.views.derived.device_row`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from rich.text import Text

from tpu_info.views.derived import device_row
from tpu_info.views.values import NA, clean
from tui.state import TargetData, series
from tui.widgets.common import BAR_CELLS, Palette, bar, reasons_tip, sparkline, timeline, view_of
from tui.widgets.table import LiveTable

WIDE = 120  # from this width on: a PID column and a busy-% history column
EVENTS_ROW = "__events__"


def _gib(used: int | None, total: int | None) -> str:
    u = NA if used is None else f"{used / 2**30:.2f}"
    t = NA if total is None else f"{total / 2**30:.2f}"
    return f"{u}/{t} GiB"


class DevicesPanel(LiveTable):
    """Every device of every target, with HBM and busy-% history."""

    DEFAULT_CSS = """
    DevicesPanel { height: auto; max-height: 40%; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor=False, **kwargs)
        self.border_title = "Devices"
        self._shape: tuple[object, ...] | None = None

    def _layout(self, labels: list[str],
                width: int) -> tuple[bool, int, list[tuple[str, str, int]]]:
        wide = width >= WIDE
        dev_w = max([8] + [len(x) for x in labels])
        fixed = [("device", "Device", dev_w)]
        if wide:
            fixed.append(("pid", "PID", 8))
        fixed += [("hbm", "HBM used/total", 16), ("pct", "HBM %", BAR_CELLS + 5)]
        tail = [("busy", "Busy", 4)]
        n_spark = 2 if wide else 1
        used = sum(w for *_, w in fixed + tail) + 2 * (len(fixed) + len(tail) + n_spark - 1)
        room = max(8, width - 1 - used)
        spark = room // n_spark
        cols = fixed + [("hbm_hist", "HBM history", spark)] + tail
        if wide:
            cols.append(("busy_hist", "Busy history", room - spark))
        return wide, spark, cols

    def show(self, targets: Sequence[TargetData], selected: str | None,
             palette: Palette) -> None:
        """Brings every cell up to date with ``targets``."""
        rows: list[tuple[str, TargetData, int]] = []
        multi = sum(1 for d in targets if d.snapshot is not None) > 1
        labels: list[str] = []
        for d in targets:
            if d.snapshot is None:
                continue
            pid = d.snapshot.process.pid if d.snapshot.process else None
            for dev in d.snapshot.devices:
                rows.append((f"{d.target}|{dev.id}", d, dev.id))
                name = f"{dev.platform}:{dev.id}"
                labels.append(f"{pid}/{name}" if multi and pid else name)
        sel = next((d for d in targets if d.target == selected and d.samples), None)
        wide, spark, cols = self._layout(labels, self.scrollable_content_region.width or 80)
        shape = (tuple(r[0] for r in rows), tuple(cols), sel is not None, palette)
        if shape != self._shape:
            self._shape = shape
            self.reset(cols)
        missing: list[tuple[str, str]] = []
        for (key, d, dev_id), label in zip(rows, labels, strict=True):
            self.put_row(key, self._row(d, dev_id, label, spark, palette, missing))
        tip = reasons_tip(missing)
        if tip != self.tooltip:
            self.tooltip = tip
        if sel is not None:
            marks = [s.compiles for s in itertools.islice(reversed(sel.samples), spark)][::-1]
            cells = {"device": Text("compiles", style=palette.muted),
                     "hbm_hist": Text(timeline(marks, spark), style=palette.warn),
                     "busy_hist": Text(timeline(marks, spark), style=palette.warn)}
            self.put_row(EVENTS_ROW, cells)

    def _row(self, d: TargetData, dev_id: int, label: str, spark: int, palette: Palette,
             missing: list[tuple[str, str]]) -> dict[str, object]:
        snap = d.snapshot
        assert snap is not None
        dev = next(x for x in snap.devices if x.id == dev_id)
        row = device_row(view_of(d), dev)
        missing += row.na
        used, total = row.hbm_used.value, row.hbm_total.value
        dim = "" if d.connected else palette.muted
        pct: object = (bar(row.hbm_percent.value, palette) if row.hbm_percent.value is not None
                       else Text(NA, palette.muted))
        busy = row.busy.value
        history = series(d.samples, "hbm_used", dev_id, spark)
        never = used is None and all(v is None for v in history)  # then say why
        hbm_hist = (clean(row.hbm_used.reason, 200) if never
                    else sparkline(history, spark, hi=float(total) if total else None))
        return {
            "device": Text(clean(label, 24), style=dim),
            "pid": Text(str(snap.process.pid) if snap.process else "-", style=dim),
            "hbm": Text(_gib(used, total), style=dim),
            "pct": pct,
            "hbm_hist": Text(hbm_hist, style=dim or (palette.muted if never else palette.accent),
                             no_wrap=True, overflow="ellipsis"),
            "busy": Text(f"{busy:.0f}%" if busy is not None else NA,
                         style=dim if busy is not None else palette.muted),
            "busy_hist": Text(sparkline(series(d.samples, "busy", dev_id, spark), spark, hi=100.0)
                              if busy is not None else clean(row.busy.reason, 200),
                              style=dim or (palette.ok if busy is not None else palette.muted),
                              no_wrap=True, overflow="ellipsis"),
        }
