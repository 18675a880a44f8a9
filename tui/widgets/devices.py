"""Devices: HBM used / total with a bar and its history, busy % and its history.

Where this host was scanned (the dashboard reads this host), its chips come
first, joined as ``tpu-info``'s table joins them
(:func:`tpu_info.views.device_rows.device_readings`): only the chips usable
here (``--all``: every chip), each with its owner (pid and name), HBM from
libtpu or the owner's hook, and busy % from libtpu or, marked ``~``, the
hook's estimate; the panel's subtitle counts the chips not listed. Then one
row per device of every target that no chip row shows (a remote host's, a
CPU's). A last row marks, on the same time axis as the history sparklines,
the updates that brought compile events (``▲``), so a compile lines up with
the HBM or busy-% change it caused. Rows are updated cell by cell; the table
is rebuilt only when its shape changes (devices come or go, the terminal is
resized). A reading that is missing says why in its history column (and in
the panel's tooltip), in the words of ``tpu-info doctor``
(:func:`tpu_info.views.derived.device_row`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from rich.text import Text

from tpu_info.contract.model import LocalScan
from tpu_info.views.chips import BUSY_LIBTPU, HBM_HOOK, HBM_LIBTPU, ChipUsage
from tpu_info.views.derived import DeviceReadings, DeviceRow, device_readings, device_row
from tpu_info.views.values import NA, TargetView, clean, format_percent
from tui.state import TargetData, series
from tui.widgets.common import BAR_CELLS, Palette, bar, reasons_tip, sparkline, timeline, view_of
from tui.widgets.table import LiveTable

WIDE = 120  # from this width on: an Owner column and a busy-% history column
EVENTS_ROW = "__events__"
OWNER_W = 18


def _gib(used: int | None, total: int | None) -> str:
    u = NA if used is None else f"{used / 2**30:.2f}"
    t = NA if total is None else f"{total / 2**30:.2f}"
    return f"{u}/{t} GiB"


def _busy(row: DeviceRow) -> str:
    """``42%``, ``~42%`` for the hook's estimate (as the table writes it)."""
    b = row.busy.value
    return NA if b is None else ("~" if row.busy_estimated else "") + format_percent(b)


def _joined(targets: dict[str, TargetData], pairs: Sequence[tuple[str, int]], attr: str,
            spark: int, mean: bool) -> list[float | None]:
    """A chip's history: the sum (HBM) or mean (busy %) of the devices joined
    to it, per sample of the target they came from."""
    if not pairs or pairs[0][0] not in targets:
        return []
    d = targets[pairs[0][0]]
    per = [series(d.samples, attr, dev, spark) for t, dev in pairs if t == d.target]
    out: list[float | None] = []
    for values in zip(*per, strict=True):
        known = [v for v in values if v is not None]
        out.append(None if not known else sum(known) / len(known) if mean else sum(known))
    return out


Joined = tuple[list[TargetView], DeviceReadings | None]


def join(targets: Sequence[TargetData], local: LocalScan | None, host: str | None,
         all_chips: bool = False) -> Joined:
    """The targets' views and the chips joined with them (None: no chips
    scanned); the Processes panel's chip owners come from the same join."""
    views = [view_of(d) for d in targets]
    return views, (device_readings(views, local, host, all_chips) if local and local.chips
                   else None)


def subtitle(hidden: int, estimated: bool) -> str:
    """The panel's subtitle: what ``~`` means, and how many chips are not listed."""
    parts = ["~: hook's estimate"] if estimated else []
    if hidden:  # the whole line (which nodes are missing) is in the tooltip
        parts.append(f"{hidden} more TPU chip{'s' if hidden != 1 else ''} not usable "
                     "here (--all)")
    return " · ".join(parts)


