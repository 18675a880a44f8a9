"""Bad arguments to every flag of every subcommand: one line and exit 2, never a traceback.

The exit codes are the ones docs/cli.md documents: 0 ok, 1 some targets failed, 2 usage error (``run``
returns its child's status: 126/127 when the command cannot run). Command lines
are drawn from a grammar of each subcommand's flags with hostile values
(inf/nan/huge floats, ports 0/65536/-1, hosts with spaces, NUL, unicode, 64-character
DNS labels, unbalanced brackets, missing/binary/huge target files) and run
in-process through ``main(argv)``; the two cases issue 14 quotes also run as
real subprocesses. No target listens: loopback ports 1 and 9 refuse at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT
from tpu_info.commands import cli
from tpu_info.net.targets import MAX_TARGETS, read_targets_file, validate_target

LONG_LABEL = "a" * 64 + ".example.com"


def tpu_info(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR="/nonexistent-tpu-info")
    return subprocess.run([sys.executable, "-m", "tpu_info", *args], capture_output=True,
                          text=True, timeout=60, env=env, cwd=ROOT)


@pytest.mark.parametrize("args,needle", [
    (["--timeout", "1e10"], "--timeout is at most 86400 seconds"),
    (["--target", f"{LONG_LABEL}:80"], "not a valid DNS name"),
    (["--no-discovery", "--target", f"{LONG_LABEL}:80"], "not a valid DNS name"),
    (["--rate", "1e300", "--streaming"], "--rate is at most"),
])
@pytest.mark.slow
def test_quoted_cases_are_one_line_and_exit_2(args: list[str], needle: str):
    r = tpu_info(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_watch_entry_point_checks_its_arguments():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for args in (["--rate", "nan"], ["--timeout", "1e10"], ["--target", f"{LONG_LABEL}:1"]):
        r = subprocess.run([sys.executable, "-m", "tui", *args], capture_output=True,
                           text=True, timeout=60, env=env, cwd=ROOT)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr



@pytest.mark.slow
def test_watch_entry_point_refuses_a_pipe():
    """``python -m tui`` run directly into a pipe says so in one line (exit 2)
    instead of writing escape codes forever (tpu-info --watch checks first)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "tui", "--no-discovery"], capture_output=True,
                       text=True, timeout=60, env=env, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, (r.returncode, r.stderr[:200])
    assert len(r.stderr.strip().splitlines()) == 1 and "needs a terminal" in r.stderr
    assert r.stdout == ""

# Targets ---------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    f"{LONG_LABEL}:1", "a" * 254 + ":1", "a..b:1", "a!b:1", "h:\u00b2", "h:\uff18\uff14",
    "a\x00b:1", "a\x1b]0;x\x07:1", "[::1", "[::1]", "::1:80", "[zz]:1", "]:1", "x:0",
    "x:65536", "x:-1", "[a]b]:1", "h:", ":1",
])
def test_bad_targets_are_value_errors(text: str):
    with pytest.raises(ValueError):
        validate_target(text)


@pytest.mark.parametrize("text", ["\u2024:1", "a\u2024\u2024b:1"])
def test_a_host_that_nameprep_maps_to_empty_labels_is_refused(text: str):
    # Hypothesis found '\u2024:1' (ONE DOT LEADER): nameprep makes it '.', which
    # passed as a host and then failed to encode for getaddrinfo.
    with pytest.raises(ValueError):
        validate_target(text)


def test_good_targets_come_back_resolvable():
    assert validate_target("b\u00fccher.example:80") == "xn--bcher-kva.example:80"
    assert validate_target("[fe80::1%eth0]:8431") == "[fe80::1%eth0]:8431"
    assert validate_target(" localhost:08431 ") == "localhost:8431"


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=80) | st.builds(lambda h, p: f"{h}:{p}", st.text(max_size=70),
                                        st.integers(-2, 70000)))
def test_validate_target_raises_only_value_error(text: str):
    try:
        t = validate_target(text)
    except ValueError:
        return
    host, _, port = t.rpartition(":")
    assert 0 < int(port) < 65536
    host = host.strip("[]")
    host.encode("idna")  # what socket.getaddrinfo does first: must not raise


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("targets")
    (d / "good").write_text("# comment\nlocalhost:1\n\n127.0.0.1:9  # trailing\n")
    (d / "binary").write_bytes(b"\xff\xfe\x00\x01garbage" * 10)
    (d / "huge").write_bytes(b"localhost:1\n" * 200_000)  # 2.4 MB
    (d / "many").write_text("localhost:1\n" * (MAX_TARGETS + 1))
    (d / "bad-line").write_text("localhost:1\n[::1\n")
    (d / "dir").mkdir()
    (d / "out").mkdir()
    return {"good": str(d / "good"), "binary": str(d / "binary"), "huge": str(d / "huge"),
            "many": str(d / "many"), "bad-line": str(d / "bad-line"), "dir": str(d / "dir"),
            "missing": str(d / "missing"), "nul": str(d / "a\x00b"), "devnull": os.devnull,
            "zero": "/dev/zero", "out": str(d / "out")}


