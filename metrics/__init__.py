"""Runtime metrics for JAX and PyTorch programs, recorded in-process.

Add two lines to a training program::

    import metrics
    metrics.install()            # anywhere: engines imported later are hooked then
    ...
    metrics.mark_step()          # once per training step (optional)
    print(metrics.metrics_report())

``import metrics`` imports neither torch nor jax; engine adapters load only
when :func:`install` finds their engine already imported, when the program
imports it later (:mod:`metrics.engines.importwatch`, the post-import hook that
``tpu-info run`` uses too), or when it is asked for one by name.
The functions :func:`counter_names`, :func:`counter_value`,
:func:`metric_names`, :func:`metric_data`, :func:`clear_all`,
:func:`clear_counters`, :func:`clear_metrics`, :func:`metrics_report`,
:func:`short_metrics_report` and :func:`executed_fallback_ops` have
``torch_xla.debug.metrics``' call shapes. :func:`counter` and
:func:`distribution` record the program's own metrics, with a unit and help::

    load = metrics.distribution("DataLoadTime", unit="ns", help="Time to load a batch.")
    load.observe(time.monotonic_ns() - t0)   # metrics_report(): Accumulator: 012ms...
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from metrics import engines as _engines
from metrics.engines import importwatch
from metrics.recording import custom as _custom
from metrics.recording import forksafe
from metrics.recording import readings as _readings
from metrics.recording import snapshot as _snapshot
from metrics.recording.recorder import Recorder
from metrics.recording.registry import Counter, Distribution
from tpu_info.contract.model import Snapshot, Unit

if TYPE_CHECKING:  # loaded by install(serve=...), never at import
    from metrics.export import Exporter
    from metrics.export.prometheus import PrometheusServer

__all__ = [
    "install", "uninstall", "installed_engines", "waiting_engines", "exporter",
    "prometheus_endpoint",
    "recorder", "mark_step", "track",
    "snapshot", "metrics_report", "short_metrics_report", "counter_names",
    "counter_value", "metric_names", "metric_data", "clear_all", "clear_counters",
    "clear_metrics", "executed_fallback_ops", "counter", "distribution", "Recorder",
]

P = ParamSpec("P")
R = TypeVar("R")

_lock = threading.RLock()
_recorder: Recorder | None = None
_installed: dict[str, _engines.Engine] = {}
_waiting: set[str] = set()  # engines install("auto") waits for (metrics.engines.importwatch)
_explain_cache_misses = True  # what install() was last asked, for engines hooked later
_exporter: Exporter | None = None
_prometheus: PrometheusServer | None = None
_device_capture: bool | None = None  # install(device_capture=); None: $TPU_INFO_DEVICE_CAPTURE
log = logging.getLogger("metrics")


def _forget_exporters_in_child() -> None:
    """A forked child serves nothing of its parent's: it has no exporter
    until it calls :func:`install` itself, which then starts its own."""
    global _lock, _exporter, _prometheus
    _lock = threading.RLock()  # another thread of the parent may have held it
    _exporter = None
    _prometheus = None
    forksafe.free_locks(*_installed.values())  # the engines' own locks, likewise


forksafe.in_child(_forget_exporters_in_child)


def recorder() -> Recorder:
    """The process-wide recorder, created on first use."""
    global _recorder
    if _recorder is None:
        with _lock:
            if _recorder is None:
                _recorder = Recorder()
    return _recorder


def install(
    engines: str | Sequence[str] = "auto",
    *,
    serve: bool | str | None = None,
    port: int | None = None,
    prometheus_port: int | None = None,
    explain_cache_misses: bool = True,
    device_capture: bool | None = None,
    save: str | None = None,
) -> Recorder:
    """Installs the hooks of ``engines`` (idempotent) and returns the recorder.

    Args:
        engines: ``"auto"``: the engines the program has already imported,
            and each other engine once the program imports it (hooked when
            its import finishes; :func:`waiting_engines` lists those not yet
            imported). Or a list of names from
            :func:`metrics.engines.valid_names`: each is loaded now, importing
            its engine if the program has not yet.
        serve: where the gRPC server runs. ``"process"`` (the default, or
            ``$TPU_INFO_SERVE=process``): a helper process beside the program
            (see :mod:`metrics.export.helper`), so no client, however
            hostile, costs the program more than ten snapshot builds a
            second. ``"thread"`` or ``True`` (``$TPU_INFO_SERVE=thread``): a
            thread pool inside the program (no extra process, but every
            call's grpcio work lands on the program's cores; see
            ``bench/attack.py``; ``$TPU_INFO_SERVE=1`` too, as before).
            ``False`` (``$TPU_INFO_SERVE=0``): no
            server. Loopback only unless ``$TPU_INFO_BIND`` says otherwise.
        port: pin the server's port (default ``$TPU_INFO_PORT``, else 8431
            when free, else any free port).
        prometheus_port: also serve Prometheus' ``/metrics`` on this port
            (default ``$TPU_INFO_PROMETHEUS_PORT``; unset means no endpoint),
            on loopback unless ``$TPU_INFO_PROMETHEUS_BIND`` says otherwise.
        explain_cache_misses: capture JAX's cache-miss explanations as
            recompile causes (printed only if the program turned them on).
        device_capture: let the program's owner take device traces
            (``jax.profiler`` / ``torch.profiler``, at most
            ``profiler.remote.MAX_DEVICE_DURATION_S``) with ``tpu-info profile
            --device``. Default ``$TPU_INFO_DEVICE_CAPTURE`` (``1`` allows),
            else off: a device trace costs the program gigabytes of memory.
            Host traces (annotations, hook events) are always allowed to the
            owner; nobody else can capture at all.
        save: where the run is saved when the program ends (a file, or a
            directory to write into; ``"off"`` saves nothing). Default
            ``$TPU_INFO_SAVE``, else ``runs/`` in the runtime directory
            (:mod:`metrics.export.saving`). Only the first install decides.

    Raises:
        ValueError: an unknown engine name; the message lists the valid ones.
    """
    if _deferred:
        _retry_deferred()
    auto = engines == "auto"
    if isinstance(engines, str):
        wanted = _engines.detect() if auto else [engines]
    else:
        wanted = list(engines)
    unknown = [e for e in wanted if e not in _engines.valid_names()]
    if unknown:
        raise ValueError(
            f"unknown engine(s) {', '.join(map(repr, unknown))}; "
            f"valid engines: {', '.join(_engines.valid_names())} (or 'auto')"
        )
    global _device_capture, _explain_cache_misses
    rec = recorder()
    with _lock:
        if device_capture is not None:
            _device_capture = bool(device_capture)
        _explain_cache_misses = explain_cache_misses
        for name in wanted:
            if name in _installed:
                continue
            _hook(name, rec)
        _arm_saving(save)  # before the exporter: its SIGTERM handler runs first
        if serve is None:
            from metrics import config

            serve = config.serve()
        if serve not in (True, False, "process", "thread"):
            raise ValueError(f"serve must be 'process', 'thread', True or False, got {serve!r}")
        if serve:
            _start_exporters(port, prometheus_port, in_helper=serve == "process")
        if auto:
            _wait_for_the_others()
        else:
            _republish()
    return rec


def _arm_saving(save: str | None) -> None:
    """Arms the saved run once per process (holding ``_lock``): the whole
    snapshot, every event the rings hold, at the program's end."""
    from metrics.export import saving

    rec = recorder()
    saving.start_from_config(save, lambda: _snapshot.build(
        recorder(), installed_engines(), 0, max_events=None), rec.hook_failed,
        progress=lambda: (rec.steps_so_far(), rec.events.last_seq))


