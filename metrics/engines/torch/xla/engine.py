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
* Compilations with their cause, graph hash, step and the user's line,
  from torch_xla's own compile analyses (:mod:`.analyses`: it sets
  ``PT_XLA_DEBUG_LEVEL=1`` and a private ``PT_XLA_DEBUG_FILE`` at install,
  unless the program set them, and wraps ``torch_xla.sync`` to place each
  compile in its step).
* ``aten::*`` counters (ops that fell back to the CPU) become findings
  (``tpu_info.views.findings.cpu_fallbacks``).
* Device memory: ``xm.get_memory_info`` where the PJRT plugin supports it;
  on the CPU it raises ``UNIMPLEMENTED``, which is reported as the reason.

Private APIs used (behind checks): ``torch_xla._XLAC._get_graph_hash``
(:func:`graph_hash`), ``torch_xla._XLAC._xla_runtime_is_initialized``
(:func:`runtime_started`: nothing that starts the runtime is called before
the program started it).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, MutableMapping

import torch
import torch_xla
import torch_xla.debug.metrics as met

from metrics.engines import _foreign, device_profilers, ranks
from metrics.engines._frames import skip_prefixes
from metrics.engines._patching import Patches
from metrics.engines.base import EngineBase
from metrics.engines.torch.xla.analyses import ACTIVE, ENGINE, CompileAnalyses, wrap_sync
from metrics.recording.recorder import Recorder
from tpu_info.contract.model import (
    CounterReading,
    DeviceRecord,
    DistributionReading,
    MemoryReading,
    Unit,
)

__all__ = ["ENGINE", "TorchXlaEngine", "create", "graph_hash", "runtime_started"]

_KNOWN_UNITS = {"InboundData": Unit.BYTES, "OutboundData": Unit.BYTES,
                "TensorsGraphSize": Unit.NUMBER, "InputOutputAliasCount": Unit.NUMBER}


def graph_hash(tensors: Iterable[torch.Tensor]) -> str:
    """torch_xla's hash of the graph behind ``tensors`` (hex of its 16 bytes;
    not always equal to the ``Graph Hash`` its debug output prints)."""
    h = torch_xla._XLAC._get_graph_hash(list(tensors))
    return h.hex() if isinstance(h, (bytes, bytearray)) else str(h)


def runtime_started() -> bool:
    """Whether the program started the XLA runtime (its PJRT client). Until
    it did, the hook calls nothing that would start it (the device list,
    ``metrics_report()``, the rank): a ``torch_xla.launch`` parent that runs
    no XLA would hold its workers' devices, and tear the client down at exit.
    Unknown (a torch_xla without the probe) counts as not started."""
    started = getattr(torch_xla._XLAC, "_xla_runtime_is_initialized", None)
    return bool(started is not None and started())


class TorchXlaEngine(EngineBase):
    """Reads torch_xla's counters, metrics and compile analyses at scrape time."""

    name = ENGINE
    keeps_readings = True  # extra_readings: the engine's own counters
    device_trace_kind = device_profilers.TorchTrace

    def __init__(self, recorder: Recorder, explain_cache_misses: bool = True,
                 env: MutableMapping[str, str] | None = None,
                 debug_dir: str | None = None) -> None:
        self.rec = recorder
        self.degraded: list[str] = []
        self._explain = explain_cache_misses
        self._base = _foreign.Baseline()
        self._units: dict[str, Unit] = dict(_KNOWN_UNITS)
        self._patches = Patches(self.degraded)
        # The compile analyses and the step marks they are placed among.
        self.analyses = CompileAnalyses(recorder, self.degraded, skip_prefixes(torch, torch_xla),
                                        os.environ if env is None else env, debug_dir)

    # Install / uninstall ---------------------------------------------------

    def install(self) -> None:
        ACTIVE.analyses = self.analyses
        if self._explain and not self.analyses.capturing:
            self.analyses.capture()
        if not self._patches.has("sync"):
            self._patches.apply(torch_xla, "sync", wrap_sync)

    def uninstall(self) -> None:
        if ACTIVE.analyses is self.analyses:
            ACTIVE.analyses = None
        self._patches.restore()

    # Scrape time -----------------------------------------------------------

    def _unit(self, name: str) -> Unit:
        unit = self._units.get(name)
        if unit is None and not runtime_started():
            # torch_xla's report would start the runtime (see runtime_started).
            return Unit.TIME_NS
        if unit is None:
            for n, fields in _foreign.report_metrics(met.metrics_report()).items():
                if n not in self._units and "Accumulator" in fields:
                    self._units[n] = _foreign.unit_of_accumulator(fields["Accumulator"])
            unit = self._units.setdefault(name, Unit.TIME_NS)
        return unit

    def extra_readings(self) -> tuple[list[CounterReading], list[DistributionReading]]:
        """torch_xla's counters and metrics, read now; also ingests new
        compile analyses into the ledger."""
        self.analyses.poll()
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
        if not runtime_started():
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


def create(recorder: Recorder, explain_cache_misses: bool = True,
           **_: object) -> TorchXlaEngine:
    """The adapter ``metrics.install()`` uses."""
    return TorchXlaEngine(recorder, explain_cache_misses=explain_cache_misses)
