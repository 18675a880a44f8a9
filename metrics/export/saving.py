"""The saved run: when the program ends, its last snapshot outlives it.

At a normal end, an uncaught exception, Ctrl-C or SIGTERM (not SIGKILL:
nothing runs then) the hook writes its final snapshot, events included, and
how the program ended to one file (:mod:`tpu_info.wire.runfile`'s format),
so ``tpu-info --from FILE``, ``report --from``, ``doctor --from`` and
``tpu-info diff`` read a finished run as they read a live one.

Where: ``$TPU_INFO_SAVE`` (or ``install(save=)``) names the file (or an
existing directory to write into); unset, ``runs/`` in the private runtime
directory (``<program>-<pid>-<start>.tpurun``), where only the newest
:data:`KEEP_RUNS` files within :data:`KEEP_BYTES` are kept; ``0``/``off``
saves nothing.

Cost at exit: one snapshot built and encoded (what one scrape costs) and one
write; the file is written to a temporary name and renamed, so a run cut
short leaves the previous file, never half of one. A forked child saves
nothing of its parent's; every failure is counted and swallowed.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import FrameType

from metrics.recording import forksafe
from tpu_info.contract.discovery_record import runtime_dir
from tpu_info.contract.model import Snapshot
from tpu_info.wire import runfile
from tpu_info.wire.encoder import snapshot_to_bytes

OFF_WORDS = runfile.OFF_WORDS
RUNS_DIR = runfile.RUNS_DIR
KEEP_RUNS = 20
KEEP_BYTES = 256 * 1024 * 1024
# On SIGTERM the snapshot is built on a thread of its own, waited for this
# long: the signal may have stopped the main thread inside a hook holding a
# lock the snapshot needs, and then the run is not saved rather than hung.
SIGNAL_SAVE_S = 1.0
_started: int | None = None  # the pid that armed a saver (a forked child arms none)


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:60] or "program"


def target(setting: str | None, program: str, pid: int, start_unix: float,
           environ: Mapping[str, str] | None = None) -> tuple[Path, bool] | None:
    """Where this run is saved, and whether it is the default folder (pruned);
    None when saving is off."""
    started = time.strftime("%Y%m%dT%H%M%S", time.localtime(start_unix))
    name = f"{_safe_name(program)}-{pid}-{started}"
    if setting is not None and setting.strip().lower() in OFF_WORDS:
        return None
    if setting:
        path = Path(setting).expanduser()
        if path.is_dir():
            return path / f"{name}{runfile.SUFFIX}", False
        return path, False
    return runtime_dir(environ) / RUNS_DIR / f"{name}{runfile.SUFFIX}", True


def prune(folder: Path, keep: int = KEEP_RUNS, keep_bytes: int = KEEP_BYTES) -> None:
    """Removes the oldest saved runs of ``folder`` beyond ``keep`` files or
    ``keep_bytes`` in all (the newest is always kept)."""
    runs = []
    for p in folder.glob(f"*{runfile.SUFFIX}"):
        try:
            st = p.stat()
        except OSError:
            continue
        runs.append((st.st_mtime, st.st_size, p))
    runs.sort(reverse=True)
    total = 0
    for i, (_, size, p) in enumerate(runs):
        total += size
        if i >= 1 and (i >= keep or total > keep_bytes):
            try:
                p.unlink()
            except OSError:
                pass


class RunSaver:
    """Writes the run's file once, at its end, from its owner process only;
    with ``summary``, prints the end-of-run summary to stderr after it."""

    def __init__(self, final_snapshot: Callable[[], Snapshot], where: tuple[Path, bool] | None,
                 failed: Callable[[str, BaseException], None], summary: bool = False) -> None:
        self._final = final_snapshot
        self.path, self._default = where if where is not None else (None, False)
        self._failed = failed
        self._summary = summary
        self.owner = os.getpid()
        self._done = threading.Lock()  # taken once: the first save is the only one
        self._error = ""  # the uncaught exception, as the excepthook saw it

    def saw_exception(self, exc: BaseException) -> None:
        """The program is ending by an uncaught exception (the excepthook's)."""
        self._error = f"{type(exc).__name__}: {exc}"[:1000]

    def save(self, ended: str = "exit", signal: str = "") -> Path | None:
        """Writes the file (and the summary); the path, or None (done already,
        a forked child, saving off, or the write failed: counted, never raised)."""
        if os.getpid() != self.owner or not self._done.acquire(blocking=False):
            return None
        if ended == "exit" and self._error:
            ended = "exception"
            if self._error.startswith("KeyboardInterrupt"):
                ended, signal = "signal", "SIGINT"
        try:
            snap = self._final()
            if snap.steps is not None:  # the loop is over: what came after it is tear-down
                snap = replace(snap, steps=replace(snap.steps, loop_ended=True))
        except Exception as e:  # noqa: BLE001 - the program is ending: never raise into it
            self._failed("saving.snapshot", e)
            return None
        written = self._write(snap, ended, signal)
        if self._summary:
            self._print_summary(snap, ended, signal, written)
        return written

    def _write(self, snap: Snapshot, ended: str, signal: str) -> Path | None:
        if self.path is None:
            return None
        try:
            data = runfile.encode(snapshot_to_bytes(snap), ended, time.time(), signal=signal,
                                  error=self._error if ended == "exception" else "")
            folder = self.path.parent
            if self._default:
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            runfile.write(self.path, data)
            if self._default:
                prune(folder)
            return self.path
        except Exception as e:  # noqa: BLE001
            self._failed("saving.write", e)
            return None

    def _print_summary(self, snap: Snapshot, ended: str, signal: str,
                       written: Path | None) -> None:
        try:
            from tpu_info.outputs.summary import summary

            how = signal if ended == "signal" else (
                f"exception: {self._error}" if ended == "exception" else "normal end")
            sys.stderr.write(summary(snap, how, str(written or "")) + "\n")
            sys.stderr.flush()
        except Exception as e:  # noqa: BLE001
            self._failed("saving.summary", e)


def chain_excepthook(saver: RunSaver) -> None:
    """Tells ``saver`` of an uncaught exception, then runs the hook there was."""
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], value: BaseException, tb: object) -> None:
        try:
            saver.saw_exception(value)
        except Exception:  # noqa: BLE001, S110 - never in the way of the traceback
            pass
        previous(kind, value, tb)  # type: ignore[arg-type]

    sys.excepthook = excepthook


