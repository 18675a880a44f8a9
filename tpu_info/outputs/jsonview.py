"""``tpu-info --json``: the same views as the tables, as a versioned document.

Schema ``tpu-info/v1`` (:data:`JSON_SCHEMA` is its JSON Schema). Fields are
only ever added within v1; a rename or removal bumps the version. A value
that could not be read is ``null`` and its reason is in the nearest
``reasons`` map and in the top-level ``na`` list, exactly as ``doctor``
prints them.

Top level::

    schema            "tpu-info/v1"
    tpu_info_version  this tool's version
    host, time_unix   where and when
    libtpu_version    string or null
    accelerator_type  "TPU v5e x1" (the usable chips) or null
    chips             every local accelerator, usable here or not: name,
                      index, vendor, kind, device_path, pci_address,
                      usable (its device node exists here; tables list
                      only these without --all), hbm_used_bytes,
                      hbm_total_bytes, hbm_source ("libtpu"|"hook"|"nvml"|
                      "spec"|null), busy_percent, busy_source ("libtpu"|
                      "nvml"|"estimate"|null), cores_per_chip,
                      devices_per_chip, owner_pids, owners[{pid, name,
                      user, command}], reasons{field: why}
    local_reasons     {"tpu"|"gpu"|"owners": why} for the local scan
    targets           one per target (--pid/--user: only those processes'): target,
                      source ("hook"|"libtpu"),
                      ok, error, process{pid, name, user, host, engine,
                      versions, argv, start_time_unix, waiting: [engine],
                      process_index, process_count (the rank; null if unknown)} or null,
                      uptime_seconds, steps (null if never marked),
                      compiles, cache_hits, hbm_used_bytes, hbm_limit_bytes,
                      devices[{id, kind, platform, hbm_used_bytes,
                      hbm_peak_bytes, hbm_limit_bytes, memory_source,
                      busy_percent, busy_source ("libtpu": the chip's duty
                      cycle, "estimate": the hook's, or null), reasons}],
                      transfers{h2d|d2h: {count, bytes, p50_ns, p90_ns,
                      p95_ns, p999_ns, timed, reasons}},
                      graphs[{hash, name, engine, compiles, cache_hits,
                      compile_seconds_total, executions, device_seconds,
                      device_samples, loop_line, loop_ops, const_bytes,
                      last_cause}],
                      findings[{severity, kind, message, location,
                      seconds_lost, count, per_step, seconds_per_step,
                      share_of_step, cost_estimated, bytes_per_step, cost}],
                      costliest first:
                      kind is a stable snake_case rule name
                      (recompile_<cause>, per_step_sync,
                      per_step_implicit_transfer, eager_ops, ...);
                      per_step / seconds_per_step / share_of_step are
                      null when the steps are not known; cost is the
                      table's cost cell ("4.1 ms/step 3.0%", "~2.8 s"
                      estimated, "-" nothing measurable)
                      custom_metrics[{name, kind, unit, help, value | count,
                      total, min, max, p50, p90, p99}]: metrics outside the
                      catalog (the program's metrics.counter/distribution,
                      jax.monitoring events, engines' per-op counters), in
                      their recorded unit ("ns", "bytes", "1")
    job_findings      [{severity, kind, message}] across processes of one job
                      (same argv) that compiled a function to different graphs
    na                [{where, reason}] for every N/A the tables show

Times are seconds (``*_seconds``, ``time_unix``) or nanoseconds (``*_ns``);
sizes are bytes. Strings from remote processes are cut to 4096 characters.
The text is strict JSON (:func:`dumps`): a number that is not finite is
``null``, with its reason in ``na``, never ``NaN`` or ``Infinity``.

Example:
    >>> from tpu_info.views.values import Header, TargetView
    >>> doc = to_json([TargetView("h:1", error="connection refused")],
    ...               header=Header(host="h", time_unix=0.0))
    >>> doc["schema"], doc["targets"][0]["ok"], doc["targets"][0]["error"]
    ('tpu-info/v1', False, 'connection refused')
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Sequence
from typing import Any

from tpu_info.contract.catalog import CACHED_COMPILE, MARK_STEP, UNCACHED_COMPILE
from tpu_info.contract.model import (
    BUSY_FROM_LIBTPU,
    CounterReading,
    DistributionReading,
    LocalScan,
    Snapshot,
)
from tpu_info.views.breakdown import breakdown
from tpu_info.views.chips import ChipUsage
from tpu_info.views.custom import CustomMetric, custom_metrics
from tpu_info.views.data_loading import not_raised as loader_not_raised
from tpu_info.views.derived import FindingLine, TargetReadings, readings
from tpu_info.views.host_work import not_raised as host_not_raised
from tpu_info.views.library_jit import not_raised as wrapper_not_raised
from tpu_info.views.sites import not_raised, site_phase
from tpu_info.views.thread_work import not_raised as thread_not_raised
from tpu_info.views.values import Header, TargetView, last_cause, memory_totals, transfer_stats

SCHEMA = "tpu-info/v1"
MAX_JSON_TEXT = 4096


def _s(value: object) -> str:
    text = str(value)
    return text if len(text) <= MAX_JSON_TEXT else text[: MAX_JSON_TEXT - 1] + "…"


def _opt(value: object) -> str | None:
    return None if value is None else _s(value)


def _chip(u: ChipUsage) -> dict[str, Any]:
    c = u.chip
    return {
        "name": c.name, "index": c.index, "vendor": c.vendor, "kind": _s(c.kind),
        "device_path": c.device_path, "pci_address": c.pci_address, "usable": c.usable,
        "hbm_used_bytes": u.hbm_used_bytes, "hbm_total_bytes": u.hbm_total_bytes,
        "hbm_source": u.hbm_source or None, "busy_percent": u.busy_percent,
        "busy_source": u.busy_source or None,
        "cores_per_chip": c.cores_per_chip, "devices_per_chip": c.devices_per_chip,
        "owner_pids": list(c.owner_pids),
        "owners": [{"pid": o.pid, "name": _s(o.name), "user": _s(o.user),
                    "command": _s(o.command)} for o in u.owners],
        "reasons": {k: _s(v) for k, v in u.reasons.items()},
    }


def _finding(line: FindingLine) -> dict[str, Any]:
    f = line.finding
    assert f is not None
    return {"severity": f.severity, "kind": f.kind, "message": _s(f.message),
            "location": _opt(f.location), "seconds_lost": f.seconds_lost, "count": f.count,
            "per_step": f.per_step, "seconds_per_step": f.seconds_per_step,
            "share_of_step": f.share_of_step, "cost_estimated": f.cost_estimated,
            "bytes_per_step": f.bytes_per_step, "cost": line.cost,
            "phase": f.phase or None, "share_of_run": f.share_of_run,
            "every_steps": f.every_steps}


def _custom(m: CustomMetric) -> dict[str, Any]:
    out: dict[str, Any] = {"name": _s(m.name), "kind": m.kind, "unit": m.unit,
                           "help": _s(m.help)}
    if m.kind == "counter":
        out["value"] = m.value
    else:
        out.update(count=m.count, total=m.total, min=m.min, max=m.max,
                   **{f"p{p:g}": v for p, v in m.percentiles})
    return out


def _target(t: TargetReadings, top_graphs: int | None) -> dict[str, Any]:
    v = t.view
    out: dict[str, Any] = {"target": _s(v.target), "source": v.source, "ok": v.ok,
                           "error": _s(v.error) if v.snapshot is None else None}
    s: Snapshot | None = v.snapshot
    if s is None:
        out.update(process=None, uptime_seconds=None, time=None, steps=None, steps_source=None,
                   steps_basis=None, seconds_per_step=None, sites=[], blind_spots=[],
                   compiles=None,
                   cache_hits=None, hbm_used_bytes=None, hbm_limit_bytes=None, devices=[],
                   transfers=None, graphs=[], findings=[], custom_metrics=[])
        return out
    p = s.process
    used, limit = memory_totals(s)
    steps = s.counter(MARK_STEP) if any(c.name == MARK_STEP for c in s.counters) else None
    st = s.steps
    if st is not None:
        steps = st.count
    graphs = sorted(s.graphs, key=lambda g: (-g.compile_seconds_total, -g.compiles, g.hash))
    if top_graphs is not None:
        graphs = graphs[:top_graphs]
    transfers = {}
    for x in transfer_stats(s):
        transfers[x.direction] = {
            "count": x.count, "bytes": x.bytes, "p50_ns": x.p50_ns, "p90_ns": x.p90_ns,
            "p95_ns": x.p95_ns, "p999_ns": x.p999_ns, "timed": x.timed,
            "reasons": dict(x.reasons)}
    out.update(
        process=None if p is None else {
            "pid": p.pid, "name": _s(p.name), "user": _s(p.user), "host": _s(p.host),
            "engine": _s(p.engine), "versions": {_s(k): _s(x) for k, x in p.versions.items()},
            "argv": [_s(a) for a in p.argv[:64]], "start_time_unix": p.start_time_unix,
            "waiting": [_s(e) for e in p.waiting.split(",") if e],
            "process_index": p.process_index, "process_count": p.process_count},
        uptime_seconds=s.uptime_seconds if s.uptime_seconds > 0 else None,
        time=None if (time := breakdown(s)) is None else time.fields(),
        steps=steps,
        steps_source=None if st is None else _s(st.source),
        steps_basis=None if st is None else _s(st.basis),
        seconds_per_step=None if st is None else st.seconds_per_step,
        compiles=s.counter(UNCACHED_COMPILE),
        cache_hits=s.counter(CACHED_COMPILE), hbm_used_bytes=used, hbm_limit_bytes=limit,
        devices=[{
            "id": d.id, "kind": _s(d.kind), "platform": _s(d.platform),
            "hbm_used_bytes": d.memory.used_bytes, "hbm_peak_bytes": d.memory.peak_bytes,
            "hbm_limit_bytes": d.memory.limit_bytes, "memory_source": _s(d.memory.source),
            "busy_percent": d.busy_percent,
            "busy_source": (None if d.busy_percent is None else "libtpu"
                            if d.busy_source == BUSY_FROM_LIBTPU or v.source == "libtpu"
                            else "estimate"),
            "reasons": {k: _s(x) for k, x in (("memory", d.memory.reason),
                                              ("busy_percent", d.busy_reason)) if x},
        } for d in s.devices],
        transfers=transfers,
        graphs=[{
            "hash": _s(g.hash), "name": _s(g.name), "engine": _s(g.engine),
            "compiles": g.compiles, "cache_hits": g.cache_hits,
            "compile_seconds_total": g.compile_seconds_total, "executions": g.executions,
            "device_seconds": g.device_seconds, "device_samples": g.device_samples,
            "loop_line": _s(g.loop_line), "loop_ops": g.loop_ops,
            "const_bytes": g.const_bytes,
            "last_cause": None if (c := last_cause(g)) is None else {
                "description": _s(c.description), "location": _opt(c.location),
                "argument": _opt(c.argument), "before": _opt(c.before), "after": _opt(c.after),
                "time_unix": c.time_unix},
        } for g in graphs],
        sites=[{"kind": _s(x.kind), "location": _s(x.location), "function": _s(x.function),
                "detail": _s(x.detail), "count": x.count, "bytes": x.bytes,
                "seconds": x.seconds, "drain_seconds": x.drain_seconds,
                "work": _s(x.work), "gaps": x.gaps, "gap_seconds": x.gap_seconds,
                "within": _s(x.within), "in_generator": x.in_generator,
                "estimated": x.estimated,
                "last_seen_unix": x.last_seen_unix,
                "first_seen_unix": x.first_seen_unix, "phase": site_phase(s, x).value,
                "via": _s(x.via), "occurrences": x.occurrences,
                "steps_spanned": x.steps_spanned, "timed": x.timed,
                "interval_share": x.interval_share,
                "not_raised": (why or wrapper_not_raised(s, x) or host_not_raised(s, x)
                               or loader_not_raised(s, x) or thread_not_raised(s, x)
                               or None)}
               for x, why in zip(s.sites, not_raised(s), strict=True)],
        blind_spots=[_s(b) for b in s.blind_spots],
        findings=[_finding(f) for f in t.findings],
        custom_metrics=[_custom(m) for m in custom_metrics(s)],
    )
    return out


def to_json(views: Sequence[TargetView], *, local: LocalScan | None = None,
            header: Header | None = None, top_graphs: int | None = None,
            only: Collection[str] | None = None, procs: Any = None) -> dict[str, Any]:
    """The ``tpu-info/v1`` document for ``views`` (see the module docstring).

    Args:
        views: one per target, read or failed.
        local: this machine's accelerators.
        header: time and host; None means now, here.
        top_graphs: keep only this many graphs per target (None: all).
        only: keep only these chips (``-i``; names as the table's), usable or not.
        procs: keep only these processes in ``targets`` (``--pid``, ``--user``: a
            :class:`~tpu_info.views.selection.ProcessPick`); the chips keep every owner.
    """
    run = readings(views, local=local, header=header,  # its N/As are the tables'
                   all_chips=only is not None, only=only)
    if procs is not None:
        run = procs.apply(run)
    header = run.header
    return {
        "schema": SCHEMA,
        "tpu_info_version": header.version,
        "host": _s(header.host),
        "time_unix": header.time_unix,
        "libtpu_version": _opt(run.libtpu_version.value),
        "accelerator_type": run.accelerator.value,
        "chips": [_chip(u) for u in run.usage if only is None or u.chip.name in only],
        "local_reasons": dict(local.reasons) if local else {},
        "targets": [_target(t, top_graphs) for t in run.targets],
        "job_findings": [{"severity": f.finding.severity, "kind": f.kind,
                          "message": _s(f.finding.message)}
                         for f in run.job_findings if f.finding is not None],
        "na": [{"where": w, "reason": why} for w, why in run.reasons()],
    }


REPORT_SCHEMA = "tpu-info-report/v1"


def _reading(x: CounterReading | DistributionReading) -> dict[str, Any]:
    if isinstance(x, CounterReading):
        return {"name": _s(x.name), "type": "counter", "value": x.value}
    return {"name": _s(x.name), "type": "metric", "unit": x.unit.value, "count": x.count,
            "total": x.total, "min": x.min, "max": x.max, "rate_per_second": x.rate_per_second,
            "value_rate_per_second": x.value_rate_per_second,
            "percentiles": {f"{p:g}": v for p, v in x.percentiles}}


def report_json(target: str, snapshot: Snapshot, short: bool = False) -> dict[str, Any]:
    """``tpu-info report --json``: every counter and metric of ``metrics_report()``
    (``short``: those of ``short_metrics_report()``) as ``readings``, and the
    target as ``tpu-info/v1`` describes it (process, steps, graphs, findings)."""
    from tpu_info.outputs.textreport import short_selection

    chosen = (short_selection(snapshot) if short
              else [*snapshot.distributions, *snapshot.counters])
    run = readings([TargetView(target, snapshot)], header=Header(host="", time_unix=0.0))
    return {"schema": REPORT_SCHEMA, "tpu_info_version": run.header.version,
            "short": short, "readings": [_reading(x) for x in chosen],
            "target": _target(run.targets[0], None)}


def _finite_only(value: Any, where: str, na: list[dict[str, str]]) -> Any:
    """``value`` with every float that is not finite replaced by None (noted in ``na``)."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        na.append({"where": where, "reason": f"not a finite number ({value!r})"})
        return None
    if isinstance(value, dict):
        return {k: _finite_only(v, f"{where}/{k}", na) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_only(v, f"{where}/{i}", na) for i, v in enumerate(value)]
    return value


def dumps(doc: dict[str, Any], indent: int | None = 2) -> str:
    """``doc`` as strict JSON text: non-finite numbers become null (listed in
    ``na``); ``allow_nan=False`` guards the promise."""
    na: list[dict[str, str]] = []
    clean_doc = _finite_only(doc, "", na)
    if na:
        clean_doc["na"] = list(clean_doc.get("na", [])) + na
    return json.dumps(clean_doc, indent=indent, sort_keys=False, allow_nan=False)


_NUM = {"type": ["number", "null"]}
_INT = {"type": ["integer", "null"]}
_STR = {"type": ["string", "null"]}
_REASONS = {"type": "object", "additionalProperties": {"type": "string"}}
_TRANSFER = {"type": "object", "required": ["count", "bytes", "p50_ns", "p999_ns", "reasons"],
             "properties": {"count": {"type": "integer"}, "bytes": _NUM, "p50_ns": _NUM,
                            "p90_ns": _NUM, "p95_ns": _NUM, "p999_ns": _NUM,
                            "timed": {"type": "integer"}, "reasons": _REASONS}}

JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "tpu-info --json output, version 1",
    "type": "object",
    "required": ["schema", "tpu_info_version", "host", "time_unix", "libtpu_version",
                 "accelerator_type", "chips", "local_reasons", "targets", "na"],
    "properties": {
        "schema": {"const": SCHEMA},
        "tpu_info_version": {"type": "string"},
        "host": {"type": "string"},
        "time_unix": {"type": "number"},
        "libtpu_version": _STR,
        "accelerator_type": _STR,
        "local_reasons": _REASONS,
        "job_findings": {"type": "array", "items": {"type": "object"}},
        "chips": {"type": "array", "items": {
            "type": "object",
            "required": ["name", "index", "vendor", "kind", "device_path", "pci_address",
                         "hbm_used_bytes", "hbm_total_bytes", "busy_percent", "owner_pids",
                         "reasons"],
            "properties": {
                "name": {"type": "string"}, "index": {"type": "integer"},
                "vendor": {"enum": ["tpu", "nvidia"]}, "kind": {"type": "string"},
                "device_path": _STR, "pci_address": {"type": "string"},
                "usable": {"type": "boolean"},
                "hbm_used_bytes": _INT, "hbm_total_bytes": _INT, "busy_percent": _NUM,
                "hbm_source": {"enum": ["libtpu", "hook", "nvml", "spec", None]},
                "busy_source": {"enum": ["libtpu", "nvml", "estimate", None]},
                "owners": {"type": "array", "items": {
                    "type": "object", "required": ["pid", "name", "user", "command"],
                    "properties": {"pid": {"type": "integer"}, "name": {"type": "string"},
                                   "user": {"type": "string"},
                                   "command": {"type": "string"}}}},
                "cores_per_chip": _INT, "devices_per_chip": _INT,
                "owner_pids": {"type": "array", "items": {"type": "integer"}},
                "reasons": _REASONS}}},
        "targets": {"type": "array", "items": {
            "type": "object",
            "required": ["target", "source", "ok", "error", "process", "steps", "compiles",
                         "hbm_used_bytes", "devices", "transfers", "graphs", "findings"],
            "properties": {
                "target": {"type": "string"}, "source": {"enum": ["hook", "libtpu"]},
                "ok": {"type": "boolean"}, "error": _STR,
                "process": {"type": ["object", "null"],
                            "required": ["pid", "name", "user", "engine", "versions"],
                            "properties": {"pid": {"type": "integer"},
                                           "name": {"type": "string"},
                                           "versions": _REASONS,
                                           "process_index": _INT, "process_count": _INT}},
                "uptime_seconds": _NUM, "steps": _INT, "compiles": _INT, "cache_hits": _INT,
                "time": {"type": ["object", "null"],
                         "required": ["run_seconds", "parts", "overlap_seconds"],
                         "properties": {"run_seconds": _NUM, "overlap_seconds": _NUM,
                                        "parts": {"type": "array", "items": {
                                            "type": "object",
                                            "required": ["name", "seconds", "share"]}},
                                        "steady_step": {"type": "object", "required": [
                                            "seconds", "host", "device_seconds"]}}},
                "hbm_used_bytes": _INT, "hbm_limit_bytes": _INT,
                "devices": {"type": "array", "items": {
                    "type": "object",
                    "required": ["id", "kind", "platform", "hbm_used_bytes", "hbm_limit_bytes",
                                 "busy_percent", "reasons"],
                    "properties": {"id": {"type": "integer"}, "hbm_used_bytes": _INT,
                                   "hbm_peak_bytes": _INT, "hbm_limit_bytes": _INT,
                                   "busy_percent": _NUM,
                                   "busy_source": {"enum": ["libtpu", "estimate", None]},
                                   "reasons": _REASONS}}},
                "transfers": {"type": ["object", "null"],
                              "properties": {"h2d": _TRANSFER, "d2h": _TRANSFER}},
                "graphs": {"type": "array", "items": {
                    "type": "object",
                    "required": ["hash", "name", "compiles", "cache_hits",
                                 "compile_seconds_total", "executions", "last_cause"],
                    "properties": {"hash": {"type": "string"}, "compiles": {"type": "integer"},
                                   "executions": _INT,
                                   "last_cause": {"type": ["object", "null"],
                                                  "required": ["description", "location"]}}}},
                "steps_source": {"enum": ["marked", "inferred", None]},
                "steps_basis": _STR, "seconds_per_step": _NUM,
                "sites": {"type": "array", "items": {
                    "type": "object",
                    "required": ["kind", "location", "count", "bytes", "seconds"],
                    "properties": {"kind": {"type": "string"}, "location": {"type": "string"},
                                   "count": {"type": "integer"}, "bytes": {"type": "integer"},
                                   "seconds": {"type": "number"},
                                   "phase": {"type": "string"}, "occurrences": _INT,
                                   "steps_spanned": _INT}}},
                "blind_spots": {"type": "array", "items": {"type": "string"}},
                "custom_metrics": {"type": "array", "items": {
                    "type": "object", "required": ["name", "kind", "unit", "help"],
                    "properties": {"name": {"type": "string"},
                                   "kind": {"enum": ["counter", "distribution"]},
                                   "unit": {"enum": ["ns", "bytes", "1"]},
                                   "help": {"type": "string"}, "value": _INT,
                                   "count": _INT, "total": _NUM, "min": _NUM, "max": _NUM,
                                   "p50": _NUM, "p90": _NUM, "p99": _NUM}}},
                "findings": {"type": "array", "items": {
                    "type": "object",
                    "required": ["severity", "kind", "message", "location", "seconds_lost",
                                 "count", "per_step", "seconds_per_step", "share_of_step",
                                 "cost_estimated"],
                    "properties": {"severity": {"type": "string"},
                                   "kind": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"},
                                   "message": {"type": "string"}, "location": _STR,
                                   "seconds_lost": {"type": "number", "minimum": 0},
                                   "count": _INT, "per_step": _NUM,
                                   "seconds_per_step": _NUM,
                                   "share_of_step": {"type": ["number", "null"],
                                                     "minimum": 0, "maximum": 1},
                                   "cost_estimated": {"type": "boolean"},
                                   "bytes_per_step": _NUM,
                                   "cost": {"type": "string"},
                                   "phase": _STR, "share_of_run": _NUM,
                                   "every_steps": _NUM}}}}}},
        "na": {"type": "array", "items": {
            "type": "object", "required": ["where", "reason"],
            "properties": {"where": {"type": "string"}, "reason": {"type": "string"}}}},
    },
}