def test_targets_files(files: dict[str, str]):
    assert not os.listdir(files["out"])
    assert read_targets_file(files["good"]) == ["localhost:1", "127.0.0.1:9"]
    assert read_targets_file(files["devnull"]) == []
    for name in ("binary", "huge", "many", "bad-line", "dir", "missing", "nul", "zero"):
        with pytest.raises(ValueError):
            read_targets_file(files[name])


def test_targets_file_fifo_and_devices_are_bounded(tmp_path):
    """A FIFO nobody writes to is given up at its timeout (it blocked forever);
    /dev/zero is cut at the size bound; a socket is refused."""
    import socket
    import time

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(ValueError, match="FIFO nobody writes to"):
        read_targets_file(str(fifo), timeout=0.3)
    assert time.monotonic() - started < 5
    with pytest.raises(ValueError, match="larger than"):
        read_targets_file("/dev/zero", timeout=5)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    with pytest.raises(ValueError, match="cannot read targets file"):
        read_targets_file(str(tmp_path / "sock"), timeout=0.3)
    sock.close()


# Whole command lines, in process ------------------------------------------------

SECONDS = ["1", "0.05", "0", "-1", "nan", "-nan", "inf", "-inf", "1e10", "1e300", "1e-300",
           "86400", "86401", "abc", "", "\x00", "0x10", "1_0", "\u0661"]
HOSTS = ["localhost", "127.0.0.1", "[::1]", "::1", "[::1", "::1]", "", " ", "a b", "a\x00b",
         "\u00e9", "\u00fc" * 70, LONG_LABEL, "a" * 300, "[zz]", "h/x", "h@x", "\x1b[2J"]
PORTS = ["1", "9", "0", "65536", "-1", "", "x", "99999999999999999999", "\u00b2", "8431"]


def _targets() -> st.SearchStrategy[str]:
    composed = st.builds(lambda h, p: f"{h}:{p}", st.sampled_from(HOSTS), st.sampled_from(PORTS))
    return composed | st.sampled_from(["", ":", "host", "[::1]", "localhost:1:2"])


VALID = {"seconds": ["0.2", "1", "86400"], "target": ["localhost:1", "127.0.0.1:9", "[::1]:9"],
         "metric": ["hbm_usage", "CompileTime"], "filter": ["percentile:[p50,p99]"],
         "pid": ["1"], "output": ["OUT/t.json.gz"], "query": ["index,pid", "steps"],
         "format": ["csv", "csv,noheader,nounits"]}


def _hostile(kind: str, files: dict[str, str]) -> st.SearchStrategy[str]:
    junk = st.text(max_size=12)
    return {
        "seconds": st.sampled_from(SECONDS) | st.floats().map(repr) | junk,
        "target": _targets() | junk,
        "file": st.sampled_from(sorted(files.values())),
        "metric": st.sampled_from(["duty_cycle_pct", "bogus", ""]) | junk,
        "query": st.sampled_from(["", ",", "pid,,", "bogus", "pid\x00"]) | junk,
        "format": st.sampled_from(["", "tsv", "csv,", "csv,header", "CSV"]) | junk,
        "filter": st.sampled_from(["percentile:[p50]", "percentile:[p50,p99.9]", "p50",
                                   "percentile:[p101]", "percentile:[]", ""]) | junk,
        "pid": st.sampled_from(["0", "-1", "1e3", "99999999999999999999", "x", ""]),
        "output": st.sampled_from(["", "\x00", "/", "/nonexistent/dir/t.json"]),
    }[kind]


def _value(draw: st.DrawFn, kind: str, files: dict[str, str]) -> str:
    """Mostly good values (to get past parsing), else hostile ones."""
    if kind in VALID and draw(st.integers(0, 9)) < 6:
        return draw(st.sampled_from(VALID[kind])).replace("OUT", files["out"])
    return draw(_hostile(kind, files))


TOP = {"--json": None, "-p": None, "--no-color": None, "--list_metrics": None,
       "--watch": None, "--streaming": None, "--rate": "seconds", "--timeout": "seconds",
       "--metric": "metric", "-f": "filter", "--target": "target", "--targets-file": "file",
       "-l": "seconds", "--query": "query", "--format": "format", "--help-query": None,
       "-v": None, "--bogus": None,
       # nvidia-smi's and nvitop's spellings (issue 43)
       "-q": None, "--query-gpu": "query", "--query-compute-apps": "query", "-i": "pid",
       "--only": "pid", "--only-visible": None, "--all": None, "--pid": "pid", "--user": None,
       "-L": None}
SUB = {
    None: {},
    "doctor": {"--json": None},
    "report": {"--pid": "pid", "--target": "target", "--short": None, "--json": None},
    "profile": {"--pid": "pid", "--target": "target", "--duration": "seconds",
                "-o": "output", "--device": None},
}


