"""Benchmarks started in the background still stop their programs with Ctrl-C.

A shell's ``nohup`` or ``cmd &`` starts a process with SIGINT ignored, and an
ignored signal stays ignored across exec: exit_latency's Ctrl-C rows then
waited 60 s per program (every program, hooked or not) until run_all's
timeout. ``bench/_common.keep_ctrl_c`` gives Ctrl-C back.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.conftest import ROOT

CHILD = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"


def _child_sees_ctrl_c(keep: bool) -> str:
    code = (f"import signal, subprocess, sys; sys.path.insert(0, {str(ROOT / 'bench')!r})\n"
            f"import _common\n"
            + ("_common.keep_ctrl_c()\n" if keep else "")
            + f"subprocess.run([sys.executable, '-c', {CHILD!r}])\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                        signal.SIG_IGN)
                          ).stdout.strip()


@pytest.mark.slow
def test_a_benchmark_started_with_ctrl_c_ignored_gives_it_back_to_its_programs() -> None:
    assert _child_sees_ctrl_c(keep=False) == "False"  # what nohup leaves
    assert _child_sees_ctrl_c(keep=True) == "True"
