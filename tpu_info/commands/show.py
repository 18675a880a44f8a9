"""``tpu-info``'s default view: one look, or one every interval (``--streaming``, ``-l S``).

Four forms, one per look: the tables (``-p``, ``--metric`` narrow them),
the ``tpu-info/v1`` JSON document (``--json``; one document per line, NDJSON,
when streaming), CSV rows of named fields (``--query ... --format csv``, and
nvidia-smi's ``--query-gpu``/``--query-compute-apps``) and every detail of
each device (``-q``, as nvidia-smi's). ``-i``/``--only`` select the chips,
``--pid``/``--user`` the processes (nvitop's), in every form.
Streaming to a terminal redraws the tables in place; to a pipe or a file it
appends one frame per interval and flushes it, as ``nvidia-smi -l`` does.
JSON and CSV always append. Ctrl-C ends a stream with exit code 0.

Example:
    >>> Mode(form="csv").appends(terminal=True)
    True
    >>> Mode(form="table").appends(terminal=True)
    False
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpu_info.commands.gather import Gathered

EXIT_OK = 0
EXIT_PARTIAL = 1

EMPTY = ("No accelerator and no hooked process found. Run `tpu-info doctor` to see why, or "
         "start a program with `tpu-info run -- python ...`.")


@dataclass(frozen=True)
class Mode:
    """What the view prints: ``form`` is ``table``, ``json``, ``csv`` or ``detail`` (``-q``)."""

    form: str = "table"
    streaming: bool = False
    interval: float = 1.0

    def appends(self, terminal: bool) -> bool:
        """True when each look is appended (a pipe, a file, JSON or CSV)."""
        return self.form != "table" or not terminal


def _header(g: Gathered) -> Any:
    from tpu_info.host import devices
    from tpu_info.views.values import Header

    return Header.now(accelerator_type=devices.accelerator_type(g.local))


def renderable(args: argparse.Namespace, g: Gathered, width: int) -> Any:
    """The tables of one look, sized for ``width`` columns."""
    from rich.console import Group

    from tpu_info.outputs import render

    if args.metrics or args.process:
        from tpu_info.commands.libtpu_reads import reads
        from tpu_info.outputs.metric_tables import metric_table
        from tpu_info.views.metrics import DEFAULT_PERCENTILES

        # Google's names that only libtpu serves: asked of libtpu now, once a look
        libtpu = reads([name for name, _ in args.metrics or ()], g.views, args.timeout)
        parts: list[Any] = ([metric_table(name, g.views, cols or DEFAULT_PERCENTILES, libtpu)
                             for name, cols in args.metrics] if args.metrics
                            else [render.processes_table(_readings(args, g), render.Reasons(),
                                                         width)])
        if args.streaming or args.loop is not None:  # each frame says when it was taken
            from rich.text import Text

            h = _header(g)
            parts.insert(0, Text(f"{h.host}   {h.time_text()}", style="dim"))
        return Group(*parts)
    return Group(*render.sections(_readings(args, g), g.views, width))


def _all(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "all_chips", False))


def _only(args: argparse.Namespace) -> frozenset[str] | None:
    """The chips ``-i`` selected (:func:`select`), or None: every chip."""
    return getattr(args, "only", None)


def _picked(args: argparse.Namespace) -> Any:
    """The processes ``--pid`` and ``--user`` keep (a ProcessPick; inactive when neither)."""
    from tpu_info.views.selection import ProcessPick

    return ProcessPick.of(getattr(args, "pids", None), getattr(args, "users", None))


def _ids_flag(args: argparse.Namespace) -> str:
    return getattr(args, "ids_flag", None) or "-i"


def select(args: argparse.Namespace, g: Gathered) -> None:
    """Resolves ``-i`` (``--only``) against this look's chips into ``args.only``.

    Raises:
        ValueError: an id that names no chip listed here (one line).
    """
    if getattr(args, "ids", None):
        from tpu_info.views.device_rows import pick_chips

        args.only = pick_chips(g.local, args.ids, _all(args), _ids_flag(args))


def device_list(args: argparse.Namespace, scan: Any) -> tuple[list[str], str]:
    """``-L``: a line per chip the Devices table lists (``--all``: every one;
    ``-i``: those), nvidia-smi's way (``TPU 3: TPU v5e (/dev/vfio/0, PCI
    0000:00:0b.0)``, numbered as the table names it), and why there are none
    ("" when there are)."""
    from tpu_info.views.device_rows import pick_chips

    only = (pick_chips(scan, args.ids, _all(args), _ids_flag(args))
            if getattr(args, "ids", None) else None)
    lines = []
    for c in scan.chips:
        if not (_all(args) or c.usable) or (only is not None and c.name not in only):
            continue
        kind = f"TPU {c.kind}" if c.vendor == "tpu" else c.kind
        where = ", ".join(x for x in (c.device_path, c.pci_address and f"PCI {c.pci_address}",
                                     "" if c.usable else "not usable here") if x)
        lines.append(f"{c.name[:3].upper()} {c.index}: {kind}" + (f" ({where})" if where else ""))
    if lines:
        return lines, ""
    if n := len(scan.chips):
        return [], (f"{n} TPU chip{'s' if n != 1 else ''} on this host, none usable here; "
                    f"--all lists {'them' if n != 1 else 'it'}")
    return [], "no accelerator found on this host (tpu-info doctor says why)"


def _readings(args: argparse.Namespace, g: Gathered) -> Any:
    """The run's readings with the local chips and their owners (``-p`` lists
    every process that holds a chip, hooked or not), as ``-i``, ``--pid`` and
    ``--user`` select them."""
    from tpu_info.views.derived import readings

    run = readings(g.views, local=g.local, header=_header(g), all_chips=_all(args),
                   only=_only(args))
    return _picked(args).apply(run)


def json_text(g: Gathered, indent: int | None, only: frozenset[str] | None = None,
              procs: Any = None) -> str:
    """One look as the ``tpu-info/v1`` document (one line when ``indent`` is None;
    ``only``: the chips ``-i`` selected; ``procs``: the processes ``--pid`` and
    ``--user`` keep, a ProcessPick)."""
    from tpu_info.outputs.jsonview import dumps, to_json

    doc = to_json(g.views, local=g.local, header=_header(g), only=only, procs=procs)
    doc["notes"] = [{"where": w, "reason": r} for w, r in g.notes]
    return dumps(doc, indent=indent)


class _Csv:
    """CSV lines of ``--query`` fields; the header once, before the first look."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.fields, self.fmt = args.query_fields, args.csv_format
        self.per = getattr(args, "query_rows", None)  # --query-gpu: devices; -compute-apps
        self.header_due = self.fmt.header

    def lines(self, g: Gathered) -> list[str]:
        from tpu_info.outputs import query

        out = [query.header_line(self.fields, self.fmt)] if self.header_due else []
        self.header_due = False
        run = _readings(self.args, g)
        return out + query.csv_lines(run, self.fields, self.fmt, self.per)


