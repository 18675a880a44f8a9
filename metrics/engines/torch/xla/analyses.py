"""torch_xla's compilations, with their cause, graph hash, step and the
user's line, read at scrape time from its own analyses.

Unless the program set ``PT_XLA_DEBUG_LEVEL`` itself, :meth:`CompileAnalyses.capture`
sets ``PT_XLA_DEBUG_LEVEL=1`` (one analysis per compile, none per execution)
and ``PT_XLA_DEBUG_FILE`` to a private file, which :meth:`CompileAnalyses.poll`
reads (:mod:`.debug`) into the graph ledger. torch_xla reads both variables
when it first compiles, so install before the first step. A program that set
its own ``PT_XLA_DEBUG_FILE`` keeps it; we only read it.

The step each compile happened in: ``torch_xla.sync`` (what
``xm.mark_step()`` and the device loaders call; wrapping the C step marker
instead would hide the ``sync`` frame torch_xla names its cause by) is
wrapped to append its end time (one append per step), and each compile's
``CompileTime`` sample time is placed among them at scrape time (a step is
one sync: a device loader syncs once per batch). A new graph at a line in
the step right after the last one there is torch_xla's warm-up (step 0 has
no optimizer state yet); one after steps without a compile there means the
inputs changed (a short last batch, a new batch size).
"""

from __future__ import annotations

import atexit
import bisect
import collections
import os
import tempfile
import threading
import time
from collections.abc import Callable, MutableMapping
from typing import Any

import torch_xla.debug.metrics as met

from metrics import config
from metrics.engines.torch.xla.debug import CompileAnalysis, DebugTail
from metrics.recording.recorder import Recorder
from tpu_info.contract.cause_kinds import CauseKind, xla_warm_up
from tpu_info.contract.model import FIRST_CALL, EventKind, RecompileCause

__all__ = ["ENGINE", "ACTIVE", "CompileAnalyses", "wrap_sync"]

ENGINE = "torch_xla"
LEVEL_VAR, FILE_VAR = "PT_XLA_DEBUG_LEVEL", "PT_XLA_DEBUG_FILE"
# The pid whose hook made PT_XLA_DEBUG_FILE: a worker that inherits the
# variable (torch_xla.launch, xmp.spawn) makes its own file instead.
OWNER_VAR = config.XLA_DEBUG_OWNER.name
VALUE_ACCESS = "access tensor value before"  # torch_xla's cause for .item() before the sync
# Where torch_xla runs step closures (xm.add_step_closure), after the sync.
STEP_CLOSURES = "_run_step_closures"
ANALYSIS_WAIT_S = 30.0  # a compile analysis waits this long for its CompileTime sample
STEPS_KEPT = 4096  # step marks kept for placing compiles (older compiles: step unknown)

# torch_xla's ``metric_data``: (total samples, accumulator, [(unix time, value), ...]).
MetricData = tuple[float, float, list[tuple[float, float]]]


