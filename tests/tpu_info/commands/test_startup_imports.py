"""What the one-shot ``tpu-info`` imports: module names, never times (issue 32, item 3).

Each run is ``python -X importtime -m tpu_info ...`` with an empty runtime
directory (nothing hooked: the same path up to the request, the tables or
the document printed with no process in them); the names come from
importtime's lines, so a module imported in any thread counts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # each test runs `tpu-info` in a subprocess

# Never on any path of the CLI: the engines (DESIGN: "tpu_info never imports
# torch or jax"), the dashboard (its own process), the hook's packages.
NEVER = ("torch", "jax", "jaxlib", "numpy", "textual", "tui", "metrics", "profiler")
# What prints another form than the one asked for, or serves another command.
NOT_FOR_THE_TABLE = ("shtab", "tpu_info.outputs.query", "tpu_info.outputs.nvsmi_fields",
                     "tpu_info.outputs.detail", "tpu_info.views.metrics",
                     "tpu_info.outputs.textreport", "tpu_info.commands.report_html",
                     "tpu_info.commands.profile", "tpu_info.commands.run",
                     "tpu_info.commands.saved", "tpu_info.commands.exporter",
                     # the wire's server-side instance id: os.urandom, not secrets (hmac)
                     "secrets", "hmac",
                     # a record's process start is read from /proc (discovery)
                     "psutil")
TABLES = ("rich", "tpu_info.outputs.render", "tpu_info.outputs.table_layout")


def imported(args: list[str], runtime_dir: Path) -> set[str]:
    """Every module ``tpu-info args`` imports (any thread), by name."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TPU_INFO_RUNTIME_DIR": str(runtime_dir)}
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "tpu_info", *args],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode in (0, 1), out.stderr[-2000:]
    names = {line.split("|")[2].strip() for line in out.stderr.splitlines()
             if line.startswith("import time:") and "self [us]" not in line}
    assert "tpu_info.commands.cli" in names, out.stderr[-2000:]
    return names


def _under(names: set[str], roots: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if n in roots or n.startswith(tuple(r + "." for r in roots)))


@pytest.fixture()
def runtime_dir(tmp_path: Path) -> Path:
    d = tmp_path / "rt"
    d.mkdir(mode=0o700)
    return d


def test_the_tables_import_what_draws_them_and_nothing_for_other_forms(runtime_dir):
    names = imported([], runtime_dir)
    assert _under(names, NEVER) == []
    assert _under(names, NOT_FOR_THE_TABLE) == []
    assert "tpu_info.outputs.render" in names  # imported while the targets answer


@pytest.mark.parametrize("args", [["--json"], ["--query", "pid,hbm_used", "--format", "csv"],
                                  ["--query-gpu=index,memory.used", "--format=csv"], ["-q"]],
                         ids=["json", "csv", "query-gpu", "detail"])
def test_json_and_csv_never_load_rich(args, runtime_dir):
    """The document, the CSV rows and -q's detail are written without a console."""
    names = imported(args, runtime_dir)
    assert _under(names, NEVER) == []
    assert _under(names, TABLES) == []


def test_version_asks_no_one(runtime_dir):
    """``--version`` reads versions and local chips: no gRPC, no protobuf, no tables."""
    names = imported(["--version"], runtime_dir)
    assert _under(names, (*NEVER, "grpc", "google.protobuf", "tpu_info.net.client",
                          *TABLES)) == []


def test_a_look_at_a_hooked_process_imports_the_same(runtime_dir):
    """With a real hooked JAX program discovered: the request and the tables,
    and still nothing of the other forms."""
    from tests.hooked import HookedProgram

    with HookedProgram(env={"TPU_INFO_RUNTIME_DIR": str(runtime_dir), "TPU_INFO_PORT": "0"}):
        names = imported([], runtime_dir)
    assert {"grpc", "tpu_info.net.client", *TABLES} <= names
    assert _under(names, NEVER) == []
    assert _under(names, NOT_FOR_THE_TABLE) == []
