"""Signals from the Processes panel (nvitop's ``i`` SIGINT, ``t`` SIGTERM,
``k`` SIGKILL), driven through the real app with Textual's pilot: a real child
process of the test's own receives the signal only after the confirmation
names its pid, program and signal; cancelling sends nothing; a process that
ended meanwhile is "gone"; another uid's process (a child started as
``nobody`` when the tests run as root, else pid 1), a process of another
host, a pid reused by a younger process and a row without a process are
refused in one line with no dialog. The owner is always read in ``/proc``
(a fixture tree where the test says so), never taken from the hook."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC
from pathlib import Path

import pytest
from textual.widgets import Static

from tests.fixtures.sysfs_trees import build_proc
from tests.hooked import HookedProgram
from tests.tpu_info.host.test_sandbox_host import sandbox
from tests.tui.test_tui import text_of
from tests.tui.waiting import until_drawn
from tpu_info.contract.model import ProcessRecord, Snapshot
from tpu_info.host.processes import real_uid
from tui import signals
from tui.app import WatchApp
from tui.fake import NOW, FakeSource, FrozenClock
from tui.procs import Proc
from tui.screens.confirm import SignalScreen
from tui.source import Conn, Found, LiveSource, Update
from tui.widgets.processes import ProcessesPanel

HOST = "tpu-vm-1"
TARGET = "unix:/run/tpu-info/sleeper.sock"

# A program that says which signal reached it (SIGKILL: its exit status says).
SLEEPER = r"""
import signal, sys, time
def said(n, _):
    print(signal.Signals(n).name, flush=True)
    sys.exit(0)
signal.signal(signal.SIGINT, said)
signal.signal(signal.SIGTERM, said)
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def start_sleeper(folder: Path) -> subprocess.Popen[str]:
    script = folder / "sleeper.py"
    script.write_text(SLEEPER)
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                         cwd="/")
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    return p


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    p = start_sleeper(tmp_path)
    yield p
    if p.poll() is None:
        p.kill()
    p.wait()


def owner_app(tmp_path: Path, pid: int, **kw: object) -> WatchApp:
    """The app with ``pid`` as the only process: it holds the sandbox's chip
    without the hook (the host scan's owner, named as /proc names it now; only
    the chips are a fixture)."""
    real = Path(f"/proc/{pid}")
    try:
        argv = [a.decode() for a in (real / "cmdline").read_bytes().split(b"\0") if a]
        comm = (real / "comm").read_text().strip()
    except OSError:  # hidden (hidepid): named by its pid alone, as the scan would
        argv, comm = [], ""
    scan = sandbox(tmp_path / "scan", {pid: ["DEV/vfio/vfio", "DEV/vfio/0"]},
                   {pid: (comm, real_uid(pid), argv)})[0]  # type: ignore[dict-item]
    return WatchApp(FakeSource([Found((), local=scan)]), 1.0, clock=FrozenClock(), tz=UTC,
                    tick_s=None, host=HOST, **kw)  # type: ignore[arg-type]


def hooked_app(pid: int, started_unix: float, host: str = HOST, **kw: object) -> WatchApp:
    """The app with ``pid`` as a hooked process (its snapshot's process record)."""
    snap = Snapshot(NOW, ProcessRecord(pid=pid, name="sleeper.py", host=host, user="alice",
                                       engine="jax", start_time_unix=started_unix))
    return WatchApp(FakeSource([Update(TARGET, Conn.STREAMING, snap)]), 1.0,
                    clock=FrozenClock(), tz=UTC, tick_s=None, host=HOST,
                    **kw)  # type: ignore[arg-type]


async def to_processes(a: WatchApp, pilot: object, key: str) -> ProcessesPanel:
    panel = a.main.query_one(ProcessesPanel)
    await until_drawn(pilot, lambda: panel.row_keys == [key])
    panel.focus()
    return panel


def dialog_text(a: WatchApp) -> str:
    screen = a.screen
    assert isinstance(screen, SignalScreen)
    return " ".join(" ".join(text_of(w).split()) for w in screen.query(Static) if w.id)