class CompileAnalyses:
    """The analyses torch_xla writes, the step marks they are placed among,
    and the ledger entries they become (one per engine)."""

    def __init__(self, recorder: Recorder, degraded: list[str], skip: tuple[str, ...],
                 env: MutableMapping[str, str], debug_dir: str | None = None) -> None:
        self.rec = recorder
        self.degraded = degraded
        self._skip = skip
        self._env = env
        self._debug_dir = debug_dir
        self._tail: DebugTail | None = None
        self._pid = os.getpid()
        self._own_file = False
        self._lock = threading.Lock()
        self._compiles_seen = 0
        self._waiting: collections.deque[tuple[float, CompileAnalysis]] = collections.deque()
        self._last_at: dict[str, CompileAnalysis] = {}
        self._last_step_at: dict[str, int] = {}
        # End times of the last step marks (appended by the wrapped step marker).
        self.step_ends: collections.deque[float] = collections.deque(maxlen=STEPS_KEPT)
        self.steps_marked = 0

    @property
    def capturing(self) -> bool:
        """A debug file is being read."""
        return self._tail is not None

    def step_of(self, when: float) -> int | None:
        """The 0-based step a moment fell in (step marks ended before it);
        None when it is older than the marks kept."""
        ends = list(self.step_ends)
        dropped = self.steps_marked - len(ends)
        i = bisect.bisect_right(ends, when)
        if i == 0 and dropped:
            return None
        return dropped + i


    def capture(self) -> None:
        """Has torch_xla write its compile analyses to a file this hook reads
        (see the module docstring)."""
        env = self._env
        self._pid = os.getpid()
        owner = env.get(OWNER_VAR)
        if env.get(FILE_VAR) and owner and owner != str(self._pid):
            # Inherited from the hooked parent: that file is the parent's.
            for var in (FILE_VAR, LEVEL_VAR, OWNER_VAR):
                env.pop(var, None)
        if env.get(FILE_VAR):
            self._tail = DebugTail(env[FILE_VAR])
            if not env.get(LEVEL_VAR) and not env.get("PT_XLA_DEBUG"):
                env[LEVEL_VAR] = "1"
            return
        if env.get(LEVEL_VAR) or env.get("PT_XLA_DEBUG"):
            self.degraded.append(f"{LEVEL_VAR} was set without {FILE_VAR}: torch_xla prints its "
                                 "compile analyses to stderr, where the hook cannot read them")
            return
        try:
            directory = tempfile.mkdtemp(prefix="tpu-info-xla-", dir=self._debug_dir)
            path = os.path.join(directory, "pt_xla_debug.txt")
            open(path, "a").close()
        except OSError as e:
            self.degraded.append(f"no file for torch_xla's compile analyses: {e}")
            return
        env[LEVEL_VAR], env[FILE_VAR], env[OWNER_VAR] = "1", path, str(self._pid)
        self._tail, self._own_file = DebugTail(path), True
        self._hook_spawn()
        atexit.register(self._tail.remove)
        if (met.counter_value("UncachedCompile") or 0) > 0:
            self.degraded.append("torch_xla compiled before install(): it may have read "
                                 f"{LEVEL_VAR} already, so compile causes can be missing")


    def _hook_spawn(self) -> None:
        """Workers of ``torch_xla.launch`` / ``xmp.spawn`` start without our
        debug file (a hooked worker makes its own): torch_xla would append
        their analyses to it, and this process would list their graphs."""
        try:
            from torch_xla._internal import pjrt
        except Exception as e:  # noqa: BLE001
            self.degraded.append(f"torch_xla._internal.pjrt unavailable: {e}")
            return
        if not hasattr(pjrt, "spawn"):
            self.degraded.append("torch_xla._internal.pjrt.spawn missing: workers inherit the "
                                 "debug file")
            return
        if not getattr(pjrt.spawn, "_tpu_info", False):
            pjrt.spawn = _spawn_without_debug_file(pjrt.spawn, self._env)


    def poll(self) -> int:
        """Reads new compile analyses into the ledger; returns how many."""
        tail = self._tail
        if tail is None or self._pid != os.getpid():
            return 0  # a forked child: the file is its parent's
        with self._lock:
            try:
                now = time.monotonic()
                self._waiting.extend((now, b) for b in tail.read())
                if not self._waiting:
                    return 0
                data = met.metric_data("CompileTime")
                # No CompileTime yet: the first compile is still running.
                done = int(data[0]) if data else 0
                n = 0
                # torch_xla writes the analysis before it compiles: a block whose
                # CompileTime sample is not there yet waits (its time and its sync
                # decide warm-up vs new shapes), unless it waited too long.
                while self._waiting:
                    since, block = self._waiting[0]
                    if self._compiles_seen >= done and now - since < ANALYSIS_WAIT_S:
                        break
                    self._waiting.popleft()
                    self._ingest(block, data)
                    n += 1
                return n
            except Exception as e:  # noqa: BLE001
                self.rec.hook_failed("torch_xla.analyses", e)
                return 0


    def _ingest(self, block: CompileAnalysis, compile_time: MetricData | None) -> None:
        index = self._compiles_seen
        self._compiles_seen += 1
        seconds, step = 0.0, None
        if compile_time:
            total, _, samples = compile_time
            first = int(total) - len(samples)
            if first <= index < int(total):
                seconds = float(samples[index - first][1]) / 1e9
                step = self.step_of(float(samples[index - first][0]))
        frame = block.user_frame(self._skip)
        location = f"{frame[1]}:{frame[2]}" if frame else None
        name = f"xla({os.path.basename(frame[1])}:{frame[2]})" if frame else "xla(?)"
        previous = self._last_at.get(name)
        self._last_at[name] = block
        before = self._last_step_at.get(name)
        if step is not None:
            self._last_step_at[name] = step
        sync = syncs_after = None
        was = now = None  # graph inputs and outputs, where they changed
        in_closure = VALUE_ACCESS in block.cause and any(
            f[0] == STEP_CLOSURES for f in block.frames)
        if in_closure:
            # torch_xla calls it a read before the sync, but a step closure runs
            # after it: the read's own small graph, not a cut in the step's.
            kind = CauseKind.XLA_CLOSURE_READ
            description = ("a tensor's value read in a step closure (xm.add_step_closure, run "
                           f"after the sync); torch_xla: {block.cause}")
        elif previous is None:
            # A value read before the sync is news even on its first compile:
            # keep torch_xla's own words (findings.xla_value_access names it).
            kind = CauseKind.XLA_VALUE_ACCESS if VALUE_ACCESS in block.cause \
                else CauseKind.FIRST_CALL
            description = (f"torch_xla: {block.cause}" if VALUE_ACCESS in block.cause
                           else FIRST_CALL)
        else:
            changes = []
            if previous.inputs != block.inputs:
                changes.append(f"graph inputs {previous.inputs} -> {block.inputs}")
            if previous.outputs != block.outputs:
                changes.append(f"graph outputs {previous.outputs} -> {block.outputs}")
            if changes:
                was = f"{previous.inputs} inputs, {previous.outputs} outputs"
                now = f"{block.inputs} inputs, {block.outputs} outputs"
            when = ""
            if step is not None:
                # The kind depends on it (warm-up vs changed inputs).
                sync = step + 1
                when = f" at sync {sync}"
                if before is not None:
                    syncs_after = max(0, step - before - 1)
                    when += f", {syncs_after} syncs after the last new graph at this line"
            if VALUE_ACCESS in block.cause:
                kind = CauseKind.XLA_VALUE_ACCESS
            elif sync is None:
                kind = CauseKind.OTHER
            else:
                kind = CauseKind.XLA_WARM_UP if xla_warm_up(sync, syncs_after) \
                    else CauseKind.XLA_NEW_GRAPH
            description = "new graph" + when + (
                f" ({', '.join(changes)})" if changes else
                " (same graph inputs and outputs: new shapes or values)") + (
                f"; torch_xla: {block.cause}" if block.cause else "")
        signature = (f"inputs: {block.inputs}", f"outputs: {block.outputs}")
        cause = RecompileCause(time_unix=time.time(), description=description,
                               location=location, kind=kind, sync=sync, syncs_after=syncs_after,
                               before=was, after=now)
        self.rec.ledger.compiled(block.graph_hash, name, ENGINE, seconds, signature, cause)
        event = EventKind.COMPILE if previous is None else EventKind.RECOMPILE
        self.rec.events.emit(event, name, block.graph_hash,
                             block.cause if previous is None else description, location, seconds)


