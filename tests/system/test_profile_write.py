"""A failed ``tpu-info profile`` write leaves nothing behind (issue 29, item 8).

The write fails for real: ``tpu-info`` runs as a subprocess under
``RLIMIT_FSIZE`` (a file may not grow past a few bytes, as on a full disk or
over a quota; SIGXFSZ ignored so the write returns EFBIG as ``write(2)``
documents). Before the fix a cut trace file stayed where the user asked for
it; now the trace is written to a temporary file and renamed, so the
destination holds the whole trace or nothing (an older trace there is kept),
with one line on stderr and exit code 1.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.system.test_profile_hostile import FakeHook, hook  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

TRACE = b'{"traceEvents":[' + b'{"ph":"i","name":"x","ts":1},' * 2000 + b'{}]}'


# The limit is set by a launcher that then execs tpu-info, not by a
# preexec_fn: a preexec_fn makes subprocess fork this process, whose gRPC
# server threads then restart in the child and can abort it before exec
# (grpc/grpc#43055: epoll_wait EBADF once close_fds closed its epoll fd).
LAUNCH = """
import os, resource, signal, sys
limit = int(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a core dump
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
os.execv(sys.executable, [sys.executable, "-m", "tpu_info", *sys.argv[2:]])
"""


def _profile(fake: FakeHook, env: dict[str, str], out: Path,
             limit: int | None) -> subprocess.CompletedProcess[str]:
    launch = [sys.executable, "-m", "tpu_info"] if limit is None else [
        sys.executable, "-c", LAUNCH, str(limit)]
    return subprocess.run([*launch, "profile", "--target", fake.target, "--duration", "0.1",
                           "--device", "-o", str(out)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


@pytest.mark.parametrize("limit", [0, 1000])
def test_a_failed_write_leaves_no_file(hook, tmp_path, limit) -> None:  # noqa: F811
    fake, env = hook
    fake.reply.trace = TRACE
    fake.reply.files.add(name="jax/host.xplane.pb", size_bytes=5000, data=b"d" * 5000)
    out_dir = tmp_path / "out"
    r = _profile(fake, env, out_dir / "run.json", limit)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    left = {p.name: p.stat().st_size for p in out_dir.iterdir()}
    assert left == {}, left  # before: run.json of `limit` bytes, cut
    errors = [line for line in r.stderr.splitlines() if "cannot write" in line]
    assert len(errors) == 1 and "nothing written" in errors[0], r.stderr


def test_a_failed_write_keeps_the_older_trace(hook, tmp_path) -> None:  # noqa: F811
    fake, env = hook
    fake.reply.trace = TRACE
    out = tmp_path / "run.json"
    r = _profile(fake, env, out, None)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == TRACE
    fake.reply.trace = TRACE + b" " * 10
    r = _profile(fake, env, out, len(TRACE))
    assert r.returncode == 1 and "cannot write" in r.stderr, r.stderr
    assert out.read_bytes() == TRACE  # whole, as the first run left it
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "rt") == ["run.json"]


def test_a_device_as_output_is_written_not_replaced(hook, tmp_path) -> None:  # noqa: F811
    fake, env = hook
    r = _profile(fake, env, Path("/dev/null"), None)
    assert r.returncode == 0, r.stderr
    assert Path("/dev/null").is_char_device()
