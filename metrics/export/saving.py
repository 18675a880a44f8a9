"""The saved run: when the program ends, its last snapshot outlives it.

At a normal end, an uncaught exception or Ctrl-C (and SIGTERM, when the
exporter serves in-process) the hook writes its final snapshot, events
included, and how the program ended to one file (:mod:`tpu_info.wire.runfile`'s format),
so ``tpu-info --from FILE``, ``report --from``, ``doctor --from`` and
``tpu-info diff`` read a finished run as they read a live one.

Where: ``$TPU_INFO_SAVE`` (or ``install(save=)``) names the file (or an
existing directory to write into); unset, ``runs/`` in the private runtime
directory (``<program>-<pid>-<start>.tpurun``), where only the newest
:data:`KEEP_RUNS` files within :data:`KEEP_BYTES` are kept; ``0``/``off``
saves nothing.

Meanwhile a daemon thread writes the run as it stands: as soon as the
program's first steps are seen (it looks every 0.1 s until then, at a probe
that costs two reads) and 1 s after the start, then at 1, 2, 4 ... and every
30 s (when it changed), so a program SIGTERM (served by its helper: no
handler delays its end) or SIGKILL ends without exit work leaves its run,
"ended without its exit work", at most 30 s short. A program that ends by
``exec`` (no ``atexit`` then) saves its run first, "exec"
(:mod:`metrics.export.at_exec`). Cost at exit: one snapshot built and
encoded (what one scrape costs; the parts the last checkpoint encoded are
reused) and one write; the file is written to a temporary name and renamed,
so a run cut short leaves the previous file, never half of one. The exit's
save turns the automatic garbage collector off for the rest of the exit:
its allocations would otherwise start a full collection (45 ms in a JAX
program), and the interpreter's finalization collects once anyway. A forked child saves
nothing of its parent's; every failure is counted and swallowed.
"""

from __future__ import annotations

import atexit
import gc
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from metrics.export import at_exec
from metrics.recording import whoami
from tpu_info.contract.discovery_record import runtime_dir
from tpu_info.contract.model import Snapshot
from tpu_info.wire import runfile
from tpu_info.wire.encoder import PartCache, snapshot_to_bytes

