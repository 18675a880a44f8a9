"""``tpu-info run -- python train.py ...``: run an unmodified program hooked.

:func:`run_hooked` starts the command with ``profiler/_autoinstall`` first on
``PYTHONPATH`` and ``TPU_INFO_AUTOINSTALL=1``; that directory's
``sitecustomize.py`` calls ``metrics.install()`` as soon as the program has
imported its engine (see its docstring). Every Python process the command
starts inherits the environment, so a launcher script (``bash run.sh``) works
too; interpreters started with ``-I``, ``-E`` or ``-S`` ignore it.

Exit status: the child's own; ``128 + N`` when it was killed by signal ``N``
(as a shell reports it); 127 when the command is not found and 126 when it
cannot be executed.

Signals: SIGTERM is always forwarded to the child. SIGINT is forwarded only
when ``tpu-info`` is not the terminal's foreground process group: at a
terminal, Ctrl-C already reaches the child (same process group), and
forwarding would deliver it twice.

This module imports neither ``metrics`` nor an engine: it finds the bootstrap
directory with ``importlib.util.find_spec``.

Example:
    >>> from tpu_info.commands.run import run_hooked
    >>> run_hooked(["python", "train.py", "--steps", "10"])   # doctest: +SKIP
    0
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

ENV_FLAG = "TPU_INFO_AUTOINSTALL"
ENV_SAVE = "TPU_INFO_SAVE"  # metrics.config.SAVE
ENV_SUMMARY = "TPU_INFO_SUMMARY"  # metrics.config.SUMMARY
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
_FORWARDED = (signal.SIGINT, signal.SIGTERM)


class HookNotFoundError(RuntimeError):
    """The bootstrap (``profiler/_autoinstall``) is not installed."""


def autoinstall_dir() -> Path:
    """The directory holding the bootstrap ``sitecustomize.py``.

    Raises:
        HookNotFoundError: ``profiler`` is not importable or lacks the bootstrap.
    """
    spec = importlib.util.find_spec("profiler")  # finds, does not import
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        candidate = Path(loc) / "_autoinstall"
        if (candidate / "sitecustomize.py").is_file():
            return candidate
    where = ", ".join(locations) or "not found"
    raise HookNotFoundError(
        f"the profiler package with its _autoinstall bootstrap is not installed "
        f"(profiler: {where}); reinstall tpu-info"
    )


def hooked_env(environ: Mapping[str, str] | None = None, hook_dir: Path | None = None
               ) -> dict[str, str]:
    """A copy of ``environ`` with the bootstrap first on ``PYTHONPATH``."""
    env = dict(os.environ if environ is None else environ)
    first = str(hook_dir if hook_dir is not None else autoinstall_dir())
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != first]
    env["PYTHONPATH"] = os.pathsep.join([first, *rest])
    env[ENV_FLAG] = "1"
    return env


def _saved_in(env: dict[str, str]) -> tuple[Path, bool]:
    """Where the child's runs will be saved, and whether that is a folder of
    our own to remove afterwards (saving was off: the summary still needs
    the file); the child prints no summary of its own."""
    from tpu_info.contract.discovery_record import runtime_dir
    from tpu_info.wire.runfile import OFF_WORDS, RUNS_DIR

    env[ENV_SUMMARY] = "0"
    setting = env.get(ENV_SAVE, "").strip()
    if setting.lower() in OFF_WORDS:
        env[ENV_SAVE] = tempfile.mkdtemp(prefix="tpu-info-run-")
        return Path(env[ENV_SAVE]), True
    if setting:
        return Path(setting).expanduser(), False
    return runtime_dir(env) / RUNS_DIR, False


def _print_summaries(saved_in: tuple[Path, bool], started: float, pid: int,
                     brief: bool = False, status: int | None = None) -> None:
    """The child's summaries; ``brief`` (SIGTERM: a grace period is running)
    only where the saved runs are, with nothing to import or decode."""
    folder, ours = saved_in
    try:
        if brief:
            if not ours:
                for p in sorted(folder.glob(f"*-{pid}-*.tpurun")) if folder.is_dir() else ():
                    sys.stderr.write(f"tpu-info: saved {p} (tpu-info report --from FILE)\n")
            return
        from tpu_info.commands.saved import summaries_since

        for text in summaries_since(folder, started, pid, kept=not ours, status=status):
            sys.stderr.write(text + "\n")
        sys.stderr.flush()
    finally:
        if ours:
            shutil.rmtree(folder, ignore_errors=True)


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _terminal_delivers_sigint() -> bool:
    """Whether we are the foreground process group of a terminal (whose
    Ctrl-C then reaches the child directly)."""
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except (AttributeError, OSError, ValueError):
            continue
    return False


def run_hooked(
    argv: Sequence[str],
    *,
    environ: Mapping[str, str] | None = None,
    hook_dir: Path | None = None,
    cwd: str | os.PathLike[str] | None = None,
    summary: bool = False,
) -> int:
    """Runs ``argv`` with the hook installed and returns its exit status.

    Args:
        argv: the command, e.g. ``["python", "train.py", "--lr", "3e-4"]``.
        environ: the child's base environment (default ``os.environ``).
        hook_dir: the bootstrap directory (default :func:`autoinstall_dir`).
        cwd: the child's working directory (default ours).
        summary: print the end-of-run summary of what the child saved, on
            stderr, once it ended (nothing is added to the child's own exit).

    Returns:
        The child's exit status (see the module docstring for signals, 126, 127).

    Raises:
        ValueError: ``argv`` is empty.
        HookNotFoundError: the bootstrap is not installed.
    """
    if not argv:
        raise ValueError("no command given: use 'tpu-info run -- python train.py ...'")
    env = hooked_env(environ, hook_dir)
    saved_in = _saved_in(env) if summary else None
    started = time.time()
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []  # signals that arrived before the child existed
    terminated: list[int] = []  # SIGTERMs forwarded: a grace period is running
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        tty_sigint = _terminal_delivers_sigint()

        def forward(signum: int, frame: FrameType | None) -> None:
            if signum == signal.SIGTERM:
                terminated.append(signum)
            if signum == signal.SIGINT and tty_sigint:
                return  # the terminal sent it to the child as well
            if child is None:
                pending.append(signum)
                return
            try:
                child.send_signal(signum)
            except OSError:
                pass  # already gone

        for sig in _FORWARDED:
            previous[sig] = signal.signal(sig, forward)
    try:
        try:
            child = subprocess.Popen(list(argv), env=env, cwd=cwd)
        except FileNotFoundError:
            sys.stderr.write(f"tpu-info run: {argv[0]}: command not found\n")
            return EXIT_NOT_FOUND
        except PermissionError:
            sys.stderr.write(f"tpu-info run: {argv[0]}: permission denied\n")
            return EXIT_NOT_EXECUTABLE
        except OSError as e:
            sys.stderr.write(f"tpu-info run: {argv[0]}: {e.strerror or e}\n")
            return EXIT_NOT_EXECUTABLE
        for pending_signal in pending:
            child.send_signal(pending_signal)
        returncode = child.wait()
        status = _exit_status(returncode)
        if saved_in is not None:
            _print_summaries(saved_in, started, child.pid, brief=bool(terminated),
                             status=returncode)
        return status
    finally:
        for restored, handler in previous.items():
            signal.signal(restored, handler if handler is not None else signal.SIG_DFL)