def _write(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()  # a pipe sees every look when it is taken


def show(args: argparse.Namespace, mode: Mode, look: Callable[[], Gathered],
         say: Callable[[object], None]) -> int:
    """Prints ``look()`` once, or every ``mode.interval`` seconds until Ctrl-C.

    ``look`` takes one look (its own ``--timeout``); ``say`` prints one error
    line. Returns the exit code: 1 when a named target failed (one look).
    """
    from tpu_info.outputs.console import make_console

    csv = _Csv(args) if mode.form == "csv" else None
    console: Any = None

    def frame(g: Gathered) -> None:
        if csv is not None:
            if lines := csv.lines(g):  # no row (no process to list): nothing, as nvidia-smi
                _write("\n".join(lines))
        elif mode.form == "json":
            _write(json_text(g, indent=None if mode.streaming else 2, only=_only(args),
                             procs=_picked(args)))
        elif mode.form == "detail":
            from tpu_info.outputs.detail import detail_text

            _write(detail_text(_readings(args, g)))
        elif not mode.streaming and not g.views and not g.local.chips and not args.metrics:
            console.print(EMPTY)
        else:
            console.print(renderable(args, g, console.width))
            if mode.streaming:
                console.print()
            sys.stdout.flush()

    def tables() -> Any:
        """The console (rich) for the tables; JSON, CSV and -q are written without it."""
        return make_console(args.no_color) if mode.form == "table" else None

    if not mode.streaming:
        g = look()  # first: the console (rich) is made while the targets answer
        console = tables()
        frame(g)
        for v in g.failed:
            say(v.error if v.error.startswith(f"{v.target}: ") else f"{v.target}: {v.error}")
        return EXIT_PARTIAL if g.failed else EXIT_OK
    console = tables()
    try:
        if console is None or mode.appends(console.is_terminal):
            while True:
                frame(look())
                time.sleep(mode.interval)
        from rich.live import Live

        with Live(console=console, auto_refresh=False, screen=False) as live:
            while True:
                live.update(renderable(args, look(), console.width), refresh=True)
                time.sleep(mode.interval)
    except KeyboardInterrupt:
        return EXIT_OK
