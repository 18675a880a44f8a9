"""Google's ``tpu-info --metric`` names: where each value comes from here, and
why one is N/A.

Google's tpu-info 0.14.2 takes 57 names (``--list_metrics``). Each maps to one
:class:`Source`: a device reading (HBM, busy %), one of our distributions
(``ExecuteTime``, the transfer latencies), a part of libtpu's service that
only libtpu serves (gauges, multi-slice ``megascale`` distributions, the
runtime status of each core), a ``jax.monitoring`` record the hook keeps by
name (orbax reports its checkpoints there), or pygrain's own Prometheus
endpoint, which is not read here. What libtpu answered for a name arrives as
:class:`LibtpuRead` records (asked by :mod:`tpu_info.commands.libtpu_reads`);
the tables (:mod:`tpu_info.outputs.metric_tables`) are pure functions of them,
and every N/A says why in words made here and nowhere else.

Example:
    >>> GOOGLE_METRICS["runtime_hbm_utilization"].source
    <Source.LIBTPU_GAUGE: 'libtpu gauge'>
    >>> GOOGLE_METRICS["orbax_write_start_count"].key
    '/jax/orbax/write/start'
    >>> len(GOOGLE_METRICS)
    57
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from tpu_info.contract.catalog import (
    EXECUTE_TIME,
    TRANSFER_FROM_DEVICE_TIME,
    TRANSFER_TO_DEVICE_TIME,
)
from tpu_info.contract.model import CounterReading, DistributionReading
from tpu_info.views.values import TargetView, clean
from tpu_info.wire.libtpu_extra import CoreState, DeviceGauge, Latency


class Source(enum.Enum):
    """Where a Google name's value comes from."""

    DEVICE_HBM = "device HBM"  # each device's HBM used / total (libtpu or the hook)
    DEVICE_BUSY = "device busy"  # each device's busy % (libtpu's duty cycle or our estimate)
    OURS = "ours"  # one of our distributions, by our name (key)
    LIBTPU_GAUGE = "libtpu gauge"  # a per-device gauge only libtpu serves (key: its name)
    LIBTPU_LATENCY = "libtpu latency"  # a megascale distribution only libtpu serves
    LIBTPU_STATUS = "libtpu status"  # GetTpuRuntimeStatus (key: which table)
    JAX_MONITORING = "jax.monitoring"  # a record the hook keeps by name (key: its name)
    PYGRAIN = "pygrain"  # pygrain's own Prometheus endpoint (key: grain's name)


@dataclass(frozen=True, slots=True)
class GoogleMetric:
    """One of Google's names: its source, the name it has there, its meaning
    and its unit (``%``, ``s``, ``us``, ``Mbps``; empty for a count)."""

    name: str
    source: Source
    key: str
    meaning: str
    unit: str = ""


LIBTPU_SOURCES = frozenset({Source.LIBTPU_GAUGE, Source.LIBTPU_LATENCY, Source.LIBTPU_STATUS})


@dataclass(frozen=True, slots=True)
class LibtpuRead:
    """What one libtpu target answered for one Google name.

    Attributes:
        target: libtpu's address.
        gauges, latencies, cores: the answer, by the name's source.
        served: False when libtpu said it does not serve that metric.
        error: why nothing was read (the call failed); empty otherwise.
    """

    target: str
    gauges: tuple[DeviceGauge, ...] = ()
    latencies: tuple[Latency, ...] = ()
    cores: tuple[CoreState, ...] = ()
    served: bool = True
    error: str = ""


def _m(name: str, source: Source, key: str, meaning: str, unit: str = "") -> GoogleMetric:
    return GoogleMetric(name, source, key, meaning, unit)


def _megascale(what: str, unit: str = "microsecond") -> str:
    return f"megascale.{what}.{unit}.cumulative.distribution"


