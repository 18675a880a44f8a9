"""The dashboard against real hooked JAX programs: streaming, disconnect,
reconnect with backoff, and discovery following a restarted program."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.hooked import HookedProgram
from tui.app import WatchApp
from tui.source import Conn, LiveSource

pytestmark = pytest.mark.slow

PROGRAM = r"""
import sys, jax, jax.numpy as jnp, metrics
metrics.install()
@jax.jit
def train_step(batch):
    return (batch * 2).sum()
step = metrics.track(train_step)
for n in (32, 32, 31):
    step(jnp.ones((n, 4)))
    metrics.mark_step()
print(metrics.exporter().address, flush=True)
sys.stdin.read()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Whether a server could bind ``port`` now (as grpc does, past TIME_WAIT)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def port_holders(port: int) -> str:
    """Who has ``port`` now (pid, name, state, age), for a test that waits for it."""
    import psutil

    held = []
    for c in psutil.net_connections("tcp"):
        if c.laddr and c.laddr.port == port:
            try:
                p = psutil.Process(c.pid) if c.pid else None
                who = (f"pid {c.pid} {p.name()} {' '.join(p.cmdline())[:80]!r} "
                       f"{p.status()}" if p else "no process")
            except psutil.Error:
                who = f"pid {c.pid} (gone)"
            held.append(f"{c.status} {c.laddr.port}->{c.raddr.port if c.raddr else '-'}: {who}")
    return "; ".join(held) or "nobody"


async def until(cond: Callable[[], bool], timeout: float = 60.0,
                why: Callable[[], str] = lambda: "") -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"condition not met in time {why()}")
        await asyncio.sleep(0.1)


def graph_names(app: WatchApp, target: str) -> set[str]:
    d = app.state.targets.get(target)
    return {g.name for g in d.snapshot.graphs} if d and d.snapshot else set()


async def test_streams_then_shows_the_disconnect_then_reconnects():
    port = free_port()
    prog = HookedProgram(env={"HOOK_PORT": str(port)})
    target = prog.address
    src = LiveSource([target], 0.2, discover=False, backoff_s=(0.2, 0.5))
    app = WatchApp(src, 0.2)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await until(lambda: "jit(f)" in graph_names(app, target))
            d = app.state.targets[target]
            assert d.state is Conn.STREAMING and d.snapshot is not None
            assert d.snapshot.devices and len(d.samples) >= 1
            prog.proc.kill()
            prog.proc.wait()
            await until(lambda: app.state.targets[target].state is Conn.DISCONNECTED)
            await pilot.pause()
            assert app.state.targets[target].since_unix is not None
            assert app.main.query_one("#banner").display
            assert app.is_running
            # The killed program's serving helper leaves once it reads its end of
            # file (or a reset: the program died with the TUI's request unread,
            # which held the port for minutes at load 20 before the helper knew it).
            await until(lambda: port_is_free(port), timeout=60.0,
                        why=lambda: f"(port {port} still held by {port_holders(port)})")
            prog = HookedProgram(env={"HOOK_PORT": str(port)})  # the same place again
            await until(lambda: app.state.targets[target].state is Conn.STREAMING)
    finally:
        prog.stop()


@pytest.fixture
def program(tmp_path):
    """Starts PROGRAM (hooked through metrics.install()) with discovery in tmp_path."""
    procs: list[subprocess.Popen[str]] = []
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"),
               TPU_INFO_PORT="0")

    def start() -> tuple[subprocess.Popen[str], str]:
        p = subprocess.Popen([sys.executable, "-c", PROGRAM], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env, cwd=ROOT)
        procs.append(p)
        line = p.stdout.readline()  # type: ignore[union-attr]
        assert line, p.stderr.read()  # type: ignore[union-attr]
        return p, line.strip()

    start.runtime_dir = tmp_path / "rt"  # type: ignore[attr-defined]
    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


async def test_discovery_follows_a_restarted_program(program):
    first, _ = program()
    src = LiveSource([], 0.2, discover=True, runtime_dir=program.runtime_dir,
                     probe_libtpu=False, backoff_s=(0.2, 0.5))
    src.discovery.every_s = 0.3  # type: ignore[union-attr]
    app = WatchApp(src, 0.2)
    async with app.run_test(size=(80, 24)):
        await until(lambda: any("jit(train_step)" in graph_names(app, t)
                                for t in app.state.targets))
        (old,) = list(app.state.targets)
        assert app.state.selected == old
        first.kill()
        first.wait()
        await until(lambda: app.state.targets[old].state is Conn.DISCONNECTED)
        second, _ = program()  # the same program again (usually on a new port)

        def follows() -> bool:
            live = [d for d in app.state.ordered() if d.connected and d.snapshot
                    and d.snapshot.process and d.snapshot.process.pid == second.pid]
            return len(app.state.targets) == 1 and len(live) == 1 \
                and app.state.selected == live[0].target

        await until(follows, why=lambda: repr([(d.target, d.state, d.argv, d.error)
                                              for d in app.state.ordered()]))


def test_tpu_info_never_imports_tui_at_module_level():
    code = ("import sys, tpu_info, tpu_info.commands.cli, tpu_info.outputs.render, tpu_info.net.client; "
            "print(any(m == 'tui' or m.startswith('tui.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert out.stdout.strip() == "False", out.stderr
    for path in Path(ROOT, "tpu_info").rglob("*.py"):
        for line in path.read_text().splitlines():
            assert not line.startswith(("import tui", "from tui")), f"{path}: {line}"
