"""Finished runs: ``tpu-info runs``, ``tpu-info diff A B`` and ``--from FILE``.

A saved run (:mod:`tpu_info.wire.runfile`) is read as a live answer would
be: ``--from FILE`` gives the table, ``--json``, ``--query``, ``report``,
``doctor`` and ``--watch`` one target whose snapshot is the file's.
``runs`` lists the saved runs of this user's runtime directory, newest
first. ``diff`` compares two runs (files or live targets,
:mod:`tpu_info.views.diff`) and, with ``--fail-on``, exits
:data:`EXIT_CONDITION` (1) when a condition holds, so a benchmark job fails
on a pull request that adds a recompile.

Exit codes (``diff``'s, as diff(1)'s): 0 no ``--fail-on`` condition held; 1 one
held; 2 trouble: usage, or a run could not be read (one line on stderr).
``--from`` and ``runs``: 1 when the file cannot be read, as a target that failed.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tpu_info.contract.discovery_record import runtime_dir
from tpu_info.contract.model import Snapshot
from tpu_info.contract.safe import clean
from tpu_info.wire import runfile

EXIT_OK, EXIT_CONDITION, EXIT_USAGE = 0, 1, 2
EXIT_UNREADABLE = 2  # diff: trouble, apart from a condition that held
RUNS_DIR = runfile.RUNS_DIR
MAX_LISTED = 200


def runs_folder() -> Path:
    """Where the hook saves runs by default."""
    return runtime_dir() / RUNS_DIR


def saved_path(spec: str) -> str:
    """``spec`` as a file: a bare name that is not here but is in the runs
    folder (what ``tpu-info runs`` shows on a narrow terminal) is that file."""
    if os.path.exists(spec) or os.sep in spec:
        return spec
    listed = runs_folder() / spec
    return str(listed) if listed.is_file() else spec


def load(spec: str, timeout: float) -> tuple[str, Snapshot, runfile.SavedRun | None]:
    """A run by file path, or a live target (``HOST:PORT``, ``unix:PATH``) read now.

    Raises:
        runfile.RunFileError: the file is not a readable saved run.
        TpuInfoError: the live target could not be read.
    """
    from tpu_info.net.targets import is_unix

    if not is_unix(spec) and (os.path.exists(spec) or os.sep in spec
                              or spec.endswith(runfile.SUFFIX)):
        run = runfile.read(saved_path(spec))
        return spec, run.snapshot, run
    from tpu_info.net.client import Client

    with Client(spec, timeout=timeout) as c:
        return spec, c.snapshot(), None


def gathered(path: str):  # type: ignore[no-untyped-def]
    """One look at a saved run, as :func:`tpu_info.commands.gather.gather`
    gives a live one: one target (the file) whose snapshot is the run's.

    Raises:
        runfile.RunFileError: the file is not a readable saved run.
    """
    from tpu_info.commands.gather import Gathered
    from tpu_info.contract.model import LocalScan
    from tpu_info.views.values import TargetView

    run = runfile.read(saved_path(path))
    note = (f"saved run {os.path.basename(path)}",
            f"read from a file: the program ended ({run.how_it_ended()}) at "
            f"{_when(run.ended_unix)}; the values are its last ones")
    return Gathered([TargetView(os.path.basename(path), run.snapshot)],
                    LocalScan(reasons={"saved": "a saved run: this host's accelerators are "
                                                "not scanned"}),
                    notes=[note])


def _saved_runs(folder: Path) -> list[runfile.SavedRun | tuple[Path, str]]:
    paths = []
    try:
        for p in folder.glob(f"*{runfile.SUFFIX}"):
            try:
                paths.append((p.stat().st_mtime, p))
            except OSError:
                continue
    except OSError:
        return []
    out: list[runfile.SavedRun | tuple[Path, str]] = []
    for _, p in sorted(paths, reverse=True)[:MAX_LISTED]:
        try:
            out.append(runfile.read(p))
        except runfile.RunFileError as e:
            out.append((p, str(e)))
    return out


def _when(unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix)) if unix > 0 else "-"


def still_running(run: runfile.SavedRun, host: str | None = None) -> bool:
    """Whether the program a checkpoint (ended "") was saved from still runs:
    its pid is alive on this host and that process started before the run's
    hook did (a younger process that reused the pid started after the
    checkpoint; the start is read from /proc, a second early at most)."""
    from tpu_info.contract.discovery_record import process_start_unix
    from tpu_info.contract.safe import os_text

    s = run.snapshot
    p = s.process
    if run.ended or p is None or p.pid <= 0 or not p.start_time_unix:
        return False
    if p.host != (os_text(socket.gethostname()) if host is None else host):
        return False  # a run copied from another host
    try:
        os.kill(p.pid, 0)
    except PermissionError:
        pass
    except OSError:
        return False
    try:
        started = process_start_unix(p.pid)
    except Exception:  # noqa: BLE001 - gone meanwhile, or no /proc: cannot tell
        return False
    return started <= min(p.start_time_unix, s.taken_at_unix or p.start_time_unix) + 1.0


def _run_row(run: runfile.SavedRun) -> dict[str, object]:
    from tpu_info.views.findings import find

    s = run.snapshot
    p = s.process
    start = p.start_time_unix if p is not None and p.start_time_unix else (
        s.taken_at_unix - s.uptime_seconds)
    found = find(s)
    return {
        "file": run.path, "program": clean(p.name, 60) if p is not None else "?",
        "pid": p.pid if p is not None else None, "engine": p.engine if p is not None else "",
        "start": _when(start), "end": _when(run.ended_unix or s.taken_at_unix),
        "ended": runfile.RUNNING if still_running(run) else run.how_it_ended(),
        "steps": s.steps.count if s.steps is not None else None,
        "findings": len(found),
        "warnings": sum(1 for f in found if f.severity == "warning"),
    }


def runs_command(args: argparse.Namespace, say: Callable[[object], None]) -> int:
    """``tpu-info runs``: the saved runs, newest first."""
    folder = Path(args.runs_dir) if getattr(args, "runs_dir", None) else runs_folder()
    listed = _saved_runs(folder)
    rows = [_run_row(r) for r in listed if isinstance(r, runfile.SavedRun)]
    bad = [(str(p), why) for p, why in (r for r in listed if isinstance(r, tuple))]
    if args.json:
        from tpu_info.outputs.jsonview import dumps

        print(dumps({"schema": "tpu-info-runs/v1", "folder": str(folder), "runs": rows,
                     "unreadable": [{"file": f, "why": w} for f, w in bad]}))
        return EXIT_OK
    if not rows and not bad:
        print(f"No saved runs in {folder}. A program run with the hook saves one when it "
              "ends (TPU_INFO_SAVE chooses where).")
        return EXIT_OK
    from tpu_info.outputs.console import make_console
    from tpu_info.outputs.saved_runs import runs_table

    make_console(getattr(args, "no_color", False)).print(runs_table(rows, clean(str(folder))))
    sys.stdout.flush()
    if bad:  # one line, however many: the first says why, --json lists them all
        more = f" (and {len(bad) - 1:,} more; --json lists them)" if len(bad) > 1 else ""
        say(f"skipped {len(bad):,} unreadable file(s): {bad[0][1]}{more}")
    return EXIT_OK


def diff_command(args: argparse.Namespace, say: Callable[[object], None]) -> int:
    """``tpu-info diff A B [--json] [--fail-on CONDS]``."""
    from tpu_info.contract.errors import TpuInfoError
    from tpu_info.views import diff

    try:
        conditions = diff.parse_conditions(args.fail_on) if args.fail_on else []
    except ValueError as e:
        say(e)
        return EXIT_USAGE
    loaded = []
    for spec in (args.run_a, args.run_b):
        try:
            loaded.append(load(spec, args.timeout))
        except TpuInfoError as e:
            say(e)
            return EXIT_UNREADABLE
    (name_a, a, _), (name_b, b, _) = loaded
    c = diff.compare(a, b)
    checks = diff.failed(conditions, c)
    if args.json:
        from tpu_info.outputs.jsonview import dumps

        print(dumps({
            "schema": "tpu-info-diff/v1", "a": name_a, "b": name_b,
            # kind: "rate" (judged: worse says so) or "total" (grows with the
            # run's length: worse is null, never judged)
            "rows": [{"key": r.key, "label": r.label, "a": r.a, "b": r.b, "unit": r.unit,
                      "kind": r.kind, "change": r.change, "relative": r.relative,
                      "worse": r.worse() if r.judged else None}
                     for r in c.rows],
            "lengths": c.length_words() or None,
            "new_graphs": c.new_graphs, "gone_graphs": c.gone_graphs,
            "new_causes": c.new_causes, "new_findings": c.new_findings,
            "gone_findings": c.gone_findings,
            "fail_on": [{"condition": w, "held": h} for h, w in checks]}))
    else:
        from tpu_info.outputs.console import folded_stdout

        with folded_stdout():  # a terminal's width: long lines fold; a pipe's stay whole
            _print_diff(name_a, name_b, c, checks)
    return EXIT_CONDITION if any(h for h, _ in checks) else EXIT_OK


def _print_diff(name_a: str, name_b: str, c: object, checks: list[tuple[bool, str]]) -> None:
    from tpu_info.views import diff

    assert isinstance(c, diff.Comparison)
    w = max(len(r.label) for r in c.rows)
    print(f"A: {clean(name_a, 200)}\nB: {clean(name_b, 200)}")
    lengths = c.length_words()
    if lengths:
        print(f"{lengths}: compare the rates; the totals follow the runs' lengths.")
    for title, rows in (("Rates (per step, per second: the same for a run of any length; "
                         "judged better or worse)", c.rates),
                        ("Totals (grow with the run's length: shown, not judged)", c.totals)):
        print(f"\n{title}\n{'':{w}}  {'A':>12}  {'B':>12}  change")
        for r in rows:
            mark = "  (worse)" if r.worse() else ""
            print(f"{r.label:{w}}  {diff.fmt(r.a, r.unit):>12}  {diff.fmt(r.b, r.unit):>12}  "
                  f"{r.change_words()}{mark}")
    sections = (("New graphs in B (by function and input signature)", c.new_graphs),
                ("Graphs only in A", c.gone_graphs),
                ("Recompile causes new in B", c.new_causes),
                ("Findings new in B", c.new_findings),
                ("Findings gone in B", c.gone_findings))
    for title, items in sections:
        if items:
            print(f"\n{title}:")
            for item in items[:50]:
                print(f"  {clean(item, 200)}")
            if len(items) > 50:
                print(f"  ... and {len(items) - 50} more")
    if checks:
        print("\n--fail-on:")
        for held, words in checks:
            print(f"  {'FAIL' if held else 'ok  '}  {clean(words, 200)}")
    sys.stdout.flush()


def summaries_since(folder: Path, started_unix: float, pid: int | None = None,
                    most: int = 4, kept: bool = True, status: int | None = None) -> list[str]:
    """The end-of-run summaries of the runs saved in ``folder`` since
    ``started_unix`` by programs that started since (``pid``'s own first,
    when it saved one; a worker it started next): what ``tpu-info run``
    prints after its child ended (``status``: the child's exit status, which
    its own run says when it ended by exiting). A program that started
    before (another of the user's, ending meanwhile) is not the child's."""
    from tpu_info.outputs.summary import summary

    found = []
    try:
        for p in folder.glob(f"*{runfile.SUFFIX}") if folder.is_dir() else [folder]:
            try:
                mtime = p.stat().st_mtime
            except OSError:
                continue
            if mtime >= started_unix - 1.0:
                mine = pid is not None and f"-{pid}-" in p.name
                found.append((not mine, -mtime, p))
    except OSError:
        return []
    out = []
    for other, _, p in sorted(found):
        if len(out) >= most:
            break
        try:
            run = runfile.read(p)
        except runfile.RunFileError as e:
            out.append(f"tpu-info: {e}")
            continue
        proc = run.snapshot.process
        if other and proc is not None and proc.start_time_unix \
                and proc.start_time_unix < started_unix - 1.0:
            continue  # a program that ran already (it only ended since): not the child's
        if pid is not None and proc is not None and proc.pid == pid:
            run = run.with_exit_code(status)
        out.append(summary(run.snapshot, run.how_it_ended(), str(p) if kept else ""))
    return out
