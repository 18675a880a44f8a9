"""``tpu-info profile`` against a hostile server (issue 14, item 9): it never
writes a path the server chose, survives NUL bytes and 20,000 files, and
prints no control character a server sent.

The server is a real grpc server in this process answering ``Capture`` with
crafted replies; a discovery record of this user names it (so the client
sends its secret, as to a real hook), and ``tpu-info`` runs as a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import psutil
import pytest

from tests.conftest import ROOT
from tpu_info.proto import tpu_info_v1_pb2 as pb

pytestmark = pytest.mark.slow

CONTROL = ("\x1b", "\x07", "\x9b", "\x9d", "\x00")
EVIL = "\x1b]0;pwned\x07\x1b[2J\x9b31m\x1b]52;c;ZXZpbA==\x07"


class FakeHook:
    """Answers ``Capture`` with ``reply`` (or aborts with ``abort`` details)."""

    def __init__(self) -> None:
        self.reply = pb.CaptureReply(trace=b'{"traceEvents":[]}', format="chrome-json",
                                     protocol_version=1)
        self.abort: str | None = None
        self.tokens: list[str] = []

        def capture(request: pb.CaptureRequest, context: grpc.ServicerContext) -> bytes:
            self.tokens.append(dict(context.invocation_metadata()).get(
                "tpu-info-capture-token", ""))
            if self.abort is not None:
                context.abort(grpc.StatusCode.INTERNAL, self.abort)
            return self.reply.SerializeToString()

        self.server = grpc.server(futures.ThreadPoolExecutor(2), options=[
            ("grpc.max_send_message_length", 64 << 20)])
        same = lambda b: b  # noqa: E731
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "tpu_info.v1.Monitor",
            {"Capture": grpc.unary_unary_rpc_method_handler(capture, same, same)}),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.target = f"127.0.0.1:{self.port}"


@pytest.fixture
def hook(tmp_path) -> Iterator[tuple[FakeHook, dict[str, str]]]:
    fake = FakeHook()
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    record = {"schema": 1, "pid": os.getpid(), "port": fake.port, "host": "127.0.0.1",
              "argv": ["fake"], "engine": "jax", "versions": {},
              "start_time": psutil.Process().create_time(), "capture_secret": "s3cret"}
    path = rt / f"{os.getpid()}.json"
    path.write_text(json.dumps(record))
    path.chmod(0o600)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(rt))
    yield fake, env
    fake.server.stop(0)


def profile(fake: FakeHook, env: dict[str, str], out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tpu_info", "profile", "--target",
                           fake.target, "--duration", "0.1", "--device", "-o", str(out)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def entries(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_nul_bytes_and_server_paths_are_never_used_as_names(hook, tmp_path) -> None:
    fake, env = hook
    fake.reply.files.add(name="jax/a\x00b.xplane.pb", size_bytes=1, data=b"1")
    fake.reply.files.add(name="jax/" + EVIL + ".trace.json.gz", size_bytes=1, data=b"2")
    fake.reply.files.add(name="weird", size_bytes=1, data=b"3")
    out_dir = tmp_path / "out"
    r = profile(fake, env, out_dir / "run.json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert entries(out_dir) == ["run.device-0.xplane.pb", "run.device-1.trace.json.gz",
                                "run.device-2.bin", "run.json"]
    assert (out_dir / "run.device-1.trace.json.gz").read_bytes() == b"2"
    assert fake.tokens == ["s3cret"]  # the secret of this user's record, as to a real hook
    assert not any(c in r.stdout + r.stderr for c in CONTROL), repr(r.stdout)


def test_a_path_outside_the_output_is_never_written(hook, tmp_path) -> None:
    fake, env = hook
    for name in ("../../escape.pb", "sub/../../escape2.pb"):
        fake.reply.files.add(name=name, size_bytes=1, data=b"x")
    r = profile(fake, env, tmp_path / "out" / "t" / "run.json")
    assert "Traceback" not in r.stderr, r.stderr
    assert not [p for p in tmp_path.rglob("escape*")]


def test_twenty_thousand_files_make_a_bounded_number_of_entries(hook, tmp_path) -> None:
    fake, env = hook
    for i in range(20_000):
        fake.reply.files.add(name=f"d{i}/f{i}.pb", size_bytes=1, data=b"x")
    out_dir = tmp_path / "out"
    started = time.monotonic()
    r = profile(fake, env, out_dir / "trace.json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    found = entries(out_dir)
    assert len(found) <= 65 and "trace.json" in found, len(found)
    assert len(r.stdout.splitlines()) < 200
    print(f"20,000 files: {len(found)} entries written in {time.monotonic() - started:.1f}s")


def test_remote_strings_are_cleaned_before_printing(hook, tmp_path) -> None:
    fake, env = hook
    fake.reply.notes.extend([EVIL, "plain note"])
    fake.reply.files.add(name="kept" + EVIL, size_bytes=10**9, server_path="/srv/" + EVIL)
    r = profile(fake, env, tmp_path / "run.json")
    assert r.returncode == 0, r.stderr
    assert "plain note" in r.stdout and "pwned" in r.stdout
    assert not any(c in r.stdout + r.stderr for c in CONTROL), repr(r.stdout)
    fake.abort = "boom " + EVIL
    r = profile(fake, env, tmp_path / "run2.json")
    assert r.returncode == 1 and "boom" in r.stderr
    assert not any(c in r.stdout + r.stderr for c in CONTROL), repr(r.stderr)
