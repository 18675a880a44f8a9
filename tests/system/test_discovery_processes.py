"""Discovery records of real processes: two publishers at once are both
found and clean up, a SIGTERM removes the record and chains to the
program's own handler (the writer, metrics.export.discovery, and the
reader, tpu_info.net.discovery; the rest is tests/tpu_info/net/test_discovery.py).
``rdir``: tests/conftest.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tpu_info.net import discovery as reader

PUBLISHER = textwrap.dedent("""
    import os, sys, signal
    from metrics.export import discovery
    if sys.argv[2] == "own-handler":
        def handler(signum, frame):
            print("program handler", flush=True)
            sys.exit(9)
        signal.signal(signal.SIGTERM, handler)
    path = discovery.publish(int(sys.argv[1]), "127.0.0.1", "jax", {"jax": "x"})
    print(path, flush=True)
    if sys.argv[2] == "stdin":
        sys.stdin.read()
    else:
        signal.pause()
""")


def start_publisher(rdir: Path, port: int, mode: str) -> tuple[subprocess.Popen[str], Path]:
    env = dict(os.environ, TPU_INFO_RUNTIME_DIR=str(rdir))
    p = subprocess.Popen([sys.executable, "-c", PUBLISHER, str(port), mode], cwd=ROOT, env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    assert line == str(rdir / f"{p.pid}.json"), line
    return p, Path(line)


@pytest.mark.slow
def test_two_processes_at_once_are_both_found_and_clean_up(rdir: Path):
    a, pa = start_publisher(rdir, 9001, "stdin")
    b, pb = start_publisher(rdir, 9002, "stdin")
    try:
        found = reader.find_processes(rdir)
        assert sorted((p.pid, p.port) for p in found) == sorted([(a.pid, 9001), (b.pid, 9002)])
        assert all(p.engine == "jax" and p.versions == {"jax": "x"} for p in found)
    finally:
        for p in (a, b):
            p.communicate("", timeout=30)  # EOF: the program ends normally
    assert (a.returncode, b.returncode) == (0, 0)
    assert not pa.exists() and not pb.exists()
    assert reader.find_processes(rdir) == []


@pytest.mark.slow
def test_sigterm_removes_the_record(rdir: Path):
    p, path = start_publisher(rdir, 9003, "pause")
    assert path.exists()
    p.send_signal(signal.SIGTERM)
    # Killed by the signal, as without the hook (was SystemExit(143): the
    # program unwound and ran its libraries' exit work, spending its grace).
    assert p.wait(timeout=30) == -signal.SIGTERM
    assert not path.exists()


@pytest.mark.slow
def test_sigterm_chains_to_the_programs_own_handler(rdir: Path):
    p, path = start_publisher(rdir, 9004, "own-handler")
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=30)
    assert "program handler" in out
    assert p.returncode == 9  # the program decided how to exit
    assert not path.exists()  # and atexit removed the record
