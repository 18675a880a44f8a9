"""The public API is typed: a user's script passes ``mypy --strict`` and the
misuses in ``tests/fixtures/typed_user_errors.py`` are each reported.

Here mypy reads the source tree (errors inside the package are not the
user's: ``follow_imports = silent``); tests/system/test_wheel.py runs the same
script against the installed wheel, where only its ``py.typed`` makes the
package visible to mypy.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

FIXTURES = Path(ROOT) / "tests" / "fixtures"
GOOD = FIXTURES / "typed_user.py"
BAD = FIXTURES / "typed_user_errors.py"
_MARK = re.compile(r"#\s*E:((?:\s+[a-z-]+)+)\s*$")
_ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[a-z-]+)\]$")
# What a strict user sees; errors in the package's own modules are silenced
# (stubs too: the generated _pb2.pyi files are not the user's code).
STRICT_SILENT = "[mypy]\nstrict = True\nfollow_imports = silent\nfollow_imports_for_stubs = True\n"


def have_mypy() -> None:
    r = subprocess.run([sys.executable, "-m", "mypy", "--version"], capture_output=True)
    if r.returncode:
        pytest.skip("mypy is not installed (it is in the dev extra)")


def mypy_errors(files: list[Path], workdir: Path, config: str = "[mypy]\nstrict = True\n",
                python: str | None = None) -> tuple[set[tuple[str, int, str]], str]:
    """Runs ``mypy`` on ``files`` with ``config``; returns ``{(file name, line,
    code)}`` of its errors and its whole output."""
    cfg = workdir / "mypy.ini"
    cfg.write_text(config)
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(cfg),
           "--cache-dir", str(workdir / ".mypy_cache"), "--no-error-summary",
           "--show-error-codes", "--no-pretty"]
    if python:
        cmd += ["--python-executable", python]
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    r = subprocess.run([*cmd, *map(str, files)], capture_output=True, text=True, timeout=300,
                       cwd=workdir, env=env)
    out = r.stdout + r.stderr
    found = set()
    for line in out.splitlines():
        m = _ERROR.match(line)
        if m:
            found.add((Path(m["path"]).name, int(m["line"]), m["code"]))
    assert r.returncode in (0, 1), out  # 2: mypy itself failed
    return found, out


def expected_errors(path: Path) -> set[tuple[str, int, str]]:
    """The ``# E: code [code ...]`` markers of a fixture."""
    want = set()
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = _MARK.search(line)
        for code in m[1].split() if m else ():
            want.add((path.name, n, code))
    return want


def test_user_script_passes_strict_and_misuses_are_reported(tmp_path):
    have_mypy()
    found, out = mypy_errors([GOOD, BAD], tmp_path, STRICT_SILENT)
    assert {e for e in found if e[0] == GOOD.name} == set(), out
    assert found == expected_errors(BAD), out


def test_typed_user_script_runs(tmp_path):
    """The typed script is a real program: no engine, no server, prints ok."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"))
    r = subprocess.run([sys.executable, str(GOOD)], capture_output=True, text=True,
                       timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_every_import_package_is_marked_typed():
    for package in ("tpu_info", "metrics", "profiler", "tui"):
        assert (Path(ROOT) / package / "py.typed").is_file(), package
