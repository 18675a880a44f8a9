"""Findings: problems in plain words for the picked process, costliest first
(each with its cost per step, or in all when steps are unknown; ``~`` marks an
estimate), plus one line per target that cannot be read. The words, levels and
costs are the CLI's (:class:`tpu_info.views.derived.FindingLine`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import tzinfo

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from tpu_info.contract.model import Severity
from tpu_info.views.derived import finding_line
from tpu_info.views.values import TargetView, clean, no_findings_text
from tui.source import Conn
from tui.state import TargetData
from tui.widgets.common import Palette, hms


def findings_table(targets: Sequence[TargetData], selected: TargetData | None,
                   palette: Palette, tz: tzinfo | None) -> Table | Text:
    """Unreadable targets first, then the picked process's findings."""
    style = {Severity.WARNING.label: palette.warn, Severity.INFO.label: palette.accent,
             Severity.ERROR.label: palette.bad}
    t = Table(box=None, show_header=False, pad_edge=False, padding=(0, 1), expand=True)
    t.add_column("level", no_wrap=True, width=4)
    t.add_column("cost", no_wrap=True, min_width=4, max_width=18)
    t.add_column("finding", ratio=1, overflow="fold")
    n = 0
    for d in targets:
        if d.state is Conn.DISCONNECTED:
            since = f" since {hms(d.since_unix, tz)}" if d.since_unix is not None else ""
            retry = f"; retrying in {d.retry_in_s:g}s (r: now)" if d.retry_in_s else ""
            t.add_row(Text(Severity.ERROR.label, style=style[Severity.ERROR.label]), "",
                      f"{clean(d.target, 60)} disconnected{since}: {clean(d.error)}{retry}")
            n += 1
    if selected is not None:
        for f in (finding_line(x, selected.target) for x in selected.findings):
            t.add_row(Text(f.level, style=style.get(f.level, palette.accent)),
                      Text(f.cost, style=palette.muted),
                      Text(f.text + (f" [{f.at}]" if f.at else "")))
            n += 1
    if not n:
        if selected is None or selected.snapshot is None:
            return Text("nothing read yet", style=palette.muted)
        said = no_findings_text([TargetView(selected.target, selected.snapshot)])
        return Text(said, style=palette.muted)
    return t


class FindingsPanel(Static):
    """What looks wrong, worst first."""

    DEFAULT_CSS = """
    FindingsPanel { height: auto; max-height: 12; }
    """

    can_focus = True

    def __init__(self, **kwargs: object) -> None:
        super().__init__("", **kwargs)  # type: ignore[arg-type]
        self.border_title = "Findings"
        self._key: object = None
        self._lines = -1

    def show(self, targets: Sequence[TargetData], selected: TargetData | None,
             palette: Palette, tz: tzinfo | None) -> None:
        """Redraws only when the findings or a target's state changed."""
        key = (tuple((d.target, d.state, d.since_unix, d.error, d.retry_in_s) for d in targets),
               selected.target if selected else None,
               tuple(selected.findings) if selected else (), palette,
               selected is not None and selected.snapshot is not None)
        if key == self._key:
            return
        self._key = key
        content = findings_table(targets, selected, palette, tz)
        console = self.app.console
        width = max(1, self.size.width or 80)
        lines = len(console.render_lines(content, console.options.update_width(width),
                                         pad=False))
        self.update(content, layout=lines != self._lines)  # a layout pass only if it grew
        self._lines = lines