_S = Source
_CORE = [
    _m("hbm_usage", _S.DEVICE_HBM, "", "HBM used and total per device"),
    _m("duty_cycle_percent", _S.DEVICE_BUSY, "", "busy % per device (libtpu's duty cycle)"),
    _m("tensorcore_utilization", _S.DEVICE_BUSY, "",
       "busy % per device (Google reads libtpu's TensorCore utilization; here the duty cycle)"),
    _m("runtime_hbm_utilization", _S.LIBTPU_GAUGE, "tpu.runtime.hbm.utilization.percent",
       "HBM bandwidth utilization per device", "%"),
    _m("tensorcore_idle_duration", _S.LIBTPU_GAUGE, "tpu.runtime.tensorcore.idle_duration.seconds",
       "how long each TensorCore has been idle", "s"),
    _m("hlo_queue_size", _S.LIBTPU_GAUGE, "hlo.queue.size.gauge", "programs queued per device"),
    _m("hlo_exec_timing", _S.OURS, EXECUTE_TIME, "program execution time"),
    _m("host_to_device_transfer_latency", _S.OURS, TRANSFER_TO_DEVICE_TIME,
       "host->device transfer latency"),
    _m("device_to_host_transfer_latency", _S.OURS, TRANSFER_FROM_DEVICE_TIME,
       "device->host transfer latency"),
    _m("buffer_transfer_latency", _S.LIBTPU_LATENCY, _megascale("dcn_transfer_latencies"),
       "DCN transfer latency between slices", "us"),
    _m("inbound_buffer_transfer_latency", _S.LIBTPU_LATENCY,
       _megascale("dcn_inbound_transfer_latencies"), "DCN inbound transfer latency", "us"),
    _m("collective_e2e_latency", _S.LIBTPU_LATENCY,
       _megascale("collective_end_to_end_latencies"), "collective end-to-end latency", "us"),
    _m("host_compute_latency", _S.LIBTPU_LATENCY, _megascale("mxla_compute_latencies"),
       "host compute latency of multi-slice collectives", "us"),
    _m("grpc_tcp_min_rtt", _S.LIBTPU_LATENCY, _megascale("grpc_tcp_min_rtt"),
       "minimum round trip of libtpu's gRPC TCP connections between slices", "us"),
    _m("grpc_tcp_delivery_rate", _S.LIBTPU_LATENCY, _megascale("grpc_tcp_delivery_rate", "Mbps"),
       "delivery rate of libtpu's gRPC TCP connections between slices", "Mbps"),
    _m("core_state", _S.LIBTPU_STATUS, "cores", "each TPU core's type and debugger state"),
    _m("sequencer_state", _S.LIBTPU_STATUS, "sequencers",
       "each core's sequencers: program counter, program, run"),
    _m("sequencer_state_detailed", _S.LIBTPU_STATUS, "sequencers_detailed",
       "sequencers with the core's error and the HLO each one runs"),
    _m("queued_programs", _S.LIBTPU_STATUS, "queued", "programs queued on each core"),
]

# Google's metrics.ORBAX_SHORT_TO_LONG_MAP (tpu-info 0.14.2): orbax reports
# these through jax.monitoring, which the JAX hook records by name.
ORBAX = {
    "orbax_write_size": "/jax/orbax/write/gbytes",
    "orbax_write_throughput": "/jax/orbax/write/gbytes_per_sec",
    "orbax_write_blocking_throughput": "/jax/orbax/write/blocking_gbytes_per_sec",
    "orbax_write_replicated_array_size": "/jax/orbax/write/replicated_array_gb",
    "orbax_write_sharded_array_size": "/jax/orbax/write/sharded_array_gb",
    "orbax_write_start_count": "/jax/orbax/write/start",
    "orbax_write_async_start_count": "/jax/orbax/write/async/start",
    "orbax_write_success_count": "/jax/orbax/write/success",
    "orbax_write_preemption_count": "/jax/orbax/write/preemption",
    "orbax_write_storage_type": "/jax/orbax/write/storage_type",
    "orbax_write_directory_creation_duration": "/jax/orbax/write/directory_creation_secs",
    "orbax_write_async_directory_creation_duration":
        "/jax/orbax/write/async_directory_creation_secs",
    "orbax_write_checkpoint_start_sync_duration":
        "/jax/orbax/write/checkpoint_start_sync_duration_secs",
    "checkpoint_write_async_blocking_duration":
        "/jax/checkpoint/write/async/blocking_duration_secs",
    "checkpoint_write_async_total_duration": "/jax/checkpoint/write/async/total_duration_secs",
    "checkpoint_write_async_commit_duration": "/jax/checkpoint/write/async/commit_duration_sec",
    "checkpoint_write_async_thread_duration": "/jax/checkpoint/write/async/thread_duration_sec",
    "checkpoint_write_async_commit_future_count":
        "/jax/checkpoint/write/async/commit_future_count",
    "checkpoint_write_async_metadata_write_duration":
        "/jax/checkpoint/write/async/metadata_write_duration_secs",
    "checkpoint_write_async_ocdbt_merge_duration":
        "/jax/checkpoint/write/async/ocdbt_merge_duration_secs",
    "checkpoint_write_get_old_steps_duration": "/jax/checkpoint/write/get_old_steps_duration_secs",
    "checkpoint_write_old_steps_examined_count":
        "/jax/checkpoint/write/old_steps_examined_count",
    "checkpoint_write_wait_for_previous_duration":
        "/jax/checkpoint/write/wait_for_prev_duration_secs",
    "checkpoint_write_preemption_duration_saved":
        "/jax/checkpoint/write/preempt/duration_saved_secs",
    "checkpoint_write_remove_steps_duration": "/jax/checkpoint/write/remove_steps_duration_secs",
    "checkpoint_write_duration_since_last_checkpoint":
        "/jax/checkpoint/write/duration_since_last_checkpoint_secs",
    "orbax_read_start_count": "/jax/orbax/read/start",
    "orbax_read_async_start_count": "/jax/orbax/read/async/start",
    "orbax_read_async_blocking_duration": "/jax/orbax/read/async/blocking_duration_secs",
    "orbax_read_total_duration": "/jax/orbax/read/total_duration_secs",
    "orbax_read_worker_io_requested_size": "/jax/orbax/read/worker/io/requested/gbytes",
    "orbax_read_worker_io_requested_throughput":
        "/jax/orbax/read/worker/io/requested/throughput/gbytes_per_sec",
    "orbax_read_storage_type": "/jax/orbax/read/storage_type",
}

