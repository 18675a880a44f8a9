"""Transfers: host->device and device->host counts, bytes, byte-rate history
(same time axis as the device charts) and latency percentiles, as the CLI
derives them (:func:`tpu_info.views.derived.transfer_rows`); the panel's tooltip
says why each N/A is N/A.

``Timed`` is how many samples the percentiles stand on (the time
distribution's count, :attr:`~tpu_info.views.values.TransferStats.timed`):
under :data:`~tpu_info.views.values.MIN_TIMED_SAMPLES` the percentiles are
N/A, and where it is below Count the other transfers were counted, not timed."""

from __future__ import annotations

from rich.text import Text

from tpu_info.views.derived import Derived, transfer_rows
from tpu_info.views.values import NA, format_bytes, format_ns
from tui.state import TargetData, series
from tui.widgets.common import Palette, reasons_tip, sparkline, view_of
from tui.widgets.table import GAP, Column, LiveTable

COMPACT = 70  # narrower than this: no history, no P90
RATE_SAMPLES = 10  # the rate column averages this many samples
_NUMBERS: list[Column] = [("dir", "Dir", 4), ("count", "Count", 6), ("bytes", "Bytes", 8),
                          ("rate", "Rate", 10)]
# format_bytes and format_ns are at most 8 and 7 cells wide (``1023 MiB``, ``1.50 ms``).
_PCTS: list[Column] = [("timed", "Timed", 5), ("p50", "P50", 7), ("p90", "P90", 7),
                       ("p999", "P99.9", 7)]


def columns(width: int) -> list[Column]:
    """The columns that fit ``width``; the sparkline takes what is left."""
    if width < COMPACT:
        return _NUMBERS + [c for c in _PCTS if c[0] != "p90"]
    fixed = sum(w for *_, w in _NUMBERS + _PCTS) + GAP * (len(_NUMBERS) + len(_PCTS))  # type: ignore[misc]
    return _NUMBERS + [("history", "History", max(6, width - fixed - 1))] + _PCTS


def timed_text(timed: int) -> str:
    """The Timed cell: how many samples the percentiles stand on (``-``: none)."""
    return f"{timed:,}" if timed else "-"


def _rate(v: float | None) -> str:
    return f"{format_bytes(v)}/s" if v is not None else NA


class TransfersPanel(LiveTable):
    """Both transfer directions of the picked process."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor=False, **kwargs)  # type: ignore[arg-type]
        self.border_title = "Transfers"
        self._shape: object = None

    def show(self, data: TargetData | None, palette: Palette) -> None:
        """Rewrites the two rows (only changed cells are redrawn)."""
        cols = columns(max(20, self.size.width or 80))
        shape = (tuple(cols), palette, data.target if data else None)
        if shape != self._shape:
            self._shape = shape
            self.reset(cols)
        if data is None or data.snapshot is None:
            self.put_row("h2d", {"dir": Text("no process picked" if data is None
                                             else "not read yet", style=palette.muted)})
            self.tooltip = None
            return
        spark_w = next((w for key, _, w in cols if key == "history"), 0) or 0
        muted = Text(NA, style=palette.muted)

        def ns(d: Derived[float]) -> Text:
            return Text(format_ns(d.value), justify="right") if d.value is not None else muted

        rows = transfer_rows(view_of(data))
        for row, attr in zip(rows, ("h2d_bytes_per_s", "d2h_bytes_per_s"), strict=True):
            values = series(data.samples, attr, last=max(spark_w, RATE_SAMPLES))
            recent = [v for v in values[-RATE_SAMPLES:] if v is not None]
            self.put_row(row.direction, {
                "dir": "h->d" if row.direction == "h2d" else "d->h",
                "count": Text(str(row.count), justify="right"),
                "bytes": Text(row.bytes.text(format_bytes), justify="right"),
                "rate": Text(_rate(sum(recent) / len(recent) if recent else None),
                             justify="right"),
                "history": Text(sparkline(values, spark_w), style=palette.accent),
                "timed": Text(timed_text(row.stats.timed), justify="right",
                              style=palette.warn if row.stats.timed_note() else ""),
                "p50": ns(row.p50_ns), "p90": ns(row.p90_ns), "p999": ns(row.p999_ns),
            })
        shown = {c[0] for c in cols} | {"bytes"}
        tip = reasons_tip(p for row in rows for p in row.na if p[0].rpartition("/")[2] in shown)
        if tip != self.tooltip:
            self.tooltip = tip
