"""Real-terminal smoke test: ``tpu-info --watch`` in tmux against a live hooked
JAX program. The pane shows the device row and the graph name; killing the
program leaves the dashboard running and saying so; ``q`` exits with code 0.

tmux is installed with ``apt-get install -y tmux`` when missing; if that
fails the test is skipped, or fails under ``CI=true``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.tui.test_tui_live import PROGRAM

pytestmark = pytest.mark.slow


def _ensure_tmux() -> str:
    found = shutil.which("tmux")
    if found:
        return found
    try:
        r = subprocess.run(["apt-get", "install", "-y", "tmux"], capture_output=True, text=True,
                           timeout=300)
        ok, why = r.returncode == 0, (r.stderr or r.stdout).strip().splitlines()[-1:]
    except (OSError, subprocess.TimeoutExpired) as e:
        ok, why = False, [str(e)]
    found = shutil.which("tmux")
    if ok and found:
        return found
    msg = f"tmux is not installed and `apt-get install -y tmux` failed: {' '.join(why)}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def tmux_bin() -> str:
    return _ensure_tmux()


class Pane:
    """A detached tmux session on a private server socket."""

    def __init__(self, tmux: str, command: str, width: int = 140, height: int = 40) -> None:
        self.tmux = tmux
        self.socket = f"tpu-info-test-{uuid.uuid4().hex[:8]}"
        self.name = "watch"
        self._run("new-session", "-d", "-s", self.name, "-x", str(width), "-y", str(height),
                  command)

    def _run(self, *args: str) -> str:
        return subprocess.run([self.tmux, "-L", self.socket, *args], capture_output=True,
                              text=True, timeout=30, check=True).stdout

    def text(self) -> str:
        return self._run("capture-pane", "-p", "-t", self.name)

    def keys(self, *keys: str) -> None:
        self._run("send-keys", "-t", self.name, *keys)

    def wait_for(self, cond: Callable[[str], bool], timeout: float = 90.0) -> str:
        end = time.monotonic() + timeout
        text = ""
        while time.monotonic() < end:
            text = self.text()
            if cond(text):
                return text
            time.sleep(0.3)
        raise AssertionError(f"pane never matched; it shows:\n{text}")

    def close(self) -> None:
        subprocess.run([self.tmux, "-L", self.socket, "kill-server"], capture_output=True,
                       timeout=30)


def watch_script(tmp_path: Path, env: dict[str, str], rate: float, after: str = "") -> str:
    """A shell command that runs ``tpu-info --watch`` in the pane with ``env``'s
    paths, at the pane's own size (not the one pytest's terminal left in the
    environment); ``after`` runs when it exits."""
    script = tmp_path / "watch.sh"
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()
                      if k in ("PYTHONPATH", "TPU_INFO_RUNTIME_DIR", "PATH", "HOME",
                               "JAX_PLATFORMS", "XLA_FLAGS"))
    script.write_text(f"{exports}unset COLUMNS LINES\ncd {shlex.quote(str(ROOT))}\n"
                      f"{shlex.quote(sys.executable)} -m tpu_info --watch --rate {rate:g}\n"
                      f"{after}sleep 60\n")
    return f"sh {shlex.quote(str(script))}"


def start_program(source: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """Starts a hooked program (``python -c source``) and waits for its first line."""
    prog = subprocess.Popen([sys.executable, "-c", source], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)
    assert prog.stdout is not None and prog.stdout.readline(), prog.stderr.read()  # type: ignore[union-attr]
    return prog


def test_watch_in_a_real_terminal(tmux_bin, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"),
               TPU_INFO_PORT="0")
    prog = start_program(PROGRAM, env)
    pane = None
    try:
        rc_file = tmp_path / "rc"
        pane = Pane(tmux_bin, watch_script(tmp_path, env, 0.2,
                                           f"echo $? > {shlex.quote(str(rc_file))}\n"))
        shown = pane.wait_for(lambda t: "cpu:0" in t and "jit(train_step)" in t)
        assert "live" in shown
        prog.kill()
        prog.wait(timeout=30)
        shown = pane.wait_for(lambda t: "disconnected since" in t)
        time.sleep(1.0)
        assert not rc_file.exists(), "the dashboard exited when its target died"
        assert "jit(train_step)" in pane.text()  # the last data read stays on screen
        pane.keys("q")
        end = time.monotonic() + 30
        while not rc_file.exists() and time.monotonic() < end:
            time.sleep(0.2)
        assert rc_file.exists(), pane.text()
        assert rc_file.read_text().strip() == "0"
    finally:
        if pane is not None:
            pane.close()
        if prog.poll() is None:
            prog.kill()
        prog.wait(timeout=30)


def test_watch_flag_reaches_the_dashboard_only_through_the_cli(tmp_path):
    """``--watch`` is parsed by the CLI; bad ``--rate`` is still a usage error."""
    from tpu_info.commands.cli import build_parser

    args = build_parser().parse_args(["--watch", "--rate", "0.01"])
    assert args.watch and args.rate == pytest.approx(0.1)
    r = subprocess.run([sys.executable, "-m", "tpu_info", "--watch", "--rate", "0"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 2 and "positive number" in r.stderr
    assert Path(ROOT, "tui", "app.py").exists()


FAST_PROGRAM = r"""
import sys, threading, time, jax, jax.numpy as jnp, metrics
metrics.install()
@jax.jit
def train_step(x):
    return (x * 2).sum()
x = jnp.ones((32, 4))
train_step(x).block_until_ready()
print(metrics.exporter().address, flush=True)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
start, changed = time.monotonic(), False
while not stop.is_set() and time.monotonic() - start < 90:
    train_step(x)
    metrics.mark_step()
    if not changed and time.monotonic() - start > 2:
        x, changed = jnp.ones((33, 4)), True  # one recompile, its cause: the batch size
"""


def _steps_per_s(text: str) -> float:
    found = re.search(r"([\d,.]+) steps/s", text)
    return float(found.group(1).replace(",", "")) if found else 0.0


def test_recompile_and_its_cause_on_screen_while_steps_flood(tmux_bin, tmp_path):
    """A real hooked JAX loop at more than 1,000 steps a second that recompiles
    once: at 160x45 the pane shows the step rate, the recompile event and its
    cause (in the step line and the events panel), and no step rows."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"),
               TPU_INFO_PORT="0")
    prog = start_program(FAST_PROGRAM, env)
    pane = None
    try:
        pane = Pane(tmux_bin, watch_script(tmp_path, env, 0.5), width=160, height=45)
        cause = "argument 'x' changed f32[32,4] -> f32[33,4]"
        row = re.compile(r"\d+s\s+recompile\s+jit\(train_step\)\s+argument 'x' changed")
        shown = pane.wait_for(lambda t: cause in t and bool(row.search(t))
                              and _steps_per_s(t) > 1000, timeout=40)
        assert "last recompile" in shown  # the step line names it too
        assert not re.search(r"\d+s\s+step\s", shown), shown  # steps are a rate, never rows
        print(shown)  # what a user sees (pytest -s)
        pane.keys("q")
    finally:
        if pane is not None:
            pane.close()
        if prog.poll() is None:
            prog.kill()
        prog.wait(timeout=30)