def got(p: subprocess.Popen[str], sig: int, timeout: float = 20.0) -> bool:
    """Whether ``p`` received ``sig`` (it says so, or SIGKILL ended it)."""
    if sig == signal.SIGKILL:
        return p.wait(timeout) == -signal.SIGKILL
    assert p.stdout is not None
    line = p.stdout.readline()
    return line.strip() == signal.Signals(sig).name and p.wait(timeout) == 0


# Your own process: asked first, then sent ------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize(("key", "sig"), [("i", signal.SIGINT), ("t", signal.SIGTERM),
                                          ("k", signal.SIGKILL)])
async def test_a_chip_owner_of_yours_gets_the_signal_after_the_confirmation(
        tmp_path: Path, sleeper: subprocess.Popen[str], key: str, sig: int):
    a = owner_app(tmp_path, sleeper.pid)
    async with a.run_test(size=(80, 24)) as pilot:
        await to_processes(a, pilot, f"pid|{sleeper.pid}")
        await pilot.press(key)
        await until_drawn(pilot, lambda: isinstance(a.screen, SignalScreen))
        words = dialog_text(a)
        assert f"Send {signal.Signals(sig).name} ({int(sig)}) to pid {sleeper.pid}?" in words
        assert "program sleeper.py" in words and "(you)" in words
        assert f"{sys.executable} {tmp_path}/sleeper.py" in words  # the command line
        assert sleeper.poll() is None  # nothing sent while asking
        await pilot.press("y")
        await until_drawn(pilot, lambda: a.signal_log)
        assert got(sleeper, sig)
        (outcome,) = a.signal_log
        assert isinstance(outcome, signals.Outcome) and outcome.kind == signals.SENT
        assert outcome.words == f"sent {signal.Signals(sig).name} to pid {sleeper.pid} (sleeper.py)"
        assert a.screen is a.main


@pytest.mark.slow
async def test_a_hooked_process_of_yours_gets_sigterm(sleeper: subprocess.Popen[str]):
    a = hooked_app(sleeper.pid, time.time())  # the hook started after the process
    async with a.run_test(size=(160, 45)) as pilot:
        await to_processes(a, pilot, TARGET)
        await pilot.press("t")
        await until_drawn(pilot, lambda: isinstance(a.screen, SignalScreen))
        assert "hooked yes" in dialog_text(a)
        await pilot.click("#send")
        await until_drawn(pilot, lambda: a.signal_log)
        assert got(sleeper, signal.SIGTERM)
        assert a.signal_log[0].kind == signals.SENT  # type: ignore[union-attr]


@pytest.mark.slow
async def test_a_real_hooked_jax_program_read_live_ends_on_sigterm():
    """A hooked JAX program (tests/hooked.py) streamed by the live source: its
    row is the hook's process record; SIGTERM after the confirmation ends it,
    and the dashboard then shows it disconnected."""
    prog = HookedProgram()
    src = LiveSource([prog.address], 0.2, discover=False, backoff_s=(0.2, 0.5))
    a = WatchApp(src, 0.2)  # this host, this user: the real defaults
    try:
        async with a.run_test(size=(80, 24)) as pilot:
            panel = a.main.query_one(ProcessesPanel)
            await until_drawn(pilot, lambda: panel.procs.get(prog.address) is not None
                              and panel.procs[prog.address].pid == prog.proc.pid, timeout=60)
            panel.focus()
            await pilot.press("t")
            await until_drawn(pilot, lambda: isinstance(a.screen, SignalScreen))
            assert f"to pid {prog.proc.pid}?" in dialog_text(a)
            await pilot.press("y")
            await until_drawn(pilot, lambda: a.signal_log)
            assert a.signal_log[0].kind == signals.SENT  # type: ignore[union-attr]
            assert prog.proc.wait(60) is not None  # it ended
            await until_drawn(pilot, lambda: a.state.targets[prog.address].state
                              is Conn.DISCONNECTED, timeout=60)
    finally:
        prog.stop()