@st.composite
def command_lines(draw: st.DrawFn, files: dict[str, str]) -> list[str]:
    def flags(table: dict[str, str | None]) -> list[str]:
        out: list[str] = []
        for flag in draw(st.lists(st.sampled_from(sorted(table)), max_size=5)) if table else []:
            out.append(flag)
            if table[flag] and draw(st.integers(0, 9)):  # now and then a missing value
                out.append(_value(draw, table[flag], files))
        return out

    argv = flags(TOP)
    sub = draw(st.sampled_from(list(SUB)))
    if sub:
        argv += [sub, *flags(SUB[sub])]
    if draw(st.integers(0, 9)) == 0:
        argv.insert(draw(st.integers(0, len(argv))), draw(st.text(max_size=6)))
    return argv


class _Exec(Exception):
    pass


@pytest.fixture
def contained(monkeypatch: pytest.MonkeyPatch):
    """``--watch`` execs the dashboard and ``--streaming`` loops until Ctrl-C:
    both are stopped at that boundary, after the arguments were checked."""
    execs: list[list[str]] = []

    def execv(path: str, argv: list[str]) -> None:
        execs.append(argv)
        raise SystemExit(0)

    def sleep(seconds: float) -> None:
        assert 0 < seconds <= cli.MAX_SECONDS
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "execv", execv)
    monkeypatch.setattr(time, "sleep", sleep)
    monkeypatch.setattr(cli, "is_terminal", lambda: True)  # --watch refuses a pipe
    monkeypatch.setenv("TPU_INFO_RUNTIME_DIR", "/nonexistent-tpu-info-fuzz")
    monkeypatch.setenv("COLUMNS", "100")
    return execs


@pytest.mark.slow
@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_every_flag_of_every_subcommand(data: st.DataObject, files: dict[str, str], contained,
                                        capsys: pytest.CaptureFixture[str]):
    argv = ["--no-discovery", "--timeout", "0.3", *data.draw(command_lines(files))]
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    assert rc in (0, 1, 2), (argv, rc, err)
    assert "Traceback" not in err and "Traceback" not in out, argv
    if rc == 2:
        assert len(err.strip().splitlines()) == 1, (argv, err)
    for execed in contained:  # --watch hands over only what it checked
        assert execed[:3] == [sys.executable, "-m", "tui"] and rc == 0
    contained.clear()


@pytest.mark.parametrize("argv", [
    ["--timeout", "1e10", "--target", "localhost:1"],
    ["--target", f"{LONG_LABEL}:1"],
    ["--target", "\x80:1"],
    ["--rate", "1e300", "--streaming", "--target", "localhost:1"],
    ["doctor", "\r"],
    ["--targets-file", "/dev/zero"],
    ["report", "--pid", "-1"],
])
def test_what_the_fuzz_found_once(argv: list[str], contained, capsys):
    """Cases found by the grammar above (or quoted by the issue), kept so they
    run every time whatever hypothesis draws."""
    assert cli.main(["--no-discovery", "--timeout", "0.3", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("argv,codes", [
    (["run", "--", "/nonexistent-command"], {127}),
    (["run", "--", "/"], {126}),
    (["run", "--", "a\x00b"], {2}),
    (["run", "--"], {2}),
])
@pytest.mark.slow
def test_run_with_bad_commands(argv: list[str], codes: set[int], capsys):
    assert cli.main(argv) in codes
    out, err = capsys.readouterr()
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_watch_hands_over_checked_values(contained):
    assert cli.main(["--watch", "--rate", "0.01", "--timeout", "2",
                     "--target", "b\u00fccher.example:80"]) == 0
    argv = contained[0]
    assert argv[argv.index("--rate") + 1] == "0.1"  # the floor
    assert "xn--bcher-kva.example:80" in argv
    assert cli.main(["--watch", "--pid", "42", "7,9", "--user", "alice,1000"]) == 0
    argv = contained[1]  # nvitop's selection: the Processes panel filtered at first

    def given(flag: str) -> list[str]:
        return [v for i, a in enumerate(argv) if a == flag for v in argv[i + 1].split(",")]

    assert given("--pid") == ["42", "7", "9"] and given("--user") == ["alice", "1000"]


WATCH = {"--target": "target", "--rate": "seconds", "--timeout": "seconds",
         "--no-discovery": None, "--bogus": None}


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_dashboard_entry_point_fuzz(data: st.DataObject, files: dict[str, str],
                                    monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]):
    """``python -m tui`` (what --watch execs) refuses what tpu-info refuses; the
    app itself is stopped at its boundary."""
    import tui.app
    from tui.__main__ import main as watch_main

    ran: list[tuple] = []
    monkeypatch.setattr(tui.app, "run", lambda *a, **k: ran.append((a, k)) or 0)
    argv: list[str] = []
    for flag in data.draw(st.lists(st.sampled_from(sorted(WATCH)), max_size=5)):
        argv.append(flag)
        if WATCH[flag]:
            argv.append(_value(data.draw, WATCH[flag], files))
    rc = watch_main(argv)
    out, err = capsys.readouterr()
    assert rc in (0, 2), (argv, rc)
    assert (rc == 0) == bool(ran), (argv, err)
    if rc == 2:
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)
    else:
        (rate,), kw = ran[0][0][1:], ran[0][1]
        assert 0.1 <= rate <= cli.MAX_SECONDS and 0 < kw["timeout"] <= cli.MAX_SECONDS
