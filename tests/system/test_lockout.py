"""Another local user cannot lock the owner out (issue 29, item 2).

A process of uid 65534 holds 80 HTTP/2 connections to a hooked program's
TCP port (the server allows 64) and reopens any that close. The program's
owner (this test, root) runs ``tpu-info --json`` meanwhile: every read must
answer, over the program's local socket, and the other user's own read of
the TCP port must say why it was refused. On the code before the local
socket, every owner read failed with "does not speak gRPC".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpu_info.net import probe

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = r"""
import json, sys, metrics
metrics.install(engines=[], serve=True, port=0)
print(json.dumps({"port": metrics.exporter().port}), flush=True)
sys.stdin.read()
"""

# Everything it needs is imported as root (the checkout may be unreadable to
# uid 65534), then it drops to that user and attacks until killed.
ATTACKER = r"""
import encodings.idna, json, os, sys
from tests.hostile_clients import hold_connections
os.setgid(65534); os.setuid(65534)
print(json.dumps(hold_connections("127.0.0.1", int(sys.argv[1]), 80, float(sys.argv[2]))),
      flush=True)
"""

OTHER_USER_READ = r"""
import encodings.idna, os, sys
import grpc._channel, grpc._interceptor  # grpc imports these lazily: before dropping root
from tpu_info.commands import cli
import contextlib, io
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    cli.main(["--target", "127.0.0.1:1", *sys.argv[3:]])  # imports what the read needs
os.setgid(65534); os.setuid(65534)
sys.exit(cli.main(sys.argv[1:]))
"""

ATTACK_S = 40.0


def _owner_read(env: dict[str, str]) -> tuple[bool, float, str]:
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "tpu_info", "--json", "--timeout", "3"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    took = time.monotonic() - started
    try:
        targets = json.loads(r.stdout)["targets"]
    except (ValueError, KeyError):
        return False, took, r.stderr
    errors = [t.get("error") for t in targets if not t.get("ok")]
    return r.returncode == 0 and len(targets) == 1 and not errors, took, str(errors or r.stderr)


@pytest.mark.slow
def test_another_user_holding_every_connection_does_not_lock_the_owner_out(tmp_path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to attack as another uid")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"))
    program = subprocess.Popen([sys.executable, "-c", PROGRAM], cwd=ROOT, env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    attacker = None
    try:
        assert program.stdout is not None
        port = json.loads(program.stdout.readline())["port"]
        attacker = subprocess.Popen([sys.executable, "-c", ATTACKER, str(port), str(ATTACK_S)],
                                    cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while probe.look("127.0.0.1", port, 1.0) is not probe.Verdict.CLOSED_AT_ONCE:
            assert time.monotonic() < deadline, "the attack never filled the connection cap"
            time.sleep(0.2)
        reads = [_owner_read(env) for _ in range(3)]
        # The other user, reading the TCP port as anyone may: refused, and told why.
        other = subprocess.run(
            [sys.executable, "-c", OTHER_USER_READ, "--target", f"127.0.0.1:{port}", "--json",
             "--timeout", "3"], capture_output=True, text=True, cwd=ROOT, timeout=60,
            env=dict(env, TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt-65534")))
        still_full = probe.look("127.0.0.1", port, 1.0) is probe.Verdict.CLOSED_AT_ONCE
    finally:
        if attacker is not None:
            attacker.kill()
            attacker.wait(10)
        program.stdin.close()  # type: ignore[union-attr]
        program.wait(20)
    assert still_full, "the attack ended before the reads did"
    assert [ok for ok, _, _ in reads] == [True] * 3, reads
    assert other.returncode == 1, other.stderr
    lines = other.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused the connection" in lines[0] \
        and "other clients hold all its connections" in lines[0], other.stderr
    assert "does not speak gRPC" not in other.stderr + other.stdout
    # The program's end took its record and its socket with it.
    assert sorted(os.listdir(tmp_path / "rt")) == []