OFF_WORDS = runfile.OFF_WORDS
RUNS_DIR = runfile.RUNS_DIR
KEEP_RUNS = 20
KEEP_BYTES = 256 * 1024 * 1024
# On SIGTERM the snapshot is built on a thread of its own, waited for this
# long: the signal may have stopped the main thread inside a hook holding a
# lock the snapshot needs, and then the run is not saved rather than hung.
SIGNAL_SAVE_S = 1.0
# Seconds between checkpoints of the run while it runs (what a program killed
# without its exit work leaves); a checkpoint is written when something changed,
# and at least every STILL_S while nothing does (a long compile, a stalled
# input pipeline: the file's uptime says how long the program was there).
CHECKPOINT_S = 30.0
STILL_S = 120.0
FIRST_CHECKPOINT_S = 1.0
# Until the first checkpoint that holds a step, the program's progress (a
# cheap probe: steps marked, events numbered) is looked at this often, and a
# change is saved at once: a program killed just after its first steps
# leaves them.
FIRST_STEP_POLL_S = 0.1
FIRST_STEP_WITHIN_S = 30.0
_saver: RunSaver | None = None  # the process's, for the in-process exporter's SIGTERM
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
                 failed: Callable[[str, BaseException], None], summary: bool = False,
                 progress: Callable[[], object] | None = None) -> None:
        self._final = final_snapshot
        self._progress = progress
        self.path, self._default = where if where is not None else (None, False)
        self._failed = failed
        self._summary = summary
        self.owner = os.getpid()
        self._done = threading.Lock()  # taken once: the first save is the only one
        self._ended = threading.Event()  # the end's save began: no more checkpoints
        self._error = ""  # the uncaught exception, as the excepthook saw it
        self._cache = PartCache()  # encodings the checkpoints made, reused by the end's save
        # A checkpoint's file lands only before the end's: its rename, under
        # this lock, checks that the end's save has not begun (a loaded machine
        # once let a slow checkpoint replace the end's file, "saved while running").
        self._file_lock = threading.Lock()
        self._execing = threading.Event()  # an exec's save landed: no checkpoint over it

    def saw_exception(self, exc: BaseException) -> None:
        """The program is ending by an uncaught exception (the excepthook's)."""
        self._error = f"{type(exc).__name__}: {exc}"[:1000]

    def checkpoints(self) -> None:
        """Writes the run as it stands every :data:`CHECKPOINT_S` (a daemon
        thread: it dies with the program), marked as not ended, until the
        end's own save."""
        last, wait, written = None, FIRST_CHECKPOINT_S, time.monotonic()
        if self._progress is not None and not self._first_step():
            return
        while not self._ended.wait(wait):
            wait = min(CHECKPOINT_S, 2 * wait)  # 1, 2, 4 ... s: a short run is kept too
            try:
                snap = self._final()
                key = (snap.last_seq, snap.steps.count if snap.steps is not None else 0,
                       len(snap.graphs))
                still = time.monotonic() - written >= STILL_S
                if (key != last or still) and not self._ended.is_set():
                    last, written = key, time.monotonic()
                    self._write(snap, "", "", checkpoint=True)
            except Exception as e:  # noqa: BLE001 - never into the program
                self._failed("saving.checkpoint", e)

    def _first_step(self) -> bool:
        """Checkpoints as soon as the program makes progress (``progress``
        changes: its first steps) and at :data:`FIRST_CHECKPOINT_S`, until
        one holds a step or :data:`FIRST_STEP_WITHIN_S` passed; a checkpoint
        without a step doubles the wait before the next (a handful of
        snapshots at most). False when the program's end came first."""
        assert self._progress is not None
        start = time.monotonic()
        due, next_ok, gap = start + FIRST_CHECKPOINT_S, start, FIRST_STEP_POLL_S
        seen = self._progress()
        while not self._ended.wait(FIRST_STEP_POLL_S):
            try:
                now, clock = self._progress(), time.monotonic()
                if clock - start > FIRST_STEP_WITHIN_S:
                    return True
                if not ((now != seen and clock >= next_ok) or clock >= due):
                    continue
                snap = self._final()
                if not self._ended.is_set():
                    self._write(snap, "", "", checkpoint=True)
                if snap.steps is not None and snap.steps.count:
                    return True
                seen, due, gap = now, float("inf"), 2 * gap
                next_ok = clock + gap
            except Exception as e:  # noqa: BLE001 - never into the program
                self._failed("saving.checkpoint", e)
                return True
        return False

    def save_at_exec(self) -> None:
        """Saves the run as it stands, ended by ``exec`` (the process becomes
        another program: no ``atexit``), on a thread of its own waited for at
        most :data:`SIGNAL_SAVE_S`; checkpoints leave it until
        :meth:`exec_failed`."""
        if os.getpid() != self.owner or self._ended.is_set() or self.path is None:
            return
        self._execing.set()

        def work() -> None:
            try:
                self._write(self._final(), "exec", "", exec_=True)
            except Exception as e:  # noqa: BLE001
                self._failed("saving.exec", e)

        done = threading.Thread(target=work, name="tpu-info-save-exec", daemon=True)
        done.start()
        done.join(SIGNAL_SAVE_S)

    def exec_failed(self) -> None:
        """The exec did not happen: the program goes on, and so do checkpoints."""
        self._execing.clear()

    def save(self, ended: str = "exit", signal: str = "") -> Path | None:
        """Writes the file (and the summary); the path, or None (done already,
        a forked child, saving off, or the write failed: counted, never raised)."""
        if os.getpid() != self.owner or not self._done.acquire(blocking=False):
            return None
        self._ended.set()
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

    def save_at_exit(self) -> Path | None:
        """:meth:`save` at interpreter exit (``atexit``), with the automatic
        garbage collector off from here to the process's end: the save's
        allocations would otherwise start a full collection, which costs a
        large program tens of milliseconds of its exit, and the interpreter's
        finalization runs one full collection anyway (whether or not it is
        enabled), so nothing the program leaves is uncollected."""
        if os.getpid() == self.owner and not self._ended.is_set():
            gc.disable()
        return self.save()

    def _write(self, snap: Snapshot, ended: str, signal: str,
               checkpoint: bool = False, exec_: bool = False) -> Path | None:
        if self.path is None:
            return None
        try:
            data = runfile.encode(snapshot_to_bytes(snap, self._cache), ended, time.time(),
                                  signal=signal,
                                  error=self._error if ended == "exception" else "")
            folder = self.path.parent
            if self._default:
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            with self._file_lock:
                if checkpoint and (self._ended.is_set() or self._execing.is_set()):
                    return None  # the end's save began while this one was encoding
                if exec_ and self._ended.is_set():
                    return None  # the program's own end came first
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
    an uncaught exception, Ctrl-C), and every :data:`CHECKPOINT_S` meanwhile
    from a daemon thread, so a program SIGTERM or SIGKILL ends without exit
    work still leaves its run (marked "ended without its exit work"). No
    SIGTERM handler of its own: a Python handler runs only once the main
    thread is back from the engine's call, which delays the program's end
    (metrics.export stops at once on SIGTERM; when it serves in-process its
    own handler saves first, :func:`on_sigterm`)."""
    global _saver
    _saver = saver
    chain_excepthook(saver)
    atexit.register(saver.save_at_exit)
    at_exec.register(saver.save_at_exec, saver.exec_failed)
    _save_before_jax_cleans_up(saver)
    if saver.path is not None:
        threading.Thread(target=saver.checkpoints, name="tpu-info-save", daemon=True).start()


def _save_before_jax_cleans_up(saver: RunSaver) -> None:
    """Moves the exit save after JAX's own exit handler in the ``atexit`` list
    once JAX is imported, so the save runs first: JAX's handler (registered
    when ``jax`` is imported) clears its backends, and the hook reads no
    device once they are gone. A program that installed the hook before
    importing JAX otherwise saved a run without its devices' memory."""
    from metrics.engines import importwatch

    def again() -> None:
        atexit.unregister(saver.save_at_exit)
        atexit.register(saver.save_at_exit)

    importwatch.when_imported("jax", again)


