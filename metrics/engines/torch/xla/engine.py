"""PyTorch/XLA (torch_xla on PJRT) engine hook.

Nothing runs on the program's hot path: everything is read at scrape time.

* torch_xla's own counters and metrics (``CompileTime``, ``ExecuteTime``,
  ``TransferToDeviceTime``, ``OutboundData``, ``InboundData``,
  ``CachedCompile``, ``UncachedCompile``, ``MarkStep``, ``xla::*``,
  ``aten::*``, ...) are re-exported under their own names, read with
  ``torch_xla.debug.metrics`` (``counter_names``/``counter_value``,
  ``metric_names``/``metric_data``). Units come from torch_xla's own report
  text, parsed once per new name. Percentiles are over the samples torch_xla
  keeps (its last 1024, ``XLA_METRICS_SAMPLES``); counts and totals are exact.
* Compilations with their cause, graph hash and the user's line: unless the
  program set ``PT_XLA_DEBUG_LEVEL`` itself, :meth:`install` sets
  ``PT_XLA_DEBUG_LEVEL=1`` (one analysis per compile, none per execution)
  and ``PT_XLA_DEBUG_FILE`` to a private file, which is read at scrape time
  into the graph ledger. torch_xla reads both variables when it first
  compiles, so install before the first step. A program that set its own
  ``PT_XLA_DEBUG_FILE`` keeps it; we only read it.
* ``aten::*`` counters (ops that fell back to the CPU) become findings
  (``tpu_info.views.findings.cpu_fallbacks``).
* Device memory: ``xm.get_memory_info`` where the PJRT plugin supports it;
  on the CPU it raises ``UNIMPLEMENTED``, which is reported as the reason.

* The step each compile happened in: ``torch_xla.sync`` (what
  ``xm.mark_step()`` and the device loaders call; wrapping the C step marker
  instead would hide the ``sync`` frame torch_xla names its cause by) is
  wrapped to append its end time (one append per step), and each
  compile's ``CompileTime`` sample time is placed among them at scrape time
  (a step is one sync: a device loader syncs once per batch). A new graph at
  a line in the step right after the last one there is torch_xla's warm-up
  (step 0 has no optimizer state yet); one after steps without a compile
  there means the inputs changed (a short last batch, a new batch size).

Private APIs used (behind checks): ``torch_xla._XLAC._get_graph_hash``
(:func:`graph_hash`), ``torch_xla._XLAC._xla_runtime_is_initialized``
(devices are not read before the program started the runtime).
"""

from __future__ import annotations

import atexit
import bisect
import collections
import os
import tempfile
import threading
import time
from typing import Any

import torch
import torch_xla
import torch_xla.debug.metrics as met

from metrics import config
from metrics.engines import _foreign, device_profilers, ranks
from metrics.engines._frames import skip_prefixes
from metrics.engines._patching import Patches
from metrics.engines.base import EngineBase
from metrics.engines.torch.xla.debug import CompileAnalysis, DebugTail
from metrics.recording.recorder import Recorder
from tpu_info.contract.cause_kinds import CauseKind, xla_warm_up
from tpu_info.contract.model import (
    FIRST_CALL,
    CounterReading,
    DeviceRecord,
    DistributionReading,
    EventKind,
    MemoryReading,
    RecompileCause,
    Unit,
)

ENGINE = "torch_xla"
LEVEL_VAR, FILE_VAR = "PT_XLA_DEBUG_LEVEL", "PT_XLA_DEBUG_FILE"
# The pid whose hook made PT_XLA_DEBUG_FILE: a worker that inherits the
# variable (torch_xla.launch, xmp.spawn) makes its own file instead.
OWNER_VAR = config.XLA_DEBUG_OWNER.name
VALUE_ACCESS = "access tensor value before"  # torch_xla's cause for .item() before the sync
_KNOWN_UNITS = {"InboundData": Unit.BYTES, "OutboundData": Unit.BYTES,
                "TensorsGraphSize": Unit.NUMBER, "InputOutputAliasCount": Unit.NUMBER}

