"""``make test-fast`` (issue 32, item 6): ``pytest --fast`` runs unit tests only.

It leaves out tests/system and every test marked ``slow``, and a test it
keeps that starts a process (a hooked program, the torch_xla venv,
Prometheus, a browser, a tool) fails, saying to mark it slow: the quick loop
cannot grow a subprocess program unnoticed. ``make test`` runs everything.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

PROBE = '''
import subprocess, sys
import pytest

def test_a_unit():
    assert sum(range(4)) == 6

def test_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

@pytest.mark.slow
def test_marked_slow_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
'''


def _pytest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_make_test_fast_runs_pytest_fast_and_make_test_the_whole_suite():
    makefile = (ROOT / "Makefile").read_text()
    fast = re.search(r"^test-fast:.*\n((?:\t.*\n)+)", makefile, re.M)
    whole = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert fast and "-m pytest $(PYTEST_ARGS) --fast" in fast.group(1)
    assert whole and "-m pytest $(PYTEST_ARGS) ||" in whole.group(1)
    assert "--fast" not in whole.group(1) and " -m " not in whole.group(1).replace("-m pytest", "")


def test_a_kept_test_that_starts_a_process_fails_and_a_slow_one_is_left_out(tmp_path: Path):
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    # -p tests.conftest: the project's hooks for a probe file outside tests/.
    outside = ("-p", "tests.conftest", "--rootdir", str(tmp_path))
    fast = _pytest(*outside, "--fast", str(probe))
    assert fast.returncode == 1, fast.stdout + fast.stderr
    assert "1 failed, 1 passed, 1 deselected" in fast.stdout, fast.stdout
    assert "test_probe.py::test_starts_a_process" in fast.stdout
    assert "starts a process in its call: mark it @pytest.mark.slow" in fast.stdout
    whole = _pytest(*outside, str(probe))
    assert whole.returncode == 0 and "3 passed" in whole.stdout, whole.stdout + whole.stderr


def test_the_system_folder_is_left_out():
    here = Path(__file__).relative_to(ROOT)
    fast = _pytest("--fast", "--collect-only", str(here))
    assert fast.returncode == 5, fast.stdout + fast.stderr  # nothing collected
    assert re.search(r"\b3 deselected\b", fast.stdout), fast.stdout