class Active:
    """The slot of the installed engine's analyses: the patched ``sync`` and
    ``spawn`` outlive an install and look it up at each call."""

    __slots__ = ("analyses",)

    def __init__(self) -> None:
        self.analyses: CompileAnalyses | None = None


ACTIVE = Active()


def wrap_sync(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch_xla.sync`` noting when each step ended."""
    clock = time.time  # CompileTime's sample clock

    def sync(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        analyses = ACTIVE.analyses
        if analyses is not None:
            analyses.step_ends.append(clock())
            analyses.steps_marked += 1
        return out

    sync.__wrapped__ = original  # type: ignore[attr-defined]
    sync.__doc__ = original.__doc__
    return sync


def _spawn_without_debug_file(original: Callable[..., Any],
                              env: MutableMapping[str, str]) -> Callable[..., Any]:
    def spawn(fn: Callable[..., Any], nprocs: int | None = None, *args: Any,
              **kwargs: Any) -> Any:
        if nprocs == 1 or ACTIVE.analyses is None:
            return original(fn, nprocs, *args, **kwargs)  # nprocs 1: fn runs in this process
        saved = {v: env.pop(v) for v in (FILE_VAR, LEVEL_VAR, OWNER_VAR) if v in env}
        try:
            return original(fn, nprocs, *args, **kwargs)
        finally:
            env.update(saved)

    spawn._tpu_info = True  # type: ignore[attr-defined]
    spawn.__wrapped__ = original  # type: ignore[attr-defined]
    return spawn
