"""Transfers: host->device and device->host counts, bytes, byte-rate history
(same time axis as the device charts) and latency percentiles."""

from __future__ import annotations

from rich.text import Text

from tpu_info.views import NA, format_bytes, format_ns, transfer_stats
from tui.state import TargetData, series
from tui.widgets.common import Palette, sparkline
from tui.widgets.table import GAP, Column, LiveTable

COMPACT = 70  # narrower than this: no history, no P90
RATE_SAMPLES = 10  # the rate column averages this many samples
_NUMBERS: list[Column] = [("dir", "Dir", 4), ("count", "Count", 6), ("bytes", "Bytes", 9),
                          ("rate", "Rate", 11)]
_PCTS: list[Column] = [("p50", "P50", 8), ("p90", "P90", 8), ("p999", "P99.9", 8)]


def columns(width: int) -> list[Column]:
    """The columns that fit ``width``; the sparkline takes what is left."""
    if width < COMPACT:
        return _NUMBERS + [c for c in _PCTS if c[0] != "p90"]
    fixed = sum(w for *_, w in _NUMBERS + _PCTS) + GAP * (len(_NUMBERS) + len(_PCTS))  # type: ignore[misc]
    return _NUMBERS + [("history", "History", max(6, width - fixed - 1))] + _PCTS


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
            return
        spark_w = next((w for key, _, w in cols if key == "history"), 0) or 0
        muted = Text(NA, style=palette.muted)
        for stats, attr in zip(transfer_stats(data.snapshot),
                               ("h2d_bytes_per_s", "d2h_bytes_per_s"), strict=True):
            values = series(data.samples, attr, last=max(spark_w, RATE_SAMPLES))
            recent = [v for v in values[-RATE_SAMPLES:] if v is not None]
            self.put_row(stats.direction, {
                "dir": "h->d" if stats.direction == "h2d" else "d->h",
                "count": Text(str(stats.count), justify="right"),
                "bytes": Text(format_bytes(stats.bytes) if stats.bytes is not None else NA,
                              justify="right"),
                "rate": Text(_rate(sum(recent) / len(recent) if recent else None),
                             justify="right"),
                "history": Text(sparkline(values, spark_w), style=palette.accent),
                "p50": Text(format_ns(stats.p50_ns), justify="right")
                if stats.p50_ns is not None else muted,
                "p90": Text(format_ns(stats.p90_ns), justify="right")
                if stats.p90_ns is not None else muted,
                "p999": Text(format_ns(stats.p999_ns), justify="right")
                if stats.p999_ns is not None else muted,
            })
