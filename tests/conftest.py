"""Shared fixtures. Tests run real JAX on the CPU; nothing is mocked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Several CPU devices for multi-device tests; must be set before jax imports.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Hooked programs started by tests (and this process) never take 8431 from a
# real libtpu or a neighbour; the one test about 8431 removes this.
os.environ.setdefault("TPU_INFO_PORT", "0")
# Hooked test programs save no run unless a test asks (tests/system/test_saved_runs.py):
# many tests check that a program leaves its runtime directory empty.
os.environ.setdefault("TPU_INFO_SAVE", "off")


def run_python(code: str, *, env: dict[str, str] | None = None, timeout: float = 120,
               cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a fresh interpreter with the project importable."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd)


@pytest.fixture
def fresh_metrics():
    """The global recorder, emptied before and after the test, hooks installed."""
    import metrics

    rec = metrics.install(engines=["jax"], serve=False)
    rec.reset()
    yield rec
    rec.reset()
