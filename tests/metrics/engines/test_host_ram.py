"""The host's RAM total (the limit a CPU device's memory is read against)
comes from the kernel, without importing psutil inside the program: that
import cost ~30 ms at the first snapshot, which a short run pays at exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_host_ram_is_psutil_s_total():
    psutil = pytest.importorskip("psutil")
    from metrics.engines._frames import host_ram

    assert host_ram() == psutil.virtual_memory().total


@pytest.mark.slow
def test_a_hooked_program_s_snapshot_imports_no_psutil():
    pytest.importorskip("jax")
    code = ("import sys, metrics\n"
            "metrics.install(engines=['jax'], serve=False)\n"
            "import jax, jax.numpy as jnp\n"
            "jax.jit(lambda x: x + 1)(jnp.ones(3)).block_until_ready()\n"
            "s = metrics.snapshot()\n"
            "assert s.devices and s.devices[0].memory.limit_bytes, s.devices\n"
            "print('psutil' in sys.modules)\n")
    env = dict(os.environ, JAX_PLATFORMS="cpu", TPU_INFO_SAVE="off",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