def on_sigterm() -> None:
    """The in-process exporter's SIGTERM handler, before the process dies by
    it: the run saved, on a thread of its own, waited for at most
    :data:`SIGNAL_SAVE_S` (the signal may have stopped the main thread inside
    a lock the snapshot needs: the last checkpoint stays, never a hang)."""
    saver = _saver
    if saver is None or os.getpid() != saver.owner:
        return
    done = threading.Thread(target=saver.save, args=("signal", "SIGTERM"),
                            name="tpu-info-save-end", daemon=True)
    done.start()
    done.join(SIGNAL_SAVE_S)


def start(final_snapshot: Callable[[], Snapshot], failed: Callable[[str, BaseException], None],
          program: str, setting: str | None = None, *, summary: bool = False,
          environ: Mapping[str, str] | None = None,
          progress: Callable[[], object] | None = None) -> RunSaver | None:
    """The process's saver, armed (None when there is nothing to do at the
    end: saving off and no summary; a failure is counted, never raised)."""
    try:
        where = target(setting, program, os.getpid(), time.time(), environ)
        if where is None and not summary:
            return None
        saver = RunSaver(final_snapshot, where, failed, summary, progress)
        arm(saver)
        return saver
    except Exception as e:  # noqa: BLE001 - the program runs on without a saved run
        failed("saving.start", e)
        return None


def start_from_config(save: str | None, final_snapshot: Callable[[], Snapshot],
                      failed: Callable[[str, BaseException], None],
                      progress: Callable[[], object] | None = None) -> RunSaver | None:
    """:func:`start` as ``install(save=)`` and the environment say
    (``TPU_INFO_SAVE``, ``TPU_INFO_SUMMARY``)."""
    from metrics import config

    global _started
    if _started is not None:
        return None  # one saver a process: the first install() decides
    _started = os.getpid()
    setting = save if save is not None else (config.text(config.SAVE) or None)
    program = whoami.program()
    return start(final_snapshot, failed, program, setting, summary=config.flag(config.SUMMARY),
                 progress=progress)