_active: TorchXlaEngine | None = None


def graph_hash(tensors: Any) -> str:
    """torch_xla's hash of the graph behind ``tensors`` (hex of its 16 bytes;
    not always equal to the ``Graph Hash`` its debug output prints)."""
    h = torch_xla._XLAC._get_graph_hash(list(tensors))
    return h.hex() if isinstance(h, (bytes, bytearray)) else str(h)


class TorchXlaEngine(EngineBase):
    """Reads torch_xla's counters, metrics and compile analyses at scrape time."""

    name = ENGINE
    keeps_readings = True  # extra_readings: the engine's own counters
    device_trace_kind = device_profilers.TorchTrace

    def __init__(self, recorder: Recorder, explain_cache_misses: bool = True,
                 env: dict[str, str] | None = None, debug_dir: str | None = None) -> None:
        self.rec = recorder
        self.degraded: list[str] = []
        self._explain = explain_cache_misses
        self._env = os.environ if env is None else env
        self._debug_dir = debug_dir
        self._tail: DebugTail | None = None
        self._pid = os.getpid()
        self._own_file = False
        self._base = _foreign.Baseline()
        self._units: dict[str, Unit] = dict(_KNOWN_UNITS)
        self._lock = threading.Lock()
        self._compiles_seen = 0
        self._waiting: collections.deque[tuple[float, CompileAnalysis]] = collections.deque()
        self._last_at: dict[str, CompileAnalysis] = {}
        self._last_step_at: dict[str, int] = {}
        self._skip = skip_prefixes(torch, torch_xla)
        self._patches = Patches(self.degraded)
        # End times of the last step marks (appended by the wrapped step marker).
        self.step_ends: collections.deque[float] = collections.deque(maxlen=STEPS_KEPT)
        self.steps_marked = 0

    # Install / uninstall ---------------------------------------------------

    def install(self) -> None:
        global _active
        _active = self
        if self._explain and self._tail is None:
            self._capture_analyses()
        if not self._patches.has("sync"):
            self._patches.apply(torch_xla, "sync", _wrap_sync)

    def uninstall(self) -> None:
        global _active
        if _active is self:
            _active = None
        self._patches.restore()

    def step_of(self, when: float) -> int | None:
        """The 0-based step a moment fell in (step marks ended before it);
        None when it is older than the marks kept."""
        ends = list(self.step_ends)
        dropped = self.steps_marked - len(ends)
        i = bisect.bisect_right(ends, when)
        if i == 0 and dropped:
            return None
        return dropped + i

    def _capture_analyses(self) -> None:
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

    # Scrape time -----------------------------------------------------------

    def _unit(self, name: str) -> Unit:
        unit = self._units.get(name)
        if unit is None:
            for n, fields in _foreign.report_metrics(met.metrics_report()).items():
                if n not in self._units and "Accumulator" in fields:
                    self._units[n] = _foreign.unit_of_accumulator(fields["Accumulator"])
            unit = self._units.setdefault(name, Unit.TIME_NS)
        return unit

    def extra_readings(self) -> tuple[list[CounterReading], list[DistributionReading]]:
        """torch_xla's counters and metrics, read now; also ingests new
        compile analyses into the ledger."""
        self.poll_analyses()
        counters = _foreign.counter_readings(
            ((n, met.counter_value(n)) for n in met.counter_names()), self._base)
        dists = []
        for name in met.metric_names():
            data = met.metric_data(name)
            if not data:
                continue
            count, total, samples = data
            count, total = self._base.metric(name, int(count), float(total))
            if not count:
                continue
            dists.append(_foreign.distribution(name, self._unit(name), count, total,
                                               tuple((float(t), float(v)) for t, v in samples)))
        return counters, dists

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

    def poll_analyses(self) -> int:
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
                done = int(data[0]) if data else None
                n = 0
                # torch_xla writes the analysis before it compiles: a block whose
                # CompileTime sample is not there yet waits (its time and its sync
                # decide warm-up vs new shapes), unless it waited too long.
                while self._waiting:
                    since, block = self._waiting[0]
                    if done is not None and self._compiles_seen >= done and \
                            now - since < ANALYSIS_WAIT_S:
                        break
                    self._waiting.popleft()
                    self._ingest(block, data)
                    n += 1
                return n
            except Exception as e:  # noqa: BLE001
                self.rec.hook_failed("torch_xla.analyses", e)
                return 0

    def _ingest(self, block: CompileAnalysis, compile_time: Any) -> None:
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
        if previous is None:
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
                               location=location, kind=kind, sync=sync, syncs_after=syncs_after)
        self.rec.ledger.compiled(block.graph_hash, name, ENGINE, seconds, signature, cause)
        kind = EventKind.COMPILE if previous is None else EventKind.RECOMPILE
        self.rec.events.emit(kind, name, block.graph_hash,
                             block.cause if previous is None else description, location, seconds)

    def clear_readings(self, counters: bool = True, metrics: bool = True) -> None:
        if counters:
            self._base.counters = {n: met.counter_value(n) or 0 for n in met.counter_names()}
        if metrics:
            for name in met.metric_names():
                data = met.metric_data(name)
                if data:
                    self._base.metrics[name] = (int(data[0]), float(data[1]))

    def devices(self) -> list[DeviceRecord]:
        """One record per local XLA device once the program started the runtime."""
        xlac = torch_xla._XLAC
        started = getattr(xlac, "_xla_runtime_is_initialized", None)
        if started is not None and not started():
            return []
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr

        platform = xr.device_type() or "xla"
        out = []
        for i, name in enumerate(xm.get_xla_supported_devices() or []):
            try:
                info = xm.get_memory_info(torch.device(name))
                used = info.get("bytes_used")
                limit = info.get("bytes_limit")
                peak = info.get("peak_bytes_used")
                mem = MemoryReading(used, peak, limit, source="memory_stats")
            except Exception as e:  # noqa: BLE001 - CPU: UNIMPLEMENTED
                reason = str(e).replace("Bad StatusOr access: ", "").strip()
                mem = MemoryReading(None, source="none",
                                    reason=f"xm.get_memory_info: {reason}")
            out.append(DeviceRecord(id=i, kind=f"{platform} ({name})", platform=platform.lower(),
                                    memory=mem,
                                    busy_reason="busy % is not measured by the torch_xla hook"))
        return out

    def rank(self) -> ranks.Rank | None:
        return ranks.from_torch_xla() or ranks.from_torch_distributed()

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__, "torch_xla": torch_xla.__version__}


