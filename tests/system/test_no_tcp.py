"""A hooked program on a host where no TCP socket can be opened (the TPU
machine's gVisor, seccomp'd containers) serves on its local socket alone,
and the real CLI reads it from another process.

The program runs under :mod:`tests.no_tcp` (a seccomp filter: ``socket(AF_INET
or AF_INET6)`` fails with EAFNOSUPPORT, as in gVisor; its serving helper
inherits it); the CLI runs here, without the filter. On the main before
this test, the hook printed grpc's own ``add_port.cc`` line with NUL bytes
into the program's stderr, then "metrics server not started", and wrote no
record: ``tpu-info`` said "No hooked processes found".
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from metrics.export import binding
from tests import no_tcp
from tests.conftest import ROOT, patient

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not no_tcp.available(),
                                 reason="no seccomp filter here (tests/no_tcp.py)")]

PROGRAM = textwrap.dedent(r"""
    import json, sys
    import jax, jax.numpy as jnp
    import metrics
    import profiler  # the capture `tpu-info profile` asks for

    metrics.install(engines=["jax"])

    @jax.jit
    def f(x):
        return (x * 2).sum()

    for n in (8, 8, 16):
        f(jnp.ones(n)).block_until_ready()
    ex = metrics.exporter()
    print(json.dumps({"port": ex.port if ex else None,
                      "address": ex.address if ex else None}), flush=True)
    sys.stdin.read()  # serve until the test closes stdin
