"""A serving helper killed with ``kill -9`` (install(serve="process")): the
program's discovery record stops naming the freed port at once, a new helper
starts, on the same port when it is free and on another one (with the record
rewritten) when someone took it, and clients read the program again."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import psutil
import pytest

from tests.hooked import HookedProgram
from tpu_info.net.client import Client

DEADLINE_S = 30.0  # a failure bound, not a measurement: restarts take about a second


def _helpers_of(pid: int) -> list[psutil.Process]:
    found = []
    for c in psutil.Process(pid).children():
        try:
            if "metrics.export.helper" in " ".join(c.cmdline()):
                found.append(c)
        except psutil.Error:  # a dead helper its parent has not reaped yet
            continue
    return found


def _record(path: Path) -> tuple[int, dict] | None:
    """(inode, record), or None while there is none."""
    try:
        return os.stat(path).st_ino, json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _until(what, deadline_s: float = DEADLINE_S):  # type: ignore[no-untyped-def]
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(0.02)
    return None


def _kill_helper(prog: HookedProgram) -> psutil.Process:
    [helper] = _helpers_of(prog.proc.pid)
    os.kill(helper.pid, signal.SIGKILL)

    def dead() -> bool:  # gone, or a zombie its parent has not reaped yet
        try:
            return helper.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    assert _until(dead)
    return helper


def _served_by_new_helper(prog: HookedProgram, dead: psutil.Process, path: Path):  # type: ignore[no-untyped-def]
    def check():  # type: ignore[no-untyped-def]
        helpers = [h for h in _helpers_of(prog.proc.pid) if h.pid != dead.pid]
        rec = _record(path)
        if not helpers or rec is None:
            return None
        try:
            with Client(f"127.0.0.1:{rec[1]['port']}", timeout=5) as c:
                pid = c.snapshot().process.pid
        except Exception:  # noqa: BLE001 - not serving yet
            return None
        return rec if pid == prog.proc.pid else None

    return _until(check)


@pytest.mark.slow
def test_a_killed_helper_is_replaced_and_the_record_follows_it(tmp_path: Path):
    env = {"TPU_INFO_SERVE": "process", "TPU_INFO_RUNTIME_DIR": str(tmp_path)}
    with HookedProgram(env=env) as prog:
        path = tmp_path / f"{prog.proc.pid}.json"
        first = _record(path)
        assert first is not None and first[1]["port"] == prog.port

        # 1. Nobody takes the freed port: the new helper serves on it again.
        dead = _kill_helper(prog)
        # The old record goes (or is rewritten) at once: never left naming a dead helper.
        assert _until(lambda: (_record(path) or (None,))[0] != first[0])
        again = _served_by_new_helper(prog, dead, path)
        assert again is not None, "no new helper served the program"
        assert again[1]["port"] == prog.port

        # 2. Someone binds the freed port first: another port, named by a new record.
        thief = socket.socket()
        thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            for _ in range(5):  # on a loaded machine a new helper may bind it first
                dead = _kill_helper(prog)
                try:
                    thief.bind(("127.0.0.1", prog.port))
                    break
                except OSError:
                    assert _served_by_new_helper(prog, dead, path) is not None
            thief.listen()
            moved = _served_by_new_helper(prog, dead, path)
            assert moved is not None, "no new helper served the program"
            assert moved[1]["port"] != prog.port
        finally:
            thief.close()
        assert prog.stop() == 0
    assert not path.exists()
    err = prog.proc.stderr.read() if prog.proc.stderr else ""
    assert err.count("serving helper (pid") >= 2  # one warning per death
