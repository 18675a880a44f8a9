"""torch._lazy (lazy-tensor core, TorchScript backend) engine hook.

What it records:

* The engine's own counters (``UncachedCompile``, ``CachedCompile``,
  ``MarkStep``, ``DeviceDataCacheMiss``, ``lazy::*`` op counters, ...) and
  metrics (``TensorsGraphSize``, ``DeviceLockWait``), read at scrape time and
  re-exported under their own names. They are never counted by the hook as
  well (see ``metrics.snapshot`` for how names shared with ours merge).
* Per ``torch._lazy.mark_step()`` (wrapped): whether it compiled (the
  engine's ``UncachedCompile`` moved) or ran a cached graph; its wall time
  as ``CompileTime`` (uncached steps: compile plus the first run) or
  ``ExecuteTime`` with ``ExecuteComputation`` (cached steps); the graph in
  the ledger with the user's ``mark_step`` line, and for a new graph at a
  line that compiled before, what changed (ops, constant shapes).

The graph hash: ``torch._lazy.computation.get_graph_hash`` needs the step's
live tensors, which the lazy-tensor core does not expose to Python at
``mark_step`` (it syncs every live tensor itself). So the hash is the sha256
of the TorchScript graph the step ran (``_get_latest_computation_graph``,
which the backend updates on cached runs too) with its ``[source=...]``
annotations removed: one hash per distinct graph, stable across runs and
when the source moves. Where the program syncs explicit tensors
(``torch._lazy.sync_multi``), :func:`graph_hash` gives the engine's own hash.

Private APIs used (each behind a check that degrades the feature):

* ``torch._C._lazy._counter_names`` / ``_counter_value`` / ``_metrics_report``
* ``torch._C._lazy_ts_backend._get_latest_computation_graph``
* ``torch._lazy.mark_step`` (wrapped as a module attribute: a program that
  did ``from torch._lazy import mark_step`` before install is not seen)

Reads of lazy tensors' values (``.item()``, ``.tolist()``, ``.cpu()``: each
runs the pending graph and waits) are counted per user line by
:mod:`metrics.engines.torch.syncs` (``sites()``).
"""

from __future__ import annotations

import collections
import hashlib
import os
import re
import time
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

import torch
import torch._lazy

from metrics.engines import _foreign, device_profilers, ranks
from metrics.engines._frames import skip_prefixes, user_location
from metrics.engines.base import EngineBase
from metrics.engines.torch import syncs as torch_syncs
from metrics.engines.torch.context import TorchContext
from metrics.recording.recorder import Recorder
from tpu_info.contract import catalog as names
from tpu_info.contract.cause_kinds import CauseKind
from tpu_info.contract.model import (
    FIRST_CALL,
    CounterReading,
    DeviceRecord,
    DistributionReading,
    EventKind,
    MemoryReading,
    RecompileCause,
    SiteReading,
)

ENGINE = "torch_lazy"
_SOURCE = re.compile(r'\[source="[^"]*"\]')
_OP = re.compile(r"\b(aten|prim|lazy)::[A-Za-z0-9_]+")
_CONST = re.compile(r"value=(\[[^\]]*\])")

_active: TorchLazyEngine | None = None


def normalize(graph_text: str) -> str:
    """The TorchScript graph without its source annotations."""
    return _SOURCE.sub("", graph_text)


def text_hash(graph_text: str) -> str:
    return hashlib.sha256(normalize(graph_text).encode()).hexdigest()[:32]


def graph_hash(tensors: Iterable[torch.Tensor]) -> str:
    """The lazy-tensor core's own hash of the graph behind ``tensors`` (hex)."""
    from torch._lazy import computation

    h = computation.get_graph_hash(list(tensors))
    return h.hex() if isinstance(h, (bytes, bytearray)) else str(h)