ANALYSIS_WAIT_S = 30.0  # a compile analysis waits this long for its CompileTime sample
STEPS_KEPT = 4096  # step marks kept for placing compiles (older compiles: step unknown)


def _wrap_sync(original: Any) -> Any:
    clock = time.time  # CompileTime's sample clock

    def sync(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        eng = _active
        if eng is not None:
            eng.step_ends.append(clock())
            eng.steps_marked += 1
        return out

    sync.__wrapped__ = original  # type: ignore[attr-defined]
    sync.__doc__ = original.__doc__
    return sync


def _spawn_without_debug_file(original: Any, env: Any) -> Any:
    def spawn(fn: Any, nprocs: Any = None, *args: Any, **kwargs: Any) -> Any:
        if nprocs == 1 or _active is None:
            return original(fn, nprocs, *args, **kwargs)  # nprocs 1: fn runs in this process
        saved = {v: env.pop(v) for v in (FILE_VAR, LEVEL_VAR, OWNER_VAR) if v in env}
        try:
            return original(fn, nprocs, *args, **kwargs)
        finally:
            env.update(saved)

    spawn._tpu_info = True  # type: ignore[attr-defined]
    spawn.__wrapped__ = original  # type: ignore[attr-defined]
    return spawn


def create(recorder: Recorder, explain_cache_misses: bool = True, **_: Any) -> TorchXlaEngine:
    """The adapter ``metrics.install()`` uses."""
    return TorchXlaEngine(recorder, explain_cache_misses=explain_cache_misses)
