"""What real jobs hand the hook (issue 42 items 1, 2, 5, 6): a Latin-1 byte in
argv, a command line of 2,000 shard paths, a program killed just after its
first steps or ending by exec, sockets left by killed programs, and the words
``runs`` and ``run --summary`` use. Real JAX programs on the CPU, the real
CLI in-process; ``rdir``: tests/conftest.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, patient
from tpu_info.commands.cli import main
from tpu_info.contract.discovery_record import MAX_RECORD_BYTES
from tpu_info.net import discovery as reader
from tpu_info.net.client import Client
from tpu_info.wire import runfile

PROGRAM = textwrap.dedent("""
    import os, sys, time
    serve = os.environ.get("SERVE", "thread")
    import metrics; metrics.install(serve=False if serve == "off" else serve)
    import jax, jax.numpy as jnp
    f = jax.jit(lambda x: x * 2)
    for i in range(int(os.environ.get("STEPS", "5"))):
        float(f(jnp.ones(3)).sum()); metrics.mark_step()
    print("stepped", flush=True)
    if os.environ.get("END") == "exec":
        os.execv("/bin/sh", ["sh", "-c", "sleep 2"])
    sys.stdin.read()
""")
LATIN1 = b"/data/caf\xe9.txt"
SHARDS = [f"/data/shards/train-{i:05d}-of-02000.tfrecord".encode() for i in range(2000)]


def _env(rdir: Path, **kw: str) -> dict[str, str]:
    env = dict(os.environ, TPU_INFO_RUNTIME_DIR=str(rdir), PYTHONPATH=str(ROOT),
               JAX_PLATFORMS="cpu", TPU_INFO_PORT="0", **kw)
    env.pop("TPU_INFO_SAVE", None)
    return env


def _start(rdir: Path, args: list[bytes], **kw: str) -> subprocess.Popen[bytes]:
    prog = rdir.parent / "train.py"
    prog.write_text(PROGRAM)
    p = subprocess.Popen([sys.executable.encode(), os.fsencode(prog), *args],
                         env=_env(rdir, **kw), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         cwd=rdir.parent)
    assert p.stdout is not None and p.stdout.readline().strip() == b"stepped"
    return p


def _runs(rdir: Path, pid: int) -> list[Path]:
    return sorted((rdir / "runs").glob(f"*-{pid}-*.tpurun"))


def _wait_for(what, seconds: float = 30.0):  # type: ignore[no-untyped-def]
    end = time.monotonic() + patient(seconds)
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds} s: {what}")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """One program given a Latin-1 file name and 2,000 shard paths."""
    rdir = tmp_path_factory.mktemp("job") / "rt"
    rdir.mkdir(mode=0o700)
    p = _start(rdir, [LATIN1, *SHARDS])
    yield rdir, p
    if p.poll() is None:
        p.kill()
        p.wait()


def test_a_latin1_argument_is_read_live_and_saved(job, monkeypatch, capsys):
    rdir, p = job
    monkeypatch.setenv("TPU_INFO_RUNTIME_DIR", str(rdir))

    def hooked() -> list[dict]:  # (a loaded machine: the program's first answer may be late)
        assert main(["--json"]) == 0, capsys.readouterr().err
        return [t for t in json.loads(capsys.readouterr().out)["targets"]
                if t["source"] == "hook"]
    (target,) = _wait_for(hooked)
    assert target["ok"], target.get("error")
    assert target["process"]["argv"][1] == "/data/caf\\xe9.txt"  # the byte, escaped
    assert main(["report"]) == 0
    capsys.readouterr()
    record = json.loads((rdir / f"{p.pid}.json").read_bytes())
    assert record["argv"][1] == "/data/caf\\xe9.txt"
    # The checkpoint while it runs, read back; and `runs` says it is running.
    _wait_for(lambda: _runs(rdir, p.pid))
    run = runfile.read(_runs(rdir, p.pid)[0])
    assert run.snapshot.process.argv[1] == "/data/caf\\xe9.txt"
    assert main(["runs", "--dir", str(rdir / "runs")]) == 0
    out = capsys.readouterr().out
    # (a narrow table says the short form: running)
    assert ("running" in out and "ended without its exit work" not in out
            and "no exit work" not in out), out


def test_a_long_command_line_keeps_the_program_visible(job):
    rdir, p = job
    size = (rdir / f"{p.pid}.json").stat().st_size
    assert size < MAX_RECORD_BYTES / 4, size
    record = json.loads((rdir / f"{p.pid}.json").read_bytes())
    assert record["argv_truncated"] == 2002 - len(record["argv"]) > 1900
    (found,) = reader.scan(rdir).processes
    assert found.pid == p.pid and found.argv_truncated == record["argv_truncated"]
    with Client(found.target, timeout=30) as c:  # the whole argv, from the program
        argv = c.snapshot().process.argv
    assert len(argv) == 2002 and argv[-1] == SHARDS[-1].decode()


def test_the_latin1_run_is_saved_at_its_end(job):
    rdir, p = job
    p.communicate(b"", timeout=60)
    assert p.returncode == 0
    (path,) = _runs(rdir, p.pid)
    run = runfile.read(path)
    assert run.how_it_ended() == "exit" and run.snapshot.steps.count == 5
    assert not list(rdir.glob(f"{p.pid}.*"))  # record and socket gone


def test_a_program_killed_just_after_its_first_steps_leaves_them(rdir):
    # The first checkpoint once the first steps are seen (was: at 1 s, then 3 s).
    p = _start(rdir, [], SERVE="off", STEPS="2")
    try:
        def saved_steps() -> int:
            for path in _runs(rdir, p.pid):
                try:
                    steps = runfile.read(path).snapshot.steps
                except runfile.RunFileError:
                    continue
                return steps.count if steps is not None else 0
            return 0
        assert _wait_for(saved_steps, 0.8) == 2
    finally:
        p.kill()
        p.wait()


def test_a_program_that_execs_saves_its_run_and_removes_its_record(rdir):
    p = _start(rdir, [], END="exec")
    (path,) = _wait_for(lambda: [r for r in _runs(rdir, p.pid)
                                 if runfile.read(r).ended == "exec"])
    run = runfile.read(path)
    assert run.how_it_ended().startswith("exec") and run.snapshot.steps.count == 5
    assert not (rdir / f"{p.pid}.json").exists() and not (rdir / f"{p.pid}.sock").exists()
    p.wait(timeout=60)


def test_a_killed_programs_lone_socket_is_removed(rdir):
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, socket, time
        s = socket.socket(socket.AF_UNIX); s.bind("{rdir}/%d.sock" % os.getpid())
        print("bound", flush=True); time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "bound"
    sock = rdir / f"{child.pid}.sock"
    assert reader.scan(rdir).sockets_removed == 0 and sock.exists()  # alive: kept
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert sock.exists()
    scan = reader.scan(rdir)
    assert scan.sockets_removed == 1 and not sock.exists()
    assert "lone socket(s) of exited processes" in scan.summary()[0]


def test_a_socket_whose_record_could_not_be_written_goes_at_exit(rdir):
    code = textwrap.dedent(f"""
        import os, socket
        from metrics.export import discovery
        path = discovery.socket_path("{rdir}")
        s = socket.socket(socket.AF_UNIX); s.bind(path)
        os.mkdir("{rdir}/%d.json" % os.getpid())  # the record cannot land (as on a full disk)
        assert discovery.publish(0, "", "jax", {{}}, "{rdir}", sigterm=False) is None
        print(os.getpid(), flush=True)
    """)
    r = subprocess.run([sys.executable, "-c", code], env=_env(rdir), capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert not (rdir / f"{r.stdout.strip()}.sock").exists()


def test_runs_says_a_truncated_file_is_truncated_in_one_line(tmp_path, capsys):
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "cut.tpurun").write_bytes(runfile.MAGIC)  # cut right after its header
    for i in range(53):
        (folder / f"bad-{i}.tpurun").write_bytes(b"damaged")
    assert main(["runs", "--dir", str(folder)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "skipped 54 unreadable file(s)" in err[0], err
    with pytest.raises(runfile.RunFileError, match="truncated") as e:
        runfile.read(folder / "cut.tpurun")
    assert "upgrade" not in str(e.value)


def test_a_lone_socket_of_a_live_process_is_kept(rdir):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(rdir / f"{os.getpid()}.sock"))
        assert reader.scan(rdir).sockets_removed == 0
        assert (rdir / f"{os.getpid()}.sock").exists()
    finally:
        s.close()