# Google's metrics.PYGRAIN_SHORT_TO_LONG_MAP: grain's own monitoring, exported
# to its Prometheus endpoint, never through jax.monitoring.
PYGRAIN = {
    "pygrain_dataset_next_duration": "/grain/python/dataset/next_duration_ns",
    "pygrain_dataset_prefetch_buffer_ready_count":
        "/grain/python/dataset/prefetch_buffer_ready_count",
    "pygrain_data_sources_read_size": "/grain/python/data_sources/bytes_read",
    "pygrain_dataset_source_read_duration": "/grain/python/dataset/source_read_time_ns",
    "pygrain_dataloader_iterator_get_next_duration": "/grain/python/data_loader/iterator_get_next",
}

GOOGLE_METRICS: dict[str, GoogleMetric] = {m.name: m for m in (
    _CORE
    + [_m(n, _S.JAX_MONITORING, k, f"orbax checkpointing, jax.monitoring {k}")
       for n, k in ORBAX.items()]
    + [_m(n, _S.PYGRAIN, k, f"pygrain data loading, {k}") for n, k in PYGRAIN.items()]
)}


# The words ---------------------------------------------------------------------

NO_LIBTPU = "libtpu's service is not reachable on this host (`tpu-info doctor` says why)"


def reason(m: GoogleMetric, *, libtpu_reachable: bool, hooked: bool,
           read: LibtpuRead | None = None) -> str:
    """Why ``m`` has no value: libtpu not reachable, libtpu not serving it, no
    hooked process recording it, or a source this tool does not read."""
    if m.source in LIBTPU_SOURCES:
        if not libtpu_reachable:
            return f"{m.meaning} comes only from libtpu, and {NO_LIBTPU}"
        if read is not None and read.error:
            return f"libtpu did not answer: {clean(read.error)}"
        if m.name.startswith("grpc_tcp_"):
            return ("needs libtpu's gRPC TCP metrics (megascale, between the slices of a "
                    "multi-slice job); libtpu here serves none")
        if m.source is Source.LIBTPU_LATENCY:
            return (f"libtpu serves no {m.key}: megascale metrics exist only in multi-slice "
                    "jobs (slices talking over DCN)")
        if m.source is Source.LIBTPU_STATUS:
            return "libtpu reported no TPU core states (is a program using the TPU?)"
        return f"libtpu does not serve {m.key} here (its libtpu version may not have it)"
    if m.source is Source.JAX_MONITORING:
        if not hooked:
            return (f"no hooked process found: orbax's {m.key} comes from a hooked JAX "
                    "program's jax.monitoring records")
        return (f"no hooked process has recorded {m.key} (orbax records it through "
                "jax.monitoring when the program saves or restores a checkpoint)")
    if m.source is Source.PYGRAIN:
        return (f"pygrain reports {m.key} to its own Prometheus endpoint "
                "(ENABLE_PYGRAIN_PROMETHEUS_TELEMETRY=true), not through jax.monitoring: the "
                "hook does not record it and tpu-info does not read that endpoint")
    return "not reported"


# Readings a hooked process keeps by name -------------------------------------------

def monitoring_reading(v: TargetView, key: str) -> CounterReading | DistributionReading | None:
    """A hook's reading of ``jax.monitoring`` name ``key``, under any of the
    names the hook keeps it by (:mod:`metrics.engines.jax.monitoring`)."""
    s = v.snapshot
    if s is None or v.source != "hook":
        return None
    for name in (key, f"{key}:scalar", f"{key}:duration", f"jax.monitoring:{key}"):
        d = s.distribution(name)
        if d is not None:
            return d
        c = next((c for c in s.counters if c.name == name), None)
        if c is not None:
            return c
    return None


def recorded_name(views: Sequence[TargetView], key: str) -> str | None:
    """The name a hooked process keeps ``key`` by, if any view has it."""
    for v in views:
        r = monitoring_reading(v, key)
        if r is not None:
            return r.name
    return None


# What libtpu answered -------------------------------------------------------------

def percentile_of(d: DistributionReading, p: float) -> float | None:
    """``d``'s P``p`` from its buckets when it has them, else as it was sent."""
    from tpu_info.contract.buckets import percentile

    if d.buckets is not None and d.count:
        return percentile(d.buckets, d.count, p, d.min, d.max)
    return d.percentile(p)


def has_value(m: GoogleMetric, r: LibtpuRead) -> bool:
    """True when ``r`` holds something to show for ``m``."""
    if r.error or not r.served:
        return False
    if m.source is Source.LIBTPU_GAUGE:
        return bool(r.gauges)
    if m.source is Source.LIBTPU_LATENCY:
        return bool(r.latencies)
    return bool(r.cores)
