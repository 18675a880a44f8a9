"""Issue 43, "Habits that just work": every one-shot view readable at 80
columns, and HBM used and busy % coloured by level.

What users saw before: ``-p`` cut Name to ``jax_mlp.…`` (docs/cli.md says
Name, Engine and Address stay whole), ``--metric tensorcore_utilization``
and ``sequencer_state_detailed`` drew columns zero cells wide and targets
as ``127.0.…`` (rich's own sizing, last resort: every column narrowed
alike), ``tpu-info runs`` was ~170 columns wide, and a 95 %-full HBM looked
like a 5 % one.

The unit tests lay the tables out in-process; the slow ones run the real
CLI against a real hooked JAX program (:data:`tests.hooked.PROGRAM`, saved
as ``jax_mlp.py``), a real libtpu gRPC server
(:class:`tests.fixtures.google_names.FakeLibtpuServer`) and a fixture v5e
sysfs tree, with ``COLUMNS=80`` into a pipe and on a real pty 80 columns
wide (rich asks the terminal then; plain text folds only there).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

from tests.conftest import ROOT
from tests.fixtures.google_names import GOOGLE_LIST, FakeLibtpuServer, sections
from tests.fixtures.snapshots import SCENARIOS, header
from tests.terminal import on_a_pty
from tpu_info.contract.model import (
    BUSY_FROM_LIBTPU,
    DeviceRecord,
    MemoryReading,
    ProcessRecord,
    Snapshot,
)
from tpu_info.outputs.console import fold
from tpu_info.outputs.metric_tables import metric_table
from tpu_info.outputs.render import render_text
from tpu_info.outputs.saved_runs import runs_table
from tpu_info.outputs.table_layout import Alt, Col, table
from tpu_info.views.values import TargetView

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
RED, YELLOW, GREEN = "\x1b[31m", "\x1b[33m", "\x1b[32m"
COLOUR = re.compile(r"\x1b\[(?:[0-9;]*;)?(?:3[0-7]|9[0-7]|38;)")  # a foreground colour


def widths(out: str) -> list[int]:
    return [cell_len(ANSI.sub("", line)) for line in out.splitlines()]


def printed(renderable: object, width: int = 80, color: bool = False) -> str:
    buf = StringIO()
    Console(file=buf, width=width, color_system="standard" if color else None,
            force_terminal=color, legacy_windows=False).print(renderable)
    return buf.getvalue()


# The layout, in-process ------------------------------------------------------------

def _process_view(name: str, target: str, busy: float | None = None, used: int = 0,
                  total: int = 16 << 30) -> TargetView:
    dev = DeviceRecord(id=0, platform="tpu", kind="TPU v5 lite",
                       memory=MemoryReading(used_bytes=used, limit_bytes=total,
                                            source="memory_stats"),
                       busy_percent=busy, busy_source=BUSY_FROM_LIBTPU if busy is not None else "",
                       busy_reason="" if busy is not None else "no duty cycle reported")
    return TargetView(target, Snapshot(10.0, ProcessRecord(pid=12719, name=name,
                                                           engine="jax 0.10.2"),
                                       devices=(dev,), uptime_seconds=16.0))


def test_minus_p_keeps_name_engine_and_address_whole_at_80():
    """Before: ``12719  jax_mlp.…  jax 0.10.2  127.0.0.1:44315 ...`` (81 cells
    wide with the name whole): Uptime gives way first now."""
    from tpu_info.outputs.render import processes_table

    out = printed(processes_table([_process_view("jax_mlp.py", "127.0.0.1:44315")]))
    assert max(widths(out)) <= 80, out
    assert "jax_mlp.py  jax 0.10.2  127.0.0.1:44315" in out and "…" not in out, out


def test_a_metric_table_never_draws_a_column_zero_cells_wide():
    """Before (rich's sizing): the device column vanished and both targets
    read ``127.0.…`` beside a long N/A reason."""
    views = [_process_view("a.py", "127.0.0.1:44315", busy=None),
             TargetView("127.0.0.1:8431", None, error="connection refused (is the hook "
                        "installed there?) " * 3)]
    for name in ("tensorcore_utilization", "duty_cycle_percent", "hbm_usage"):
        out = printed(metric_table(name, views))
        assert max(widths(out)) <= 80, out
        assert "127.0.0.1:44315" in out and "127.0.0.1:8431" in out, out
        assert "0 TPU v5 lite" in out, out  # the device column, whole
        assert "connection refused" in " ".join(out.split()), out  # the reason folds


@settings(max_examples=150, deadline=None)
@given(cells=st.lists(st.lists(st.text(st.characters(codec="utf-8", categories=["L", "N",
                                                                                  "P"]),
                                       max_size=40), min_size=5, max_size=5),
                      min_size=1, max_size=4),
       width=st.integers(min_value=20, max_value=160))
def test_any_cells_any_width_fit_and_keep_every_key_column_visible(cells, width):
    cols = [Col("PID", "right"), Col("Name", role="key", min=8), Col("Owner", role="text"),
            Col("Finding", role="wrap", min=10), Col("Chips", role="text", optional=1)]
    out = printed(table("T", cols, cells), width)
    assert max(widths(out)) <= width
    t = table("T", cols, cells).renderable(width)
    assert all(c.width is None or c.width >= 1 for c in t.columns)


def test_short_forms_are_taken_before_a_key_column_is_cut():
    cols = [Col("Name", role="key"), Col("Steps", "right")]
    row = ["train_the_big_model.py", Alt("10,561 (inferred: jit(step))", "~10,561")]
    assert "train_the_big_model.py  ~10,561" in printed(table("T", cols, [row]), 40)
    assert "10,561 (inferred: jit(step))" in printed(table("T", cols, [row]), 80)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.parametrize("metric", GOOGLE_LIST)
def test_every_google_metric_view_fits_80(name, metric):
    views, _ = SCENARIOS[name]()
    out = printed(metric_table(metric, views))
    assert max(widths(out)) <= 80, out
    assert not re.search(r"\d+\.\d+\.…", out), out  # a target is never cut at 80


def test_runs_at_80_show_each_file_by_its_name_whole():
    folder = "/run/user/1000/tpu-info/runs"
    rows = [{"file": f"{folder}/jax_mlp.py-12719-20261206T000546.tpurun",
             "program": "jax_mlp.py", "pid": 12719, "start": "2026-12-06 00:05:46",
             "end": "2026-12-06 00:05:48", "ended": "running (saved while running)",
             "steps": 200, "findings": 1},
            {"file": f"{folder}/train.py-2291-20261204T234031.tpurun", "program": "train.py",
             "pid": 2291, "start": "2026-12-04 23:40:31", "end": "2026-12-04 23:44:43",
             "ended": "ended without its exit work (SIGTERM or SIGKILL; saved while running)",
             "steps": 1200, "findings": 3}]
    narrow = printed(runs_table(rows, folder))
    assert max(widths(narrow)) <= 80, narrow
    assert "jax_mlp.py-12719-20261206T000546.tpurun" in narrow and folder in narrow
    assert "running" in narrow and "no exit work" in narrow and "…" not in narrow
    wide = printed(runs_table(rows, folder), 220)
    assert rows[1]["file"] in wide and rows[1]["ended"] in wide  # room: the long forms


def test_plain_text_folds_under_its_value_and_stays_whole_without_a_width():
    line = "  Percentiles: " + "; ".join(f"{p}%=012ms718.982us" for p in range(1, 10))
    folded = fold([line], 80)
    assert len(folded) > 1 and max(map(len, folded)) <= 80, folded
    assert all(x.startswith(" " * 15) and x[15] != " " for x in folded[1:]), folded
    finding = fold(["  - [per_step_sync] " + "word " * 30], 80)
    assert all(x.startswith("    word") for x in finding[1:]), finding
    assert fold([line], None) == [line]


def test_the_report_folds_at_a_width_and_keeps_torch_xlas_lines_without_one():
    from tests.tpu_info.outputs.test_textreport import GOLDEN, _snapshot
    from tpu_info.outputs.textreport import metrics_report

    assert metrics_report(_snapshot()) == GOLDEN
    narrow = metrics_report(_snapshot(), width=80)
    assert max(map(len, narrow.splitlines())) <= 80, narrow
    assert narrow != GOLDEN and " ".join(narrow.split()) == " ".join(GOLDEN.split())
    graphs = metrics_report(_snapshot(), width=40)  # a row and its name do not fit
    assert max(map(len, graphs.splitlines())) <= 40, graphs
    assert graphs.count("name: jit(train_step)") == 2 and "execs  name" not in graphs


# Colour by level --------------------------------------------------------------------

@pytest.mark.parametrize("used, busy, hbm_style, busy_style", [
    (0.05, 5.0, GREEN, GREEN), (0.5, 50.0, YELLOW, YELLOW), (0.95, 95.0, RED, RED),
    (0.85, 76.0, RED, RED), (0.79, 74.0, YELLOW, YELLOW)])
def test_hbm_and_busy_are_coloured_by_level(used, busy, hbm_style, busy_style):
    total = 16 << 30
    view = _process_view("a.py", "127.0.0.1:1", busy=busy, used=int(used * total))
    for width in (80, 160):  # the percentage, and the bar
        out = render_text([view], width, color=True, header=header())
        row = next(line for line in out.splitlines() if "127.0.0.1:1" in line
                   and "GiB" in line)
        assert f"{hbm_style}{used * 16:.2f} GiB / 16.00 GiB" in row, repr(row)
        assert re.search(re.escape(busy_style) + r" *" + f"{busy:.0f}%", row), repr(row)
        assert ANSI.sub("", row) in render_text([view], width, header=header())
    hbm = printed(metric_table("hbm_usage", [view]), color=True)
    assert hbm_style in hbm
    duty = printed(metric_table("duty_cycle_percent", [view]), color=True)
    assert f"{busy_style}{busy:.1f}%" in duty


def test_no_colour_without_a_terminal_or_with_no_color(monkeypatch):
    from tpu_info.outputs.console import make_console
    from tpu_info.outputs.table_layout import percent_text

    for env, flag in (({"FORCE_COLOR": "1", "NO_COLOR": "1"}, False),
                      ({"FORCE_COLOR": "1"}, True)):
        for k in ("FORCE_COLOR", "NO_COLOR"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        c = make_console(no_color=flag)
        c.file = StringIO()
        c.print(percent_text(95.0, (10, 80)), Text("x", style="bold"))
        out = c.file.getvalue()
        assert "95%" in out and not COLOUR.search(out), repr(out)


# The real CLI -------------------------------------------------------------------------

RUNNER = """
import os, sys
from tpu_info.host import devices
_scan = devices.scan_local
devices.scan_local = lambda *a, **k: _scan(os.environ["TREE_SYS"], os.environ["TREE_PROC"],
                                           os.environ["TREE_DEV"], nvml_loader=None)
from tpu_info.commands.cli import run
sys.argv[0] = "tpu-info"
run()
"""


class Machine:
    """A hooked JAX program named jax_mlp.py, a libtpu server, a v5e sysfs
    tree whose first chip the program holds, and two runs saved from it."""

    def __init__(self, tmp: Path) -> None:
        from tests.fixtures.sysfs_trees import MACHINES, build_dev, build_proc, build_sysfs
        from tests.hooked import PROGRAM

        self.rt = tmp / "rt"
        self.rt.mkdir(mode=0o700)
        script = tmp / "jax_mlp.py"
        script.write_text(PROGRAM)
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TPU_INFO_SAVE")}
        self.env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", TERM="xterm-256color",
                        TPU_INFO_RUNTIME_DIR=str(self.rt), TPU_INFO_SAVE="off")
        self.proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=self.env, cwd=tmp)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        assert line, self.proc.stderr.read()[-2000:] if self.proc.stderr else ""
        self.address = json.loads(line)["address"]
        self.libtpu = FakeLibtpuServer().__enter__()
        tree = tmp / "tree"
        self.env.update(
            TREE_SYS=str(build_sysfs(tree, MACHINES["v5e"])),
            TREE_DEV=str(build_dev(tree, [f"vfio/{g}" for g in (12, 13, 14, 15)])),
            TREE_PROC=str(build_proc(tree, {self.proc.pid: [f"{tree}/dev/vfio/12"]},
                                     {self.proc.pid: ("python3", os.getuid(),
                                                      ["python3", "jax_mlp.py"])})))
        self.runs = self._save_runs()

    def _save_runs(self) -> list[Path]:
        from tpu_info.net.client import Client
        from tpu_info.wire import runfile
        from tpu_info.wire.encoder import snapshot_to_bytes

        with Client(self.address, timeout=30) as c:
            snap = c.snapshot()
        folder = self.rt / runfile.RUNS_DIR
        folder.mkdir(mode=0o700)
        paths = [folder / f"jax_mlp.py-{self.proc.pid}-2026120{i}T000546{runfile.SUFFIX}"
                 for i in (5, 6)]
        for i, p in enumerate(paths):
            runfile.write(p, runfile.encode(snapshot_to_bytes(snap), "exit" if i else "",
                                            snap.taken_at_unix + i))
        return paths

    def close(self) -> None:
        self.libtpu.__exit__()
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-c", RUNNER, "--timeout", "30", *args]

    def piped(self, *args: str, **env: str) -> str:
        r = subprocess.run(self.argv(*args), capture_output=True, text=True, cwd=ROOT,
                           env={**self.env, **env}, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout

    def on_a_terminal(self, *args: str, width: int = 80, **env: str) -> str:
        """What a real terminal ``width`` columns wide shows (no COLUMNS: rich
        asks the terminal)."""
        out = on_a_pty(self.argv(*args), {**self.env, **env}, ROOT, width=width)
        return out.decode().replace("\r\n", "\n")


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    m = Machine(tmp_path_factory.mktemp("eighty"))
    yield m
    m.close()


def _fits(out: str, width: int = 80) -> None:
    assert out.strip() and max(widths(out)) <= width, "\n".join(
        f"{w:3d} {ANSI.sub('', line)}" for w, line in zip(widths(out), out.splitlines()))


def _section(out: str, title: str) -> str:
    plain = ANSI.sub("", out)
    start = plain.index(f"\n{title}\n")
    end = plain.find("\n\n", start + 1)
    return plain[start:end if end > 0 else None]


def _check_full_view(m: Machine, out: str) -> None:
    devices, processes = _section(out, "Devices"), _section(out, "Processes")
    for chip in ("tpu0", "tpu1", "tpu2", "tpu3"):
        assert f"\n{chip} " in devices, devices
    assert re.search(rf"\ntpu0 .*{m.proc.pid} jax_mlp\.py\n", devices), devices
    assert "jax_mlp.py  jax " in processes and m.address in processes, processes
    assert m.libtpu.target in processes and "…" not in processes, processes


@pytest.mark.slow
def test_every_view_fits_80_columns_into_a_pipe(machine):
    m = machine
    full = m.piped("--target", m.libtpu.target, COLUMNS="80")
    _fits(full)
    _check_full_view(m, full)
    p = m.piped("-p", COLUMNS="80")
    _fits(p)
    assert re.search(rf"{m.proc.pid}  jax_mlp\.py  jax \S+  {re.escape(m.address)} ", p), p
    names = [a for n in GOOGLE_LIST for a in ("--metric", n)]
    metrics = m.piped("--target", m.libtpu.target, *names, COLUMNS="80")
    _fits(metrics)
    got = sections(metrics, GOOGLE_LIST)
    assert set(got) == set(GOOGLE_LIST)
    for name in ("tensorcore_utilization", "duty_cycle_percent", "hbm_usage"):
        assert f"{m.libtpu.target} 0 TPU" in got[name] and m.address in got[name], got[name]
    assert "4097" in got["sequencer_state_detailed"] and "fusion.3" in got[
        "sequencer_state_detailed"]
    assert not re.search(r"127\.0\.[0-9.:]*…", metrics), metrics
    _fits(m.piped("--list_metrics", COLUMNS="80"))
    runs = m.piped("runs", COLUMNS="80")
    _fits(runs)
    for path in m.runs:
        assert path.name in runs, runs
    assert "running" in runs or "exit" in runs


@pytest.mark.slow
def test_every_view_fits_a_real_80_column_terminal(machine):
    m = machine
    full = m.on_a_terminal("--target", m.libtpu.target)
    _fits(full)
    _check_full_view(m, full)
    assert COLOUR.search(full)  # a terminal gets colour
    for args in (["-p"], ["--metric", "tensorcore_utilization", "--target", m.libtpu.target],
                 ["--metric", "sequencer_state_detailed", "--target", m.libtpu.target],
                 ["runs"], ["doctor"], ["report", "--target", m.address],
                 ["report", "--short", "--target", m.address],
                 ["diff", *map(str, m.runs), "--fail-on", "compiles>+0"]):
        out = m.on_a_terminal(*args)
        _fits(out)
    report = m.on_a_terminal("report", "--target", m.address)
    assert "Percentiles:" in report and "Graphs:" in report
    # plain text into a pipe stays whole: torch_xla's lines, one explanation a line
    piped = m.piped("report", "--target", m.address, COLUMNS="80")
    assert max(widths(piped)) > 80 and "; 5%=" in next(
        line for line in piped.splitlines() if "Percentiles:" in line)
    # a run is read by the name `runs` shows (its folder is named above the table)
    saved = m.on_a_terminal("report", "--from", m.runs[0].name)
    _fits(saved)
    assert "Metric: ExecuteTime" in saved


@pytest.mark.slow
def test_colour_by_level_and_what_turns_it_off(machine):
    """libtpu says chip 0 is 80 % busy with 2 of 16 GiB used, chip 1 60 % with
    1 GiB: red and yellow busy, yellow and green HBM."""
    m = machine
    forced = m.piped("--target", m.libtpu.target, COLUMNS="80", FORCE_COLOR="1")
    rows = [line for line in forced.splitlines() if line.startswith(("tpu0 ", "tpu1 "))]
    assert len(rows) == 2, forced  # libtpu's devices are the local chips
    assert f"{YELLOW}2.00 GiB / 16.00 GiB" in rows[0] and re.search(r"\x1b\[31m +80%", rows[0])
    assert f"{GREEN}1.00 GiB / 16.00 GiB" in rows[1] and re.search(r"\x1b\[33m +60%", rows[1])
    plain = m.piped("--target", m.libtpu.target, COLUMNS="80")
    assert "\x1b[" not in plain  # a pipe: no escape at all
    assert [ANSI.sub("", r) for r in rows] == [  # the same cells, without colour
        line for line in plain.splitlines() if line.startswith(("tpu0 ", "tpu1 "))]
    for env, args in (({"NO_COLOR": "1", "FORCE_COLOR": "1"}, []),
                      ({"FORCE_COLOR": "1"}, ["--no-color"])):
        out = m.piped("--target", m.libtpu.target, *args, COLUMNS="80", **env)
        assert not COLOUR.search(out), out
        assert not COLOUR.search(m.on_a_terminal("--target", m.libtpu.target, *args, **env))
