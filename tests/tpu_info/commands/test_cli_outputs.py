"""nvidia-smi habits: streaming into pipes, NDJSON, CSV of named fields, ``-v``'s
three lines, ASCII and narrow terminals, ``--watch`` without a terminal,
refused combinations, and help text on every flag (issue 17, item 5).

End-to-end cases run ``python -m tpu_info`` against a real hooked JAX program
(``hooked`` from :mod:`tests.tpu_info.commands.test_cli`); the rest run in-process on
the fixture snapshots.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import select
import subprocess
import time

import pytest
from rich.text import Text

from tests.conftest import ROOT
from tests.fixtures.snapshots import SCENARIOS, header, v5e_scan
from tests.tpu_info.commands.test_cli import CLI, hooked, tpu_info  # noqa: F401  (hooked: a fixture)
from tpu_info.commands import cli
from tpu_info.commands.version import accelerator_type, version_text
from tpu_info.outputs import query
from tpu_info.outputs.console import ASCII_ERRORS
from tpu_info.outputs.render import (
    PROCESS_COLUMNS,
    TRANSFER_COLUMNS,
    device_columns,
    graph_columns,
    render_text,
)
from tpu_info.outputs.table_layout import Alt
from tpu_info.views.derived import readings


def _read_until(proc: subprocess.Popen[bytes], done, timeout: float = 60.0) -> bytes:
    """What ``proc`` wrote to stdout until ``done(data)`` or ``timeout``; the
    process is still running (nothing ended its stream)."""
    data = b""
    fd = proc.stdout.fileno()  # type: ignore[union-attr]
    deadline = time.monotonic() + timeout
    while not done(data) and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    return data


def _stream(env: dict[str, str], args: list[str], done, **kw) -> bytes:
    p = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, env=env, cwd=ROOT, **kw)
    try:
        return _read_until(p, done)
    finally:
        p.kill()
        p.communicate(timeout=30)


@pytest.mark.slow
def test_streaming_into_a_pipe_appends_each_look(hooked):  # noqa: F811
    pid, address = hooked()
    frames = _stream(hooked.env, ["--streaming", "--rate", "0.2"],
                     lambda d: d.count(b"tpu-info 0.1") >= 2).decode()
    assert frames.count("tpu-info 0.1") >= 2, frames  # two frames, nobody pressed Ctrl-C
    assert str(pid) in frames and "\x1b[" not in frames
    lines = _stream(hooked.env, ["-l", "0.2", "--json"],
                    lambda d: d.count(b"\n") >= 2).decode().splitlines()
    docs = [json.loads(line) for line in lines[:2]]  # NDJSON: one document per line
    assert all(d["schema"] == "tpu-info/v1" for d in docs)
    assert address in [t["target"] for t in docs[1]["targets"]]
    assert docs[0]["time_unix"] < docs[1]["time_unix"]
    p = subprocess.Popen([*CLI, "-l", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, env=hooked.env, cwd=ROOT)
    assert _read_until(p, lambda d: b"Devices" in d)
    p.stdout.close()  # type: ignore[union-attr]  # `| head`: the reader has had enough
    assert p.wait(timeout=60) == 0 and b"Traceback" not in p.stderr.read()  # type: ignore[union-attr]
    rows = _stream(hooked.env, ["-l", "0.2", "--query", "pid,steps", "--format", "csv"],
                   lambda d: d.count(b"\n") >= 3).decode().splitlines()
    assert rows[0] == "pid, steps" and rows[1].startswith(f"{pid}, ") and rows[2] != rows[0]


@pytest.mark.slow
def test_streaming_on_a_terminal_redraws_in_place(hooked):  # noqa: F811
    import pty

    hooked()
    main, sub = pty.openpty()
    p = subprocess.Popen([*CLI, "--streaming", "--rate", "0.2"], stdout=sub, stderr=sub,
                         stdin=sub, env=hooked.env, cwd=ROOT)
    os.close(sub)
    data = b""
    try:
        deadline = time.monotonic() + 60
        while data.count(b"\x1b[1A") < 3 and time.monotonic() < deadline:  # cursor up: redraw
            if select.select([main], [], [], 0.5)[0]:
                data += os.read(main, 65536)
    finally:
        p.kill()
        p.wait(timeout=30)
        os.close(main)
    assert data.count(b"\x1b[1A") >= 3, data[-500:]


@pytest.mark.slow
def test_json_everywhere(hooked):  # noqa: F811
    pid, address = hooked()
    r = tpu_info("--list_metrics", "--json")
    names = {m["name"] for m in json.loads(r.stdout)["metrics"]}
    assert r.returncode == 0 and {"hbm_usage", "CompileTime"} <= names
    for args in (["report", "--json"], ["--json", "report"]):
        r = tpu_info("--timeout", "30", *args, env=hooked.env)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["schema"] == "tpu-info-report/v1" and doc["target"]["target"] == address
        counters = {x["name"]: x["value"] for x in doc["readings"] if x["type"] == "counter"}
        assert counters["MarkStep"] == 3
        assert any(x["name"] == "CompileTime" and x["count"] for x in doc["readings"])
    r = tpu_info("--timeout", "30", "report", "--short", "--json", env=hooked.env)
    assert json.loads(r.stdout)["short"] is True
    r = tpu_info("--timeout", "30", "doctor", "--json", env=hooked.env)
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["schema"] == "tpu-info-doctor/v1"
    assert any(e["where"] == address and e["reason"].startswith("not counted: np.asarray(x)")
               for e in doc["explanations"]), doc["explanations"]
    r = tpu_info("-v", "--json")
    assert set(json.loads(r.stdout)) == {"tpu_info_version", "libtpu_version",
                                         "accelerator_type"}


@pytest.mark.slow
def test_query_csv_of_a_hooked_program(hooked):  # noqa: F811
    pid, _ = hooked()
    fields = "index,name,hbm_used,hbm_total,duty_cycle,pid,process,compiles,recompiles,step_time"
    r = tpu_info("--timeout", "30", "--query", fields, "--format", "csv", env=hooked.env)
    assert r.returncode == 0, r.stderr
    head, *rows = list(csv.reader(r.stdout.splitlines(), skipinitialspace=True))
    assert head[2] == "hbm_used [MiB]" and head[4] == "duty_cycle [%]"
    assert rows and all(row[5] == str(pid) and int(row[7]) >= 2 for row in rows), rows
    assert [row[0] for row in rows] == [str(i) for i in range(len(rows))]
    r = tpu_info("--timeout", "30", "--query", "pid,recompiles,steps", "--format", "csv,noheader,nounits",
                 env=hooked.env)
    (line,) = r.stdout.splitlines()  # one process row
    got_pid, recompiles, steps = line.split(", ")
    assert (got_pid, steps) == (str(pid), "3") and int(recompiles) >= 1, line  # [32,4] -> [31,4]


def test_query_fields_from_fixtures():
    views, local = SCENARIOS["tpu_host"]()
    run = readings(views, local=local, header=header())
    fields = query.parse_query("index,device,memory.used,duty_cycle,pid,compiles")
    lines = query.csv_lines(run, fields, query.Format())
    assert lines[0] == "0, tpu0, 3328 MiB, 87.5 %, 4242, 6"  # the table rounds it to 88%
    # The JAX process's 4 devices are the chips it holds (one row each), then its CPU.
    assert len(lines) == 5 and lines[4].startswith("4, cpu:0") and "[N/A]" in lines[4]
    assert query.header_line(fields, query.Format(units=False)) == \
        "index, device, hbm_used, duty_cycle, pid, compiles"
    named = query.Field("n", "process", "", "", lambda r: 'a, "b"')
    (line,) = query.csv_lines(run, [named], query.Format())[:1]
    assert next(csv.reader([line], skipinitialspace=True)) == ['a, "b"']
    assert "step_time" in query.help_text() and "(MiB)" in query.help_text()


def test_version_is_googles_three_lines(capsys):
    text = version_text(v5e_scan())
    keys = re.findall(r"^- (tpu-info version|libtpu version|accelerator type): (.+)$", text,
                      re.M)
    assert [k for k, _ in keys] == ["tpu-info version", "libtpu version", "accelerator type"]
    assert keys[2][1] == "v5e" and accelerator_type(v5e_scan()) == "v5e"
    assert cli.main(["-v"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("- tpu-info version: ")


@pytest.mark.slow
def test_ascii_stdout_degrades(hooked):  # noqa: F811
    hooked()
    env = dict(hooked.env, LANG="C", LC_ALL="C", PYTHONIOENCODING="ascii", COLUMNS="160")
    r = subprocess.run([*CLI], capture_output=True, env=env, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    out = r.stdout.decode("ascii")  # nothing but ASCII
    assert "Devices" in out and "HBM %" in out  # the wide view, with its HBM bars
    assert "█…ü─┃".encode("ascii", ASCII_ERRORS) == b"#.u-|"


@pytest.mark.parametrize("width", [40, 60, 72])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_narrow_terminals_keep_every_number(name: str, width: int):
    views, local = SCENARIOS[name]()
    out = " ".join(render_text(views, width, local=local, header=header()).split())
    run = readings(views, local=local, header=header())
    tables = [
        (device_columns(False), [*run.chips, *(d for t in run.targets for d in t.devices)]),
        (PROCESS_COLUMNS, [t.process for t in run.targets if t.process is not None]),
        (graph_columns(False), [(str(t.view.snapshot.process.pid), g) for t in run.targets
                                if t.view.snapshot and t.view.snapshot.process
                                for g in t.graphs]),
        (TRANSFER_COLUMNS, [(str(t.view.snapshot.process.pid), x, t.view.target)
                            for t in run.targets if t.view.snapshot and t.view.snapshot.process
                            for x in t.transfers if x.count]),
    ]
    for cols, items in tables:
        for col, get in cols:
            if col.flex or col.optional:
                continue  # names, engines, addresses shrink with an ellipsis; optional
                # columns (Uptime, P90, P95) give way first, both by design
            for item in items:
                value = get(item)  # a cell with a short form may show either (Alt)
                forms = [value.long, value.short] if isinstance(value, Alt) else [value]
                texts = [f.plain if isinstance(f, Text) else f for f in forms]
                assert any(" ".join(t.split()) in out for t in texts), (col.header, texts)


@pytest.mark.slow
def test_watch_refuses_without_a_terminal():
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR="/nonexistent-tpu-info")
    try:
        r = subprocess.run([*CLI, "--watch"], stdin=subprocess.DEVNULL, capture_output=True,
                           env=env, cwd=ROOT, timeout=30)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"--watch ran on without a terminal ({len(e.stderr or b'')} bytes)")
    assert r.returncode == 2 and r.stdout == b""
    assert len(r.stderr.decode().strip().splitlines()) == 1 and b"terminal" in r.stderr


@pytest.mark.parametrize("argv,needle", [
    (["--json", "--watch"], "--watch"),
    (["--json", "-p"], "--json"),
    (["--json", "--metric", "hbm_usage"], "--json"),
    (["--json", "--query", "pid"], "--json"),
    (["--format", "csv"], "needs --query"),
    (["--format", "tsv", "--query", "pid"], "csv[,noheader][,nounits]"),
    (["--query", "pid,bogus"], "unknown field 'bogus'"),
    (["--query", "pid", "-p"], "--query"),
    (["--rate", "2"], "--rate sets the interval"),
    (["-l", "2", "--rate", "1"], "give one"),
    (["--streaming", "doctor"], "not for 'doctor'"),
    (["--list_metrics", "--streaming"], "--list_metrics"),
    (["--json", "run", "--", "true"], "--json does not apply to 'run'"),
    (["--json", "profile", "-o", "/tmp/x.json"], "--json does not apply to 'profile'"),
])
def test_combinations_that_would_be_ignored_are_refused(argv, needle, capsys, monkeypatch):
    def execv(*args: object) -> None:
        raise AssertionError("--watch started the dashboard")

    monkeypatch.setattr(os, "execv", execv)
    monkeypatch.setattr(time, "sleep", lambda s: (_ for _ in ()).throw(KeyboardInterrupt))
    assert cli.main(["--no-discovery", "--timeout", "0.3", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err, err


def _walk(parser: argparse.ArgumentParser, path: str):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{path} {name}", helps.get(name)
                yield from _walk(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield f"{path} {'/'.join(action.option_strings) or action.dest}", action.help


def test_every_subcommand_and_flag_has_help():
    missing = [where for where, text in _walk(cli.build_parser(), "tpu-info")
               if not text or text == argparse.SUPPRESS]
    assert not missing, missing
    doctor = cli.build_parser()._subparsers._group_actions[0].choices["doctor"]  # type: ignore[union-attr]
    assert "--target" in (doctor.description or "")