def _hook(name: str, rec: Recorder) -> None:
    """Loads and installs one engine's adapter (holding ``_lock``)."""
    engine = _engines.create(name, rec, explain_cache_misses=_explain_cache_misses)
    engine.install()
    _installed[name] = engine
    _waiting.discard(name)


def _wait_for_the_others() -> None:
    """Hooks each engine not imported yet when its import finishes (holding ``_lock``)."""
    for spec in _engines.specs():
        if spec.name in _installed or spec.name in _waiting:
            continue
        _waiting.add(spec.name)
        importwatch.when_imported(spec.trigger, lambda name=spec.name: _hook_later(name))
    _republish()


# Engines whose hook could not take _lock at their import: retried later.
_deferred: set[str] = set()
_LOCK_WAIT_S = 2.0


def _hook_later(name: str) -> None:
    """Runs in the thread whose import of ``name``'s engine just finished,
    under that module's import lock. Another thread holding ``_lock`` may be
    waiting for that very import (``install(engines=[...])`` loading the
    same engine), so this never waits long for ``_lock``: it queues the hook
    again, and ``mark_step()``, ``snapshot()`` or ``install()`` retries it."""
    if not _lock.acquire(timeout=_LOCK_WAIT_S):
        _deferred.add(name)
        return
    try:
        if name not in _waiting or name in _installed:
            return
        _waiting.discard(name)
        present = {*_installed, *(e.name for e in _engines.specs() if e.trigger in sys.modules)}
        if not _engines.superseded(name, present):
            _hook(name, recorder())
        for other in _engines.specs():
            if name in other.superseded_by and other.name in _waiting:  # torch_xla came:
                _waiting.discard(other.name)  # no torch_lazy
        _republish()
    except Exception as e:  # noqa: BLE001 - the program's import must go on
        recorder().hook_failed(f"{name}.install", e)
        log.warning("tpu-info: could not hook %s after its import: %s", name, e)
    finally:
        _lock.release()