def diff_graphs(old: str, new: str) -> str:
    """What changed between two graphs, in a few words (ops, constants)."""
    o_ops = collections.Counter(m.group(0) for m in _OP.finditer(old))
    n_ops = collections.Counter(m.group(0) for m in _OP.finditer(new))
    parts = []
    added = sorted((n_ops - o_ops).keys())
    removed = sorted((o_ops - n_ops).keys())
    if added:
        parts.append("new ops " + ", ".join(added[:4]))
    if removed:
        parts.append("ops gone " + ", ".join(removed[:4]))
    o_c, n_c = _CONST.findall(old), _CONST.findall(new)
    changed = [(a, b) for a, b in zip(o_c, n_c, strict=False) if a != b]
    if changed:
        a, b = changed[0]
        parts.append(f"shape constant {a} -> {b}")
    elif len(o_c) != len(n_c):
        parts.append(f"{len(n_c) - len(o_c):+d} constants")
    return "graph changed: " + ("; ".join(parts) if parts else "same ops, other structure")


class TorchLazyEngine(EngineBase):
    """Wraps ``torch._lazy.mark_step`` and reads the engine's counters."""

    name = ENGINE
    keeps_readings = True  # extra_readings: the engine's own counters
    device_trace_kind = device_profilers.TorchTrace

    def __init__(self, recorder: Recorder, **_: object) -> None:
        # What the parts share: the recorder, the notes, the patches, the syncs.
        self.ctx = ctx = TorchContext(ENGINE, recorder, skip_prefixes(torch))
        self.rec = recorder
        self.degraded = ctx.degraded
        self._base = _foreign.Baseline()
        self._hash_cache: dict[tuple[int, int], str] = {}
        self._last_text_at: dict[str, str] = {}  # location -> last compiled graph text
        self._C: ModuleType | None = getattr(torch._C, "_lazy", None)
        self._latest: Callable[[], str] | None = None
        try:
            import torch._C._lazy_ts_backend as ts

            self._latest = getattr(ts, "_get_latest_computation_graph", None)
        except ImportError:
            pass
        if self._latest is None:
            self.degraded.append("TorchScript backend hooks unavailable: no graph hashes")
        if self._C is None or not hasattr(self._C, "_counter_value"):
            self.degraded.append("torch._C._lazy counters unavailable")
            self._C = None
        self._compile_time = recorder.distribution(names.COMPILE_TIME)
        self._exec_time = recorder.distribution(names.EXECUTE_TIME)
        self._exec_count = recorder.counter(names.EXECUTE_COUNT)

    def install(self) -> None:
        global _active
        original = getattr(torch._lazy, "mark_step", None)
        if original is None or self._C is None:
            self.degraded.append("torch._lazy.mark_step missing: steps are not timed")
        elif not self.ctx.patches.has("mark_step"):
            self.ctx.patches.apply(torch._lazy, "mark_step", _wrap_mark_step)
        _active = self
        self.ctx.syncs = torch_syncs.attach(self.ctx)  # .item()/.tolist()/.cpu() of lazy tensors

    def uninstall(self) -> None:
        global _active
        if _active is self:
            _active = None
        torch_syncs.detach(self.ctx)
        self.ctx.syncs = None
        self.ctx.patches.restore()

    def sites(self) -> list[SiteReading]:
        """Reads of tensor values per user line (:mod:`~metrics.engines.torch.syncs`): each
        one of a lazy tensor runs the graph pending so far and waits."""
        syncs = self.ctx.syncs
        return syncs.sites(self.ctx) if syncs is not None else []

    def blind_spots(self) -> list[str]:
        syncs = self.ctx.syncs
        return syncs.blind_spots(self.ctx) if syncs is not None else []

    # Hot path (guarded) ----------------------------------------------------

    def compiles(self) -> tuple[int, int]:
        """The engine's (UncachedCompile, CachedCompile) counters now."""
        c = self._C
        assert c is not None  # mark_step is wrapped only with the counters there
        return (c._counter_value("UncachedCompile") or 0, c._counter_value("CachedCompile") or 0)

    def on_step(self, before: tuple[int, int], elapsed_ns: int) -> None:
        try:
            after = self.compiles()
            uncached = after[0] > before[0]
            if not uncached and after[1] == before[1]:
                return  # nothing was pending: no graph ran
            text = self._latest() if self._latest is not None else ""
            key = (len(text), hash(text))
            h = self._hash_cache.get(key)
            if h is None:
                h = text_hash(text) if text else "unknown"
                if len(self._hash_cache) > 4096:
                    self._hash_cache.clear()
                self._hash_cache[key] = h
            location = user_location(self.ctx.skip, 3)
            name = f"lazy({os.path.basename(location) if location else '?'})"
            ledger = self.rec.ledger
            if uncached:
                seconds = elapsed_ns / 1e9
                self._compile_time.observe(elapsed_ns)
                old = self._last_text_at.get(name)
                description = FIRST_CALL if old is None else diff_graphs(old, text)
                self._last_text_at[name] = text
                cause = RecompileCause(
                    time_unix=time.time(), description=description, location=location,
                    kind=CauseKind.FIRST_CALL if old is None else CauseKind.OTHER)
                ledger.compiled(h, name, ENGINE, seconds, (), cause)
                kind = EventKind.COMPILE if old is None else EventKind.RECOMPILE
                self.rec.events.emit(kind, name, h, "" if old is None else description,
                                     location, seconds)
            else:
                self._exec_count.inc()
                self._exec_time.observe(elapsed_ns)
                ledger.executed(h, name, ENGINE)
        except Exception as e:  # noqa: BLE001
            self.rec.hook_failed("torch_lazy.mark_step", e)

    # Scrape time -----------------------------------------------------------

    def extra_readings(self) -> tuple[list[CounterReading], list[DistributionReading]]:
        """The engine's own counters and metrics, read now."""
        c = self._C
        if c is None:
            return [], []
        counters = _foreign.counter_readings(
            ((n, c._counter_value(n)) for n in c._counter_names()), self._base)
        dists = []
        for name, fields in _foreign.report_metrics(c._metrics_report()).items():
            try:
                count = int(fields.get("TotalSamples", "0"))
                acc = fields.get("Accumulator", "0")
                unit = _foreign.unit_of_accumulator(acc)
                total = _foreign.parse_value(acc)
                count, total = self._base.metric(name, count, total)
                if not count:
                    continue
                items = [i.strip().partition("=")
                         for i in fields.get("Percentiles", "").split(";") if i.strip()]
                pct = tuple((float(p.rstrip("%")), _foreign.parse_value(v)) for p, _, v in items)
                dists.append(_foreign.distribution(name, unit, count, total, (), pct))
            except (ValueError, KeyError) as e:
                self.rec.hook_failed("torch_lazy.metrics", e)
        return counters, dists

    def clear_readings(self, counters: bool = True, metrics: bool = True) -> None:
        c = self._C
        if c is None:
            return
        if counters:
            self._base.counters = {n: c._counter_value(n) or 0 for n in c._counter_names()}
        if metrics:
            for name, fields in _foreign.report_metrics(c._metrics_report()).items():
                self._base.metrics[name] = (int(fields.get("TotalSamples", "0")),
                                            _foreign.parse_value(fields.get("Accumulator", "0")))

    def devices(self) -> list[DeviceRecord]:
        return [DeviceRecord(
            id=0, kind="lazy (TorchScript)", platform="lazy",
            memory=MemoryReading(None, source="none",
                                 reason="torch._lazy keeps no device memory statistics"),
            busy_reason="busy % is not measured by the torch hook")]

    def rank(self) -> ranks.Rank | None:
        return ranks.from_torch_distributed()

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__}


def create(recorder: Recorder, **options: object) -> TorchLazyEngine:
    """The adapter ``metrics.install()`` uses."""
    return TorchLazyEngine(recorder, **options)


def _wrap_mark_step(original: Callable[..., Any]) -> Callable[..., Any]:
    def mark_step(*args: Any, **kwargs: Any) -> Any:
        eng = _active
        if eng is None:
            return original(*args, **kwargs)
        try:
            before = eng.compiles()
        except Exception as e:  # noqa: BLE001
            eng.rec.hook_failed("torch_lazy.mark_step", e)
            return original(*args, **kwargs)
        start = time.perf_counter_ns()
        out = original(*args, **kwargs)
        eng.on_step(before, time.perf_counter_ns() - start)
        return out

    mark_step.__wrapped__ = original  # type: ignore[attr-defined]
    mark_step.__doc__ = original.__doc__
    return mark_step