@pytest.mark.slow
async def test_cancel_sends_nothing(tmp_path: Path, sleeper: subprocess.Popen[str]):
    a = owner_app(tmp_path, sleeper.pid)
    async with a.run_test(size=(80, 24)) as pilot:
        await to_processes(a, pilot, f"pid|{sleeper.pid}")
        for answer in ("n", "escape", "enter"):  # the focus starts on Cancel
            await pilot.press("k")
            await until_drawn(pilot, lambda: isinstance(a.screen, SignalScreen))
            await pilot.press(answer)
            await until_drawn(pilot, lambda: a.screen is a.main)
        time.sleep(0.2)
        assert sleeper.poll() is None and not a.signal_log


@pytest.mark.slow
async def test_a_process_that_ended_while_asked_is_gone(tmp_path: Path,
                                                       sleeper: subprocess.Popen[str]):
    a = owner_app(tmp_path, sleeper.pid)
    async with a.run_test(size=(80, 24)) as pilot:
        await to_processes(a, pilot, f"pid|{sleeper.pid}")
        await pilot.press("t")
        await until_drawn(pilot, lambda: isinstance(a.screen, SignalScreen))
        sleeper.kill()
        sleeper.wait()  # reaped: its pid may be anyone's now
        await pilot.press("y")
        await until_drawn(pilot, lambda: a.signal_log)
        (outcome,) = a.signal_log
        assert outcome.kind == signals.ENDED  # type: ignore[union-attr]
        assert outcome.words == (f"pid {sleeper.pid} (sleeper.py) is gone: it ended before "
                                 "SIGTERM was sent")


# Refused: no dialog, one line -----------------------------------------------

def another_users_process() -> tuple[subprocess.Popen[bytes] | None, int]:
    """A live process of another uid: a child started as nobody (as root; a
    plain ``sleep``, since nobody may not read this interpreter), else pid 1."""
    sleep = shutil.which("sleep")
    if os.geteuid() == 0 and sleep:
        p = subprocess.Popen([sleep, "600"], user=65534, group=65534, cwd="/")
        deadline = time.monotonic() + 10
        while real_uid(p.pid) != 65534 and time.monotonic() < deadline:
            time.sleep(0.01)  # until the child's setuid shows in /proc
        return p, p.pid
    if real_uid(1) not in (None, os.geteuid()):
        return None, 1
    pytest.skip("no process of another uid to try here")


@pytest.mark.slow
async def test_another_users_process_is_refused_without_a_dialog(tmp_path: Path):
    other, pid = another_users_process()
    try:
        uid = real_uid(pid)
        assert uid is not None and uid != os.geteuid()
        a = owner_app(tmp_path, pid)
        async with a.run_test(size=(80, 24)) as pilot:
            await to_processes(a, pilot, f"pid|{pid}")
            for key in "itk":
                await pilot.press(key)
                await pilot.pause()
                assert a.screen is a.main  # never offered
            assert [r.kind for r in a.signal_log] == [signals.NOT_YOURS] * 3
            words = a.signal_log[0].words
            name = a.main.query_one(ProcessesPanel).procs[f"pid|{pid}"].name
            assert f"pid {pid} ({name}) belongs to " in words and f"uid {uid}" in words
            assert "signals only your own processes" in words
        assert other is None or other.poll() is None  # alive: nothing was sent
    finally:
        if other is not None:
            other.kill()
            other.wait()


async def test_the_owner_is_read_in_proc_not_taken_from_the_hook(tmp_path: Path):
    """This test's own process, which /proc (a fixture tree) says is uid
    654321's: refused, whatever the hook says its user is."""
    proc = build_proc(tmp_path, {}, {os.getpid(): ("python3", 654321, ["python3", "me.py"])})
    a = hooked_app(os.getpid(), time.time(), proc_root=str(proc))
    async with a.run_test(size=(80, 24)) as pilot:
        await to_processes(a, pilot, TARGET)
        await pilot.press("k")
        await pilot.pause()
        assert a.screen is a.main
        (refusal,) = a.signal_log
        assert refusal.kind == signals.NOT_YOURS and "uid 654321" in refusal.words