class DevicesPanel(LiveTable):
    """This host's chips and every other device, with HBM and busy-% history."""

    DEFAULT_CSS = """
    DevicesPanel { height: auto; max-height: 40%; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor=False, **kwargs)
        self.border_title = "Devices"
        self._shape: tuple[object, ...] | None = None

    def _layout(self, labels: list[str], width: int,
                chips: bool) -> tuple[bool, int, list[tuple[str, str, int]]]:
        wide = width >= WIDE
        dev_w = max([8] + [len(x) for x in labels])
        fixed = [("device", "Device", dev_w)]
        if wide or chips:  # a chip's owner is part of the row, however narrow
            fixed.append(("owner", "Owner", OWNER_W if wide else 12))
        fixed += [("hbm", "HBM used/total", 16), ("pct", "HBM %", BAR_CELLS + 5)]
        tail = [("busy", "Busy", 5)]
        n_spark = 2 if wide else 1
        used = sum(w for *_, w in fixed + tail) + 2 * (len(fixed) + len(tail) + n_spark - 1)
        room = max(8, width - 1 - used)
        spark = room // n_spark
        cols = fixed + [("hbm_hist", "HBM history", spark)] + tail
        if wide:
            cols.append(("busy_hist", "Busy history", room - spark))
        return wide, spark, cols

    def show(self, targets: Sequence[TargetData], selected: str | None, palette: Palette,
             local: LocalScan | None = None, all_chips: bool = False,
             host: str | None = None, joined: Joined | None = None) -> None:
        """Brings every cell up to date with ``targets`` and the host scan
        ``local`` (``joined``: :func:`join` of them, when the caller has it)."""
        views, devs = joined or join(targets, local, host, all_chips)
        by_name = {d.target: d for d in targets}
        rows: list[tuple[str, tuple[ChipUsage, DeviceRow] | tuple[TargetData, DeviceRow]]] = []
        labels: list[str] = []
        for u, row in zip(devs.listed, devs.chips, strict=True) if devs else ():
            rows.append((f"chip|{u.chip.name}", (u, row)))  # a chip: its own row
            labels.append(u.chip.name)
        multi = sum(1 for d in targets if d.snapshot is not None) > 1
        for d, v in zip(targets, views, strict=True):
            if d.snapshot is None:
                continue
            pid = d.snapshot.process.pid if d.snapshot.process else None
            for dev in devs.shown(v) if devs else d.snapshot.devices:
                rows.append((f"{d.target}|{dev.id}", (d, device_row(v, dev))))
                name = f"{dev.platform}:{dev.id}"
                labels.append(f"{pid}/{name}" if multi and pid else name)
        sel = next((d for d in targets if d.target == selected and d.samples), None)
        wide, spark, cols = self._layout(labels, self.scrollable_content_region.width or 80,
                                         bool(devs and devs.chips))
        shape = (tuple(r[0] for r in rows), tuple(cols), sel is not None, palette)
        if shape != self._shape:
            self._shape = shape
            self.reset(cols)
        missing: list[tuple[str, str]] = []
        estimated = False
        for (key, (what, row)), label in zip(rows, labels, strict=True):
            if isinstance(what, ChipUsage):
                cells = self._chip(what, row, by_name, spark, palette, missing)
            else:
                dev_id = int(key.rpartition("|")[2])
                cells = self._row(what, dev_id, row, label, spark, palette, missing)
            estimated = estimated or row.busy_estimated
            self.put_row(key, cells)
        tip = reasons_tip(missing)
        notes = "\n".join(clean(n, 300) for n in devs.notes) if devs else ""
        tip = "\n".join(x for x in (tip, notes) if x) or None
        if tip != self.tooltip:
            self.tooltip = tip
        sub = subtitle(len(devs.usage) - len(devs.listed) if devs else 0, estimated)
        if sub != self.border_subtitle:
            self.border_subtitle = sub
        if sel is not None:
            marks = [s.compiles for s in itertools.islice(reversed(sel.samples), spark)][::-1]
            cells = {"device": Text("compiles", style=palette.muted),
                     "hbm_hist": Text(timeline(marks, spark), style=palette.warn),
                     "busy_hist": Text(timeline(marks, spark), style=palette.warn)}
            self.put_row(EVENTS_ROW, cells)

    def _cells(self, label: str, owner: str, row: DeviceRow, hbm_hist: list[float | None],
               busy_hist: list[float | None], spark: int, palette: Palette, dim: str,
               missing: list[tuple[str, str]]) -> dict[str, object]:
        """One row's cells: a chip's or a process's device, drawn alike."""
        missing += row.na
        used, total = row.hbm_used.value, row.hbm_total.value
        pct: object = (bar(row.hbm_percent.value, palette) if row.hbm_percent.value is not None
                       else Text(NA, palette.muted))
        busy = row.busy.value
        never = used is None and all(v is None for v in hbm_hist)  # then say why
        hbm_text = (clean(row.hbm_used.reason, 200) if never
                    else sparkline(hbm_hist, spark, hi=float(total) if total else None))
        return {
            "device": Text(clean(label, 24), style=dim),
            "owner": Text(clean(owner, 40), style=dim, no_wrap=True, overflow="ellipsis"),
            "hbm": Text(_gib(used, total), style=dim),
            "pct": pct,
            "hbm_hist": Text(hbm_text, style=dim or (palette.muted if never else palette.accent),
                             no_wrap=True, overflow="ellipsis"),
            "busy": Text(_busy(row), style=dim if busy is not None else palette.muted),
            "busy_hist": Text(sparkline(busy_hist, spark, hi=100.0) if busy is not None
                              else clean(row.busy.reason, 200),
                              style=dim or (palette.ok if busy is not None else palette.muted),
                              no_wrap=True, overflow="ellipsis"),
        }

    def _chip(self, u: ChipUsage, row: DeviceRow, targets: dict[str, TargetData], spark: int,
              palette: Palette, missing: list[tuple[str, str]]) -> dict[str, object]:
        """A local chip: its owner, and its history from the devices joined to it."""
        hbm_from = (u.libtpu_devices if u.hbm_source == HBM_LIBTPU
                    else u.hook_devices if u.hbm_source == HBM_HOOK else ())
        busy_from = (u.hook_devices if u.busy_from_hook
                     else u.libtpu_devices if u.busy_source == BUSY_LIBTPU else ())
        src = targets.get(hbm_from[0][0]) if hbm_from else None
        dim = palette.muted if src is not None and not src.connected else ""
        return self._cells(u.chip.name, row.owners.text(), row,
                           _joined(targets, hbm_from, "hbm_used", spark, mean=False),
                           _joined(targets, busy_from, "busy", spark, mean=True),
                           spark, palette, dim, missing)

    def _row(self, d: TargetData, dev_id: int, row: DeviceRow, label: str, spark: int,
             palette: Palette, missing: list[tuple[str, str]]) -> dict[str, object]:
        """A device of one process's (no local chip shows it)."""
        return self._cells(label, row.owners.text(), row,
                           series(d.samples, "hbm_used", dev_id, spark),
                           series(d.samples, "busy", dev_id, spark),
                           spark, palette, "" if d.connected else palette.muted, missing)
