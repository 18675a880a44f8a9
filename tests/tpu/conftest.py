"""The TPU lane's one hooked JAX program on the chip, shared by its tests.

Opening the chip takes 7-11 s and one process at a time may hold it, so the
lane starts this program once per module (:func:`chip_program`) and every
reader (``python3 -m tpu_info ...``) runs with ``JAX_PLATFORMS=cpu``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT, USER_JAX_PLATFORMS
from tests.fixtures.google_names import ORBAX_RECORDS

# metrics.install() first, then a jitted loop on the chip; one line on stdout
# once it has stepped, then it steps until it is killed.
PROGRAM = r"""
import json, os, sys, time
import metrics
metrics.install()
import jax, jax.numpy as jnp

@jax.jit
def step(x, w):
    y = jnp.tanh(x @ w)
    return y / (1.0 + jnp.abs(y).mean())

x = jnp.ones((1024, 1024), jnp.float32)
w = jnp.full((1024, 1024), 1e-3, jnp.float32)
for _ in range(50):
    x = step(x, w)
    metrics.mark_step()
x.block_until_ready()
""" + ORBAX_RECORDS + r"""
d = jax.devices()[0]
print(json.dumps({"pid": os.getpid(), "platform": d.platform, "kind": d.device_kind}),
      flush=True)
while True:
    x = step(x, w)
    metrics.mark_step()
    x.block_until_ready()
    time.sleep(0.005)
"""


@dataclass
class ChipProgram:
    """The running program: its pid, its stderr file, its runtime directory."""

    proc: subprocess.Popen[str]
    pid: int
    platform: str
    kind: str
    stderr_path: Path
    runtime_dir: Path

    def reader_env(self) -> dict[str, str]:
        """The environment of a process that reads the program and must not
        take the chip."""
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env["JAX_PLATFORMS"] = "cpu"
        env["TPU_INFO_RUNTIME_DIR"] = str(self.runtime_dir)
        env["COLUMNS"] = "200"
        return env

    def tpu_info(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        """``python3 -m tpu_info ARGS`` from another process."""
        return subprocess.run([sys.executable, "-m", "tpu_info", *args], capture_output=True,
                              text=True, env=self.reader_env(), cwd=ROOT, timeout=timeout)

    def stop(self) -> int:
        """SIGTERM, as a scheduler stops a job; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        return self.proc.returncode


def chip_env(runtime_dir: Path) -> dict[str, str]:
    """The program's environment: JAX on the chip, the hook's defaults (no
    port pinned, runs saved in the runtime directory)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = USER_JAX_PLATFORMS or "tpu"
    env.pop("XLA_FLAGS", None)  # tests/conftest.py's CPU device count
    env.pop("TPU_INFO_PORT", None)
    env.pop("TPU_INFO_SAVE", None)
    env["TPU_INFO_RUNTIME_DIR"] = str(runtime_dir)
    return env


@pytest.fixture(scope="module")
def chip_program(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChipProgram]:
    """The hooked program on the chip, started once for the module."""
    base = tmp_path_factory.mktemp("tpu-lane")
    runtime_dir = base / "rt"
    runtime_dir.mkdir(mode=0o700)
    stderr_path = base / "program.stderr"
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-c", PROGRAM], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=err, text=True,
                                env=chip_env(runtime_dir), cwd=ROOT)
    started = time.monotonic()
    line = proc.stdout.readline() if proc.stdout else ""
    if not line:
        proc.kill()
        proc.wait(timeout=30)
        pytest.fail("the hooked program did not start on the chip: "
                    + stderr_path.read_text(errors="replace")[-3000:])
    info = json.loads(line)
    program = ChipProgram(proc, info["pid"], info["platform"], info["kind"], stderr_path,
                          runtime_dir)
    print(f"chip program {program.pid} on {program.kind} after "
          f"{time.monotonic() - started:.1f}s")
    yield program
    program.stop()