def _retry_deferred() -> None:
    while _deferred:
        try:
            name = _deferred.pop()
        except KeyError:  # another thread took the last one
            break
        _hook_later(name)
    importwatch.check()


def waiting_engines() -> list[str]:
    """Engines ``install()`` waits for: hooked once the program imports them."""
    _retry_deferred()  # and an engine imported past the finder (a finder ahead of ours)
    with _lock:
        return sorted(_waiting)


def _republish() -> None:
    """Rewrites the discovery record when the set of hooked engines changed."""
    if _exporter is None or _exporter.stopped:
        return
    engines = installed_engines()
    versions: dict[str, str] = {}
    for e in engines:
        versions.update(e.versions())
    _exporter.republish(",".join(e.name for e in engines), versions, sorted(_waiting))


def _start_exporters(port: int | None, prometheus_port: int | None,
                     in_helper: bool = False) -> None:
    """Starts the gRPC server (and Prometheus endpoint) once; failures are
    logged, never raised: the program runs on without them."""
    global _exporter, _prometheus
    from metrics import config, export

    engines = installed_engines()
    versions: dict[str, str] = {}
    for e in engines:
        versions.update(e.versions())
    if _exporter is None or _exporter.stopped:
        try:
            factory: dict[str, Any] = {}
            if in_helper:
                from metrics.export.helper import HelperServer

                factory["server_factory"] = HelperServer
            _exporter = export.start(snapshot, port=port,
                                     engine=",".join(e.name for e in engines),
                                     versions=versions, capture_fn=_capture, **factory)
        except Exception as e:  # noqa: BLE001 - never break the program for its monitor
            log.warning("tpu-info: metrics server not started: %s", e)
    if _prometheus is None and (prometheus_port is not None
                                or config.is_set(config.PROMETHEUS_PORT)):
        try:
            from metrics.export import prometheus

            # A huge events_since skips copying events, which Prometheus does not use.
            _prometheus = prometheus.start_http(lambda: snapshot(events_since=2**62),
                                                prometheus_port)
        except Exception as e:  # noqa: BLE001
            log.warning("tpu-info: Prometheus endpoint not started: %s", e)


class DeviceCaptureOff(Exception):
    """A device trace was asked for, but the program did not opt in."""

    grpc_status = "FAILED_PRECONDITION"


def device_capture_allowed() -> bool:
    """Whether remote captures may run the device profilers (see :func:`install`)."""
    if _device_capture is not None:
        return _device_capture
    from metrics import config

    return config.flag(config.DEVICE_CAPTURE)


def _capture(duration_s: float, device: bool, stop: threading.Event, caller: Any) -> Any:
    """Runs one ``Monitor.Capture`` on the server's thread (or, with the
    helper, on a thread of this program): only for the program's owner on
    this host, device traces only when the program opted in. The capture
    itself is the one ``import profiler`` registered
    (:mod:`metrics.export.captures`: metrics never imports the profiler),
    else the hook's own window (:mod:`metrics.export.capture_window`)."""
    from metrics.export import capture_window, captures, discovery, owner

    owner.check(caller, discovery.capture_secret())
    if device and not device_capture_allowed():
        raise DeviceCaptureOff("device traces are off in this program (they cost it "
                               "gigabytes of memory); it opts in with "
                               "TPU_INFO_DEVICE_CAPTURE=1 or metrics.install(device_capture=True)")
    return captures.run(duration_s, device, stop, lambda d, dev, s: capture_window.record(
        d, dev, s, installed_engines(), recorder()))


def exporter() -> Exporter | None:
    """The running gRPC exporter (``.address``, ``.port``), or None."""
    return _exporter


def prometheus_endpoint() -> PrometheusServer | None:
    """The running Prometheus endpoint (``.port``), or None."""
    return _prometheus


def uninstall(*, stop_server: bool = False) -> None:
    """Removes every installed hook; recorded values stay readable.

    The server keeps serving what was recorded unless ``stop_server``.
    """
    global _exporter, _prometheus
    with _lock:
        for engine in reversed(list(_installed.values())):
            engine.uninstall()
        _installed.clear()
        _waiting.clear()  # their callbacks, if they fire, find nothing to do
        if stop_server:
            if _exporter is not None:
                _exporter.stop()
                _exporter = None
            if _prometheus is not None:
                _prometheus.stop()
                _prometheus = None