""")


def _env(rdir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, TPU_INFO_RUNTIME_DIR=str(rdir), JAX_PLATFORMS="cpu",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TPU_INFO_PORT", None)  # the default rule, not the suite's pinned port 0
    env.update(extra)
    return env


class Program:
    """:data:`PROGRAM` under the filter; ``info`` is what it printed when ready."""

    def __init__(self, rdir: Path, **env: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.no_tcp", sys.executable, "-c", PROGRAM],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=_env(rdir, **env), cwd=ROOT)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=30)
            raise AssertionError(f"the program did not start: {err[-3000:]!r}")
        self.info = json.loads(line)

    def stop(self) -> tuple[int, bytes]:
        """Ends it (stdin closed); its exit status and its whole stderr."""
        try:
            _, err = self.proc.communicate(b"", timeout=patient(60))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, err


def cli(rdir: Path, *args: str, filtered: bool = False) -> subprocess.CompletedProcess[str]:
    """The real CLI reading the test's runtime directory, without the filter
    (or under it, ``filtered``: a reader on the same host without TCP)."""
    launcher = [sys.executable, "-m", "tests.no_tcp"] if filtered else []
    return subprocess.run([*launcher, sys.executable, "-m", "tpu_info", "--timeout", "20", *args],
                          capture_output=True, text=True, env=_env(rdir), cwd=ROOT,
                          timeout=patient(120))


@pytest.fixture(params=["process", "thread"])
def program(request: pytest.FixtureRequest, rdir: Path) -> Iterator[Program]:
    p = Program(rdir, TPU_INFO_SERVE=request.param)
    try:
        yield p
    finally:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait(timeout=30)


def _clean_stderr(err: bytes) -> list[str]:
    """The program's stderr carries nothing of grpc's C core (no NUL bytes, no
    ``add_port.cc`` or other ``E1205 ...`` lines) and at most one line of ours."""
    assert b"\x00" not in err, err[-2000:]
    text = err.decode("utf-8", "replace")
    assert "add_port" not in text and ".cc:" not in text, text[-2000:]
    ours = [line for line in text.splitlines() if line.startswith("tpu-info:")]
    assert len(ours) <= 1, ours
    return ours


def test_served_on_its_socket_and_read_by_the_cli(program: Program, rdir: Path) -> None:
    pid = program.proc.pid  # the launcher execs the program: same pid
    sock = rdir / f"{pid}.sock"
    assert program.info == {"port": 0, "address": f"unix:{sock}"}
    record = json.loads((rdir / f"{pid}.json").read_text())
    assert (record["port"], record["socket"], record["no_tcp"]) == (0, str(sock), "unavailable")
    assert "Address family not supported" in record["no_tcp_detail"]

    table = cli(rdir)
    assert table.returncode == 0, table.stderr
    assert str(pid) in table.stdout and f"unix:{pid}.sock" in table.stdout, table.stdout
    assert "No hooked processes found" not in table.stdout

    doc = json.loads(cli(rdir, "--json").stdout)
    seen = [t for t in doc["targets"] if t["target"] == f"unix:{sock}"]
    assert seen and seen[0]["ok"] and seen[0]["process"]["pid"] == pid, doc["targets"]

    report = cli(rdir, "report")
    assert report.returncode == 0 and "CompileTime" in report.stdout, report.stderr

    doctor = cli(rdir, "doctor")
    assert f"pid {pid} (unix:{pid}.sock): served on its local socket only: no TCP socket " \
           "can be opened on this host" in doctor.stdout, doctor.stdout

    # A reader on the host without TCP: it reads the program, and says why
    # libtpu's service is not read (not "libtpu not present"), also while
    # another process listens on libtpu's port (outside the filter: a fresh
    # check once ran beside a program on 8431 and doctor judged that listener).
    listener = socket.socket()
    try:
        listener.bind(("127.0.0.1", 8431))
        listener.listen()
    except OSError:
        pass  # taken already: the case itself
    with listener:
        here = cli(rdir, "doctor", filtered=True)
    assert here.returncode == 0 and f"pid {pid} (unix:{pid}.sock)" in here.stdout, here.stdout
    assert "libtpu's metric service cannot be reached: no TCP socket can be opened" \
        in here.stdout and "libtpu not present" not in here.stdout, here.stdout

    code, err = program.stop()
    assert code == 0, err[-2000:]
    ours = _clean_stderr(err)
    assert ours and "local socket" in ours[0] and "only" in ours[0], ours
    assert not (rdir / f"{pid}.json").exists() and not sock.exists()


def test_profile_over_the_socket(rdir: Path, tmp_path: Path) -> None:
    """A capture (the owner's, by the record's secret) over the socket alone; a
    ``unix:`` target named with ``--target`` and given to ``diff``."""
    p = Program(rdir, TPU_INFO_SERVE="thread")
    try:
        out = tmp_path / "trace.json"
        done = cli(rdir, "profile", "--pid", str(p.proc.pid), "--duration", "0.5",
                   "-o", str(out))
        assert done.returncode == 0, done.stderr
        assert json.loads(out.read_text())["traceEvents"] is not None
        explicit = cli(rdir, "--no-discovery", "--target", f"unix:{p.proc.pid}.sock",
                       "--json")
        assert explicit.returncode == 0, explicit.stderr
        diff = cli(rdir, "diff", f"unix:{p.proc.pid}.sock", f"unix:{rdir}/{p.proc.pid}.sock")
        assert diff.returncode == 0, diff.stderr
    finally:
        code, err = p.stop()
    assert code == 0
    _clean_stderr(err)


def test_asked_for_by_tpu_info_bind_unix(rdir: Path) -> None:
    """``TPU_INFO_BIND=unix`` where TCP works: the socket alone, no line of ours."""
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                            env=_env(rdir, TPU_INFO_BIND="unix"))
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        assert info["port"] == 0 and info["address"].startswith("unix:")
        record = json.loads((rdir / f"{proc.pid}.json").read_text())
        assert (record["port"], record["no_tcp"]) == (0, "asked")
        doctor = cli(rdir, "doctor")
        assert "TPU_INFO_BIND=unix asks for that" in doctor.stdout, doctor.stdout
    finally:
        _, err = proc.communicate(b"", timeout=patient(60))
    assert proc.returncode == 0
    assert _clean_stderr(err) == []


@pytest.mark.skipif(binding.no_tcp("127.0.0.1") is not None, reason="no TCP on this host")
def test_a_server_that_did_not_start_is_told_by_doctor(rdir: Path) -> None:
    """A pinned port that is taken: the record says the server failed, doctor says so."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-c", PROGRAM], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                                env=_env(rdir, TPU_INFO_PORT=str(port)))
        try:
            assert proc.stdout is not None
            assert json.loads(proc.stdout.readline()) == {"port": None, "address": None}
            doctor = cli(rdir, "doctor")
            assert f"pid {proc.pid}: hooked, but its metrics server did not start" \
                   in doctor.stdout, doctor.stdout
        finally:
            proc.communicate(b"", timeout=patient(60))
    assert proc.returncode == 0
    assert not (rdir / f"{proc.pid}.json").exists()