async def test_a_pid_reused_by_a_younger_process_is_refused():
    # The hook says it started long before this process did: not the program.
    from tpu_info.contract.discovery_record import process_start_unix

    a = hooked_app(os.getpid(), process_start_unix(os.getpid()) - 3600)
    async with a.run_test(size=(80, 24)) as pilot:
        await to_processes(a, pilot, TARGET)
        await pilot.press("k")
        await pilot.pause()
        assert a.screen is a.main
        assert [r.kind for r in a.signal_log] == [signals.REUSED]


async def test_a_process_on_another_host_or_without_a_pid_is_refused():
    a = hooked_app(os.getpid(), time.time(), host="elsewhere")
    async with a.run_test(size=(80, 24)) as pilot:
        await to_processes(a, pilot, TARGET)
        await pilot.press("t")
        await pilot.pause()
        assert a.screen is a.main and a.signal_log[0].kind == signals.ELSEWHERE
    a = WatchApp(FakeSource.demo(disconnected=True), 1.0, clock=FrozenClock(), tz=UTC,
                 tick_s=None)
    async with a.run_test(size=(80, 24)) as pilot:
        panel = a.main.query_one(ProcessesPanel)
        await until_drawn(pilot, lambda: len(panel.row_keys) == 2)
        panel.focus()
        panel.move_cursor(1)  # 10.0.0.7:8431, never read: no pid
        await pilot.press("k")
        await pilot.pause()
        assert a.screen is a.main and a.signal_log[0].kind == signals.NO_PID


def test_pin_checks_before_anything_is_offered(tmp_path: Path):
    proc = str(build_proc(tmp_path, {}, {os.getpid(): ("python3", 654321, [])}))
    me = Proc("k", os.getpid(), "me.py", host=HOST)
    assert isinstance(signals.pin(me, host=HOST, proc_root=proc), signals.Refusal)
    mine = signals.pin(me, me=654321, host=HOST, proc_root=proc)  # as if we were uid 654321
    assert isinstance(mine, signals.Pinned)
    mine.close()  # cancelled: the pidfd is let go, nothing sent
    assert mine.fd is None
    gone = signals.pin(Proc("k", 2**31 - 1, "x"), host=HOST)
    assert isinstance(gone, signals.Refusal) and gone.kind == signals.GONE


def test_a_chip_owners_pid_running_another_command_is_refused(tmp_path: Path):
    # The host scan saw "python3 old.py" at this pid; /proc now says new.py.
    proc = str(build_proc(tmp_path, {}, {os.getpid(): ("python3", os.geteuid(),
                                                       ["python3", "new.py"])}))
    row = Proc(f"pid|{os.getpid()}", os.getpid(), "old.py", hooked=False,
               command="python3 old.py")
    refusal = signals.pin(row, proc_root=proc)
    assert isinstance(refusal, signals.Refusal) and refusal.kind == signals.REUSED
    same = signals.pin(replace(row, command="python3 new.py"), proc_root=proc)
    assert isinstance(same, signals.Pinned)
    same.close()


def test_the_confirmation_names_pid_program_and_signal():
    from tui.screens.confirm import question

    head, _ = question(Proc("k", 4242, "train.py", command="python train.py"),
                       signal.SIGKILL, "alice")
    assert head.plain == "Send SIGKILL (9) to pid 4242?"
    assert "nothing is saved" in signals.EFFECT[signal.SIGKILL]


def test_without_a_pidfd_the_start_is_checked_again(monkeypatch):
    monkeypatch.delattr(os, "pidfd_open")
    pinned = signals.pin(Proc("k", os.getpid(), "me.py"))
    assert isinstance(pinned, signals.Pinned) and pinned.fd is None
    pinned.started_unix = (pinned.started_unix or 0.0) + 60  # as if the pid were reused
    assert pinned.send(0).kind == signals.ENDED  # signal 0: nothing, and not sent either

