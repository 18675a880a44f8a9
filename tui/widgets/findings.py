"""Findings: problems in plain words for the picked process, costliest first,
one line each so the top one is always in view (targets that cannot be read
come above them), with its cost per step (or in all when steps are unknown;
``~`` marks an estimate). Enter (or ``f`` from any panel) opens the finding's
detail: its source line, its history and the advice. The words, levels,
ranking and costs are the CLI's (:func:`tpu_info.views.findings.find`,
:class:`tpu_info.views.derived.FindingLine`), computed over every event the
target sent (:class:`tui.state.TargetData`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import tzinfo

from rich.text import Text
from textual.message import Message

from tpu_info.contract.model import Severity
from tpu_info.views.derived import finding_line
from tpu_info.views.values import TargetView, clean, no_findings_text
from tui.source import Conn
from tui.state import TargetData
from tui.widgets.common import Palette, hms
from tui.widgets.table import LiveTable

COLUMNS = [("level", "", 4), ("cost", "Cost", 17), ("text", "Finding", None)]
COST_CELLS = (4, 17)  # the cost column fits its longest cell, within these
NONE_ROW = "~none"  # the line that says there is nothing (finding ids never start with ~)
DOWN = "~down:"  # rows of targets that cannot be read


class FindingsPanel(LiveTable):
    """What looks wrong, worst first."""

    DEFAULT_CSS = """
    FindingsPanel { height: auto; max-height: 8; }
    """

    class Opened(Message):
        """Enter on a finding: show its detail screen."""

        def __init__(self, target: str, finding_id: str) -> None:
            super().__init__()
            self.target = target
            self.finding_id = finding_id

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor=True, **kwargs)
        self.border_title = "Findings"
        self._key: object = None
        self.target: str | None = None

    def show(self, targets: Sequence[TargetData], selected: TargetData | None,
             palette: Palette, tz: tzinfo | None) -> None:
        """Redraws only when the findings or a target's state changed."""
        key = (tuple((d.target, d.state, d.since_unix, d.error, d.retry_in_s) for d in targets),
               selected.target if selected else None,
               tuple(selected.findings) if selected else (), palette,
               selected is not None and selected.snapshot is not None)
        if key == self._key:
            return
        rows = self._rows(targets, selected, palette, tz)
        cost_w = max([COST_CELLS[0], *(len(str(r.get("cost", ""))) for r in rows.values())])
        columns = [(k, label, min(cost_w, COST_CELLS[1]) if k == "cost" else w)
                   for k, label, w in COLUMNS]
        if (self._key is None or key[1] != self._key[1]  # type: ignore[index]
                or columns != self._lt_columns):
            self.reset(columns)  # another process, or a wider cost: rows again, cursor on top
        self._key = key
        self.target = selected.target if selected else None
        for k in [k for k in self.row_keys if k not in rows]:
            self.drop_row(k)
        for k, cells in rows.items():
            self.put_row(k, cells)
        order = {k: i for i, k in enumerate(rows)}
        self.order(lambda k: order[k])
        if not self.user_moved:  # the cursor follows the costliest until moved
            self.move_cursor(self._top())

    def _rows(self, targets: Sequence[TargetData], selected: TargetData | None,
              palette: Palette, tz: tzinfo | None) -> dict[str, dict[str, object]]:
        """Unreadable targets first, then the picked process's findings."""
        style = {Severity.WARNING.label: palette.warn, Severity.INFO.label: palette.accent,
                 Severity.ERROR.label: palette.bad}
        rows: dict[str, dict[str, object]] = {}
        for d in targets:
            if d.state is Conn.DISCONNECTED:
                since = f" since {hms(d.since_unix, tz)}" if d.since_unix is not None else ""
                retry = f"; retrying in {d.retry_in_s:g}s (r: now)" if d.retry_in_s else ""
                rows[DOWN + d.target] = {
                    "level": Text(Severity.ERROR.label, style=style[Severity.ERROR.label]),
                    "text": f"{clean(d.target, 60)} disconnected{since}: {clean(d.error)}{retry}"}
        if selected is not None:
            for fid, x in zip(selected.finding_ids, selected.findings, strict=False):
                f = finding_line(x, selected.target)
                rows[fid] = {"level": Text(f.level, style=style.get(f.level, palette.accent)),
                             "cost": Text(f.cost, style=palette.muted),
                             "text": Text(f.text + (f" [{f.at}]" if f.at else ""))}
        if not rows:
            if selected is None or selected.snapshot is None:
                said = "nothing read yet"
            else:
                said = no_findings_text([TargetView(selected.target, selected.snapshot)])
            rows[NONE_ROW] = {"text": Text(said, style=palette.muted)}
        return rows

    def plain_rows(self) -> list[str]:
        """Each row as plain text, not cut to the panel's width: level, cost and
        the whole finding, in the order shown."""
        out = []
        for k in self.row_keys:
            cells = [self.get_cell(k, c) for c, _, _ in COLUMNS]
            out.append("  ".join(str(c.plain if isinstance(c, Text) else c) for c in cells))
        return out

    def _top(self) -> int:
        """The row of the costliest finding (below the unreadable targets)."""
        return next((i for i, k in enumerate(self.row_keys) if not k.startswith("~")), 0)

    def open_cursor(self) -> None:
        """Opens the detail of the finding under the cursor (the costliest at first)."""
        key = self.cursor_key
        if key is None or key.startswith("~"):
            self.move_cursor(self._top())
        self.action_select()

    def on_live_table_selected(self, event: LiveTable.Selected) -> None:
        event.stop()
        if self.target is not None and not event.key.startswith("~"):
            self.post_message(self.Opened(self.target, event.key))