def arm(saver: RunSaver) -> None:
    """Saves the run at the program's end: at interpreter exit (a normal end,
    an uncaught exception, Ctrl-C) and on SIGTERM, before what SIGTERM would
    have done without the hook. Call once, from the main thread, before the
    exporter installs its own handler (it runs first, removing the record)."""
    chain_excepthook(saver)
    atexit.register(saver.save)
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        if os.getpid() == saver.owner:
            done = threading.Thread(target=saver.save, args=("signal", "SIGTERM"),
                                    name="tpu-info-save", daemon=True)
            done.start()
            done.join(SIGNAL_SAVE_S)
        forksafe.act_as(previous, signum, frame)

    setattr(on_sigterm, forksafe.PREVIOUS, previous)
    signal.signal(signal.SIGTERM, on_sigterm)


def start(final_snapshot: Callable[[], Snapshot], failed: Callable[[str, BaseException], None],
          program: str, setting: str | None = None, *, summary: bool = False,
          environ: Mapping[str, str] | None = None) -> RunSaver | None:
    """The process's saver, armed (None when there is nothing to do at the
    end: saving off and no summary; a failure is counted, never raised)."""
    try:
        where = target(setting, program, os.getpid(), time.time(), environ)
        if where is None and not summary:
            return None
        saver = RunSaver(final_snapshot, where, failed, summary)
        arm(saver)
        return saver
    except Exception as e:  # noqa: BLE001 - the program runs on without a saved run
        failed("saving.start", e)
        return None


def start_from_config(save: str | None, final_snapshot: Callable[[], Snapshot],
                      failed: Callable[[str, BaseException], None]) -> RunSaver | None:
    """:func:`start` as ``install(save=)`` and the environment say
    (``TPU_INFO_SAVE``, ``TPU_INFO_SUMMARY``)."""
    from metrics.export import config

    global _started
    if _started is not None:
        return None  # one saver a process: the first install() decides
    _started = os.getpid()
    setting = save if save is not None else (config.text(config.SAVE) or None)
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return start(final_snapshot, failed, program, setting, summary=config.flag(config.SUMMARY))
