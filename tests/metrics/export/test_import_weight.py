"""What the hook loads inside the program when it serves from its helper (the
default): neither grpc (and its asyncio) nor psutil. Both cost the program
at start and again at exit, when the interpreter tears their modules down
(grpc's alone was ~10 ms of a Ctrl-C's exit: issue 29)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_the_record_s_start_time_is_psutil_s_without_psutil():
    psutil = pytest.importorskip("psutil")
    from metrics.export.discovery import process_start_time

    # psutil's start is /proc/stat's whole-second btime plus the start ticks:
    # up to 1 s early; the record's is exact to a tick (issue 42 item 4).
    psutils = psutil.Process().create_time()
    assert psutils - 0.02 <= process_start_time() <= psutils + 1.02


def test_status_names_are_grpc_s_error_codes():
    grpc = pytest.importorskip("grpc")
    from metrics.export.captures import STATUS_NAMES, status_name
    from metrics.export.owner import NotOwner

    assert set(STATUS_NAMES) == set(grpc.StatusCode.__members__) - {"OK"}
    assert status_name(NotOwner("no")) == "PERMISSION_DENIED"
    assert status_name(ValueError("bad")) == "INVALID_ARGUMENT"
    assert status_name(RuntimeError("boom")) == "INTERNAL"


@pytest.mark.slow
def test_a_program_served_by_its_helper_loads_no_grpc_nor_psutil(tmp_path):
    pytest.importorskip("jax")
    code = ("import sys, metrics\n"
            "metrics.install()\n"
            "import jax, jax.numpy as jnp\n"
            "jax.jit(lambda x: x + 1)(jnp.ones(3)).block_until_ready()\n"
            "metrics.mark_step()\n"
            "metrics.snapshot()\n"
            "heavy = ('grpc', 'asyncio', 'psutil')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n")
    runtime = tmp_path / "rt"
    env = dict(os.environ, JAX_PLATFORMS="cpu", TPU_INFO_RUNTIME_DIR=str(runtime),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TPU_INFO_SERVE", None)
    env.pop("TPU_INFO_SAVE", None)  # the suite turns saving off; this program saves
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
    saved = list((runtime / "runs").glob("*.tpurun"))
    assert saved, "the run was not saved: the test did not exercise the saver"
    assert not list(runtime.glob("*.json")), "the discovery record outlived the program"