def installed_engines() -> list[_engines.Engine]:
    """The engines hooked now, in the order they were hooked."""
    with _lock:
        return list(_installed.values())


def mark_step() -> None:
    """Marks the end of one training step (counter ``MarkStep``, ``StepTime``)."""
    if _deferred:
        _retry_deferred()
    (_recorder or recorder()).mark_step()


@overload
def track(fn: Callable[P, R], *, name: str | None = None) -> Callable[P, R]: ...


@overload
def track(fn: None = None, *,
          name: str | None = None) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def track(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Counts and times calls of a jitted function (``ExecuteTime``).

    Use as ``step = metrics.track(jax.jit(step))`` or as a decorator
    (``@metrics.track`` or ``@metrics.track(name="eval")``). Each call is also
    counted as an execution of the graph it ran in the graph ledger. The
    result has ``fn``'s signature for type checkers (parameters and result).
    """
    if fn is None:
        return lambda f: track(f, name=name)
    from metrics.engines.jax import track as track_jax  # only reached by JAX users

    return track_jax(fn, name)


def snapshot(events_since: int = 0) -> Snapshot:
    """A consistent snapshot of everything recorded (computed now)."""
    waiting = waiting_engines() if _waiting else []
    return _snapshot.build(recorder(), installed_engines(), events_since, waiting=waiting)


def metrics_report() -> str:
    """torch_xla-style report of every metric and counter, plus graphs and findings."""
    from tpu_info.outputs import textreport  # the views load when a report is asked for

    return textreport.metrics_report(snapshot())


def short_metrics_report(
    counter_names: Iterable[str] | None = None,
    metric_names: Iterable[str] | None = None,
) -> str:
    """The short report (torch_xla's defaults when no names are given)."""
    from tpu_info.outputs import textreport

    return textreport.short_metrics_report(snapshot(), counter_names, metric_names)


def counter_names() -> list[str]:
    """Counters that hold something, engines' own counters included."""
    return _readings.counter_names(recorder(), installed_engines())


def counter_value(name: str) -> int | None:
    """A counter's value (engines' own counters merged), None if it never counted."""
    return _readings.counter_value(recorder(), installed_engines(), name)


def metric_names() -> list[str]:
    """Metrics (distributions) that hold samples, engines' own included."""
    return _readings.metric_names(recorder(), installed_engines())


def metric_data(name: str) -> tuple[int, float, tuple[tuple[float, float], ...]] | None:
    """``(total_samples, accumulator, ((unix_time, value), ...))`` or None."""
    return _readings.metric_data(recorder(), installed_engines(), name)


def executed_fallback_ops() -> list[str]:
    """Operations that fell back to the CPU, as torch_xla's call of this name
    returns them: the names of its ``aten::`` counters that hold something
    (``['aten::nonzero']``); empty when none did, or no torch_xla/torch._lazy
    is hooked."""
    return [n for n in counter_names() if n.startswith("aten::")]


def counter(name: str, *, unit: Unit | str = Unit.NUMBER, help: str = "") -> Counter:
    """The program's own counter ``name`` (``.inc()``, ``.inc(n)``), created
    on first use with ``unit`` (``"1"``, ``"bytes"``, ``"ns"``) and ``help``.

    Raises:
        ValueError: an empty name, an unknown unit, or a name already
            recorded with another unit.
    """
    return _custom.define(recorder(), "counter", name, unit, help)


def distribution(name: str, *, unit: Unit | str = Unit.NUMBER,
                 help: str = "") -> Distribution:
    """The program's own distribution ``name`` (``.observe(value)``, O(1)),
    created on first use with ``unit`` (``"ns"`` for times, in nanoseconds;
    ``"bytes"``; ``"1"``) and ``help``; every output formats it by its unit.

    Raises:
        ValueError: an empty name, an unknown unit, or a name already
            recorded with another unit.
    """
    return _custom.define(recorder(), "distribution", name, unit, help)


def clear_counters() -> None:
    """Sets every counter back to zero (see :func:`clear_all`)."""
    _readings.clear(recorder(), installed_engines(), counters=True, metrics=False)


def clear_metrics() -> None:
    """Empties every metric (distribution; see :func:`clear_all`)."""
    _readings.clear(recorder(), installed_engines(), counters=False, metrics=True)


def clear_all() -> None:
    """Clears counters and metrics (the graph ledger and events stay).

    Engines' own counters (torch._lazy, torch_xla) are not reset inside the
    engine: what they held is subtracted from then on.
    """
    _readings.clear(recorder(), installed_engines(), counters=True, metrics=True)
