"""A discovery record's process start, read from /proc as psutil reckons it
(the hook writes psutil's ``create_time()``; the CLI no longer imports psutil)."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from tpu_info.net.discovery import pid_alive, process_start_unix


@pytest.mark.parametrize("pid", [os.getpid(), os.getppid()], ids=["self", "parent"])
def test_the_same_start_as_psutil(pid):
    assert process_start_unix(pid) == psutil.Process(pid).create_time()


def test_a_younger_process_with_the_same_pid_is_not_the_recorded_one():
    started = psutil.Process().create_time()
    assert pid_alive(os.getpid(), started)
    assert not pid_alive(os.getpid(), started - 60)  # the pid was reused since


def _proc(root: Path, pid: int, ticks: int, btime: str | None) -> Path:
    (root / "self").mkdir(parents=True)
    (root / "self" / "stat").write_text("1 (x) S\n")
    (root / str(pid)).mkdir()
    # a command name with spaces and a ')' must not shift the fields
    fields = ["S"] + ["0"] * 18 + [str(ticks)] + ["0"] * 30
    (root / str(pid) / "stat").write_text(f"{pid} (a b) c) " + " ".join(fields) + "\n")
    (root / "stat").write_text("cpu 1 2 3\n" + (f"btime {btime}\n" if btime else ""))
    return root


def test_the_kernels_fields(tmp_path):
    hz = os.sysconf("SC_CLK_TCK")
    root = _proc(tmp_path / "proc", 42, ticks=5 * hz, btime="1700000000")
    assert process_start_unix(42, str(root)) == 1700000005.0
    with pytest.raises(OSError):
        process_start_unix(43, str(root))  # gone


def test_no_boot_time_is_an_error_not_a_guess(tmp_path):
    root = _proc(tmp_path / "proc", 42, ticks=1, btime=None)
    with pytest.raises(ValueError):
        process_start_unix(42, str(root))
