"""Plain typed records that every renderer consumes.

One fetch produces one :class:`Snapshot`; tables, reports, findings and the
dashboard are pure functions of it. The in-process hook builds snapshots from
its registry, the gRPC client builds them from the wire, and both sides speak
only these records. Nothing here imports grpc, torch or jax.

A reading that is missing is ``None`` with the reason kept beside it (for
example :attr:`MemoryReading.reason`), so renderers never show a bare "N/A".

Example:
    >>> from tpu_info.contract.model import Unit, CounterReading
    >>> CounterReading(name="MarkStep", value=3, unit=Unit.NUMBER).value
    3
"""

from __future__ import annotations

import array
import enum
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import overload

from tpu_info.contract.cause_kinds import CauseKind

# The diagnosis records live in their own module; re-exported: one model.
from tpu_info.contract.diagnosis import (  # noqa: F401
    INDEXING_OPS,
    NNX_CACHED_PARTIAL,
    NNX_JIT,
    STEPS_INFERRED,
    STEPS_MARKED,
    Finding,
    Phase,
    Severity,
    SiteKind,
    SiteReading,
    StepsReading,
)
from tpu_info.contract.series import RunSeries


class Unit(str, enum.Enum):
    """What a counter or distribution counts; drives formatting."""

    TIME_NS = "ns"
    BYTES = "bytes"
    NUMBER = "1"


# The description of a compile that is a function's first, in every engine.
FIRST_CALL = "first call"

# Opens a first compile's event detail when the compile was reached through
# nested user functions: ``called from accuracy() at /w/train.py:104 via predict()``.
CALLED_FROM = "called from "

# torch_xla's percentile set, in percent.
PERCENTILES: tuple[float, ...] = (1.0, 5.0, 10.0, 20.0, 50.0, 80.0, 90.0, 95.0, 99.0)


@dataclass(frozen=True, slots=True)
class CounterReading:
    """A monotonic integer counter at snapshot time."""

    name: str
    value: int
    unit: Unit = Unit.NUMBER
    help: str = ""


@dataclass(frozen=True, slots=True)
class BucketCounts:
    """Log-spaced bucket counts of a distribution (mergeable by adding counts).

    Bucket ``i`` holds samples ``v`` with ``gamma**(i-1) < |v| <= gamma**i``;
    ``negative`` holds the same for negative samples; ``zero`` counts zeros.
    """

    gamma: float
    positive: Mapping[int, int]
    negative: Mapping[int, int] = field(default_factory=dict)
    zero: int = 0


class Samples(Sequence[tuple[float, float]]):
    """Recent samples, ``(unix_time, value)`` pairs in time order, held as
    two arrays of doubles (``times``, ``values``; the wire's own shape).

    It reads like a tuple of pairs, but a reading's 64 samples are three
    objects instead of 65 tuples: the garbage collector has nothing inside
    to walk (each scrape makes readings, and a collection that lands in one
    walks every young object), and a decode copies two arrays in C.

    Example:
        >>> s = Samples([1.0, 2.0], [10.0, 20.0])
        >>> s[-1], len(s), s == ((1.0, 10.0), (2.0, 20.0))
        ((2.0, 20.0), 2, True)
    """

    __slots__ = ("times", "values")

    def __init__(self, times: Iterable[float] = (), values: Iterable[float] = ()) -> None:
        self.times = times if type(times) is array.array else array.array("d", times)
        self.values = values if type(values) is array.array else array.array("d", values)
        if len(self.times) != len(self.values):
            raise ValueError(f"{len(self.times)} times but {len(self.values)} values")

    @classmethod
    def of(cls, pairs: Iterable[tuple[float, float]]) -> Samples:
        """Samples from ``(time, value)`` pairs."""
        pairs = list(pairs)
        return cls([t for t, _ in pairs], [v for _, v in pairs])

    def __len__(self) -> int:
        return len(self.times)

    @overload
    def __getitem__(self, i: int) -> tuple[float, float]: ...
    @overload
    def __getitem__(self, i: slice) -> Samples: ...
    def __getitem__(self, i: int | slice) -> tuple[float, float] | Samples:
        if isinstance(i, slice):
            return Samples(self.times[i], self.values[i])
        return (self.times[i], self.values[i])

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return zip(self.times, self.values, strict=True)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Samples):
            return self.times == other.times and self.values == other.values
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"Samples({list(self)!r})"


@dataclass(frozen=True, slots=True)
class DistributionReading:
    """A distribution (torch_xla's "Metric") at snapshot time.

    ``percentiles`` pairs each percent in :data:`PERCENTILES` with its value,
    estimated from ``buckets`` to within the bucket's relative error of the
    exact (numpy, linear-interpolation) percentile of every sample recorded
    since the last clear.
    """

    name: str
    unit: Unit
    count: int
    total: float
    min: float | None
    max: float | None
    rate_per_second: float | None = None
    value_rate_per_second: float | None = None
    percentiles: tuple[tuple[float, float], ...] = ()
    recent: Sequence[tuple[float, float]] = ()  # a Samples from the hook and the wire
    buckets: BucketCounts | None = None
    help: str = ""
    # The whole run, bounded (StepTime's, from hooks that keep one); None
    # from older hooks and saved runs, and for other distributions.
    series: RunSeries | None = None

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def percentile(self, percent: float) -> float | None:
        """The value at ``percent`` if it was computed, else None."""
        for p, v in self.percentiles:
            if p == percent:
                return v
        return None


@dataclass(frozen=True, slots=True)
class RecompileCause:
    """Why a graph was (re)compiled: the engine's words (``description``) and
    the change typed (``kind`` and the fields after it, see
    :mod:`tpu_info.contract.cause_kinds`); the views advise by kind."""

    time_unix: float
    description: str
    location: str | None = None
    argument: str | None = None
    before: str | None = None
    after: str | None = None
    # The library call the user's line went through (``flax nnx.jit``);
    # empty when the line called the engine itself.
    via: str = ""
    # A CauseKind; a kind this side does not know (a newer hook's) as its string.
    kind: str = CauseKind.UNKNOWN
    dim: int | None = None  # the shape dimension that changed
    name: str = ""  # the config option, context, global state or tensor property
    guard: str = ""  # the torch.compile guard that failed (size, dtype, value...)
    sync: int | None = None  # torch_xla: the sync the new graph came in
    syncs_after: int | None = None  # ... and how many after the last new graph at its line
    # This compile's own time, measured at the compile (torch.compile: Dynamo's
    # trace and the backend's, plus the backward AOTAutograd compiled for it
    # later); None: not told (an older hook, an engine that does not say).
    seconds: float | None = None


@dataclass(frozen=True, slots=True)
class GraphRecord:
    """One compiled graph, identified by its hash."""

    hash: str
    name: str
    engine: str
    first_seen_unix: float
    last_seen_unix: float
    compiles: int = 0
    compile_seconds_total: float = 0.0
    compile_seconds_last: float = 0.0
    cache_hits: int = 0
    executions: int | None = None
    signature: tuple[str, ...] = ()
    signatures: tuple[tuple[str, ...], ...] = ()
    causes: tuple[RecompileCause, ...] = ()
    # The device's time for one execution (median over ``device_samples``
    # executions whose completion the hook observed off the training thread);
    # None: not measured.
    device_seconds: float | None = None
    device_samples: int = 0
    # The user's line that put ``loop_ops`` of the graph's top-level
    # operations into it, when they were a large part of it (a Python loop
    # unrolled into the traced function); "" none or not told.
    loop_line: str = ""
    loop_ops: int = 0
    # Bytes of arrays the traced function closed over (not its arguments),
    # compiled into the graph as constants: 0 none or not told.
    const_bytes: int = 0

    @property
    def short_hash(self) -> str:
        return self.hash[:12]


class EventKind(enum.StrEnum):
    """What an :class:`Event` records: the kinds the hook emits.

    ``Event.kind`` is one of these, or a plain string that is equal to one
    (decoded from the wire), or a kind a newer hook emits: renderers show an
    unknown kind as it is.
    """

    COMPILE = "compile"  # a graph's first compile
    RECOMPILE = "recompile"  # a known function compiled again (``detail``: the cause)
    CACHE_HIT = "cache_hit"  # a compile a cache answered
    TRANSFER_TO_DEVICE = "transfer_to_device"  # ``value``: bytes
    TRANSFER_FROM_DEVICE = "transfer_from_device"  # ``value``: bytes
    STEP = "step"
    HOOK_ERROR = "hook_error"  # an exception inside the hook, counted and swallowed
    GRAPH_BREAK = "graph_break"  # torch.compile split a function (``detail``: why)


# A graph_break event's detail marks a break Dynamo cannot resume from with
# one of these, before Dynamo's hints: the torch.compile hook writes them, the
# findings read them (one spelling, here).
UNRESUMABLE = "[unresumable]"  # Dynamo runs the whole function eagerly
UNRESUMABLE_REST = "[unresumable: the rest of the function runs eagerly]"  # after the break

# Kinds that are a compile (``value``: its seconds) and a transfer (``value``: bytes).
COMPILE_KINDS = frozenset({EventKind.COMPILE, EventKind.RECOMPILE})
TRANSFER_KINDS = frozenset({EventKind.TRANSFER_TO_DEVICE, EventKind.TRANSFER_FROM_DEVICE})


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of the recent-events ring; ``seq`` grows by one per event.

    ``kind`` is an :class:`EventKind` (a plain string on the wire).
    """

    seq: int
    time_unix: float
    kind: str
    name: str = ""
    graph_hash: str = ""
    detail: str = ""
    location: str | None = None
    value: float | None = None
    via: str = ""  # the library call the user's line went through


@dataclass(frozen=True, slots=True)
class MemoryReading:
    """Device memory in bytes; ``source`` says where the numbers came from.

    Sources: ``memory_stats`` (the runtime's allocator), ``live_arrays`` (sum
    of live array buffers; limit is host RAM), ``libtpu``, ``nvml``, or
    ``none`` with ``reason`` saying why nothing could be read.
    """

    used_bytes: int | None
    peak_bytes: int | None = None
    limit_bytes: int | None = None
    source: str = "none"
    reason: str = ""


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    """One accelerator as a hooked process (or the host) sees it.

    ``busy_source`` says whose busy % it is: :data:`BUSY_FROM_LIBTPU` (the
    chip's duty cycle, from libtpu's service or its SDK in the process),
    :data:`BUSY_FROM_ESTIMATE` (the hook's host-side estimate), or "" (not
    said: an older hook, which sent its estimate). Outputs label any source
    but libtpu as an estimate (``~``).
    """

    id: int
    kind: str
    platform: str
    memory: MemoryReading
    busy_percent: float | None = None
    busy_reason: str = ""
    busy_source: str = ""


BUSY_FROM_LIBTPU, BUSY_FROM_ESTIMATE = "libtpu", "estimate"


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """The hooked process."""

    pid: int
    name: str
    argv: tuple[str, ...] = ()
    host: str = ""
    user: str = ""
    engine: str = ""
    versions: Mapping[str, str] = field(default_factory=dict)
    start_time_unix: float = 0.0
    # Engines the hook waits for (comma separated): hooked once imported.
    waiting: str = ""
    # Rank among the job's processes and how many there are (None: nothing
    # says); the source is jax, torch.distributed, torch_xla or env.
    process_index: int | None = None
    process_count: int | None = None
    process_index_source: str = ""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one fetch knows about one hooked process."""

    taken_at_unix: float
    process: ProcessRecord | None = None
    devices: tuple[DeviceRecord, ...] = ()
    counters: tuple[CounterReading, ...] = ()
    distributions: tuple[DistributionReading, ...] = ()
    graphs: tuple[GraphRecord, ...] = ()
    events: tuple[Event, ...] = ()
    last_seq: int = 0
    uptime_seconds: float = 0.0
    # (where, why) for each value a client kept out when it decoded this
    # snapshot (not a finite number, beyond a count bound); empty in the hook.
    left_out: tuple[tuple[str, str], ...] = ()
    # Lines of the user's code that synced or moved data implicitly.
    sites: tuple[SiteReading, ...] = ()
    steps: StepsReading | None = None
    # What the hook cannot see in this process, in words ("np.asarray(x) on
    # CPU: numpy's zero-copy buffer protocol bypasses the hook"): a report
    # that found nothing says these instead of "No problems found".
    blind_spots: tuple[str, ...] = ()

    def counter(self, name: str) -> int:
        """A counter's value, 0 if it never counted."""
        for c in self.counters:
            if c.name == name:
                return c.value
        return 0

    def distribution(self, name: str) -> DistributionReading | None:
        for d in self.distributions:
            if d.name == name:
                return d
        return None


@dataclass(frozen=True, slots=True)
class ChipRecord:
    """One accelerator found on this machine, outside any process.

    TPU chips come from sysfs, NVIDIA GPUs from NVML. ``reasons`` maps a field
    name (``hbm_used_bytes``, ``owner_pids``, ...) to why it is missing or
    incomplete, so a renderer can show "N/A" and ``doctor`` can say why.
    """

    index: int
    vendor: str  # "tpu" or "nvidia"
    kind: str  # "v5e", "v4", "NVIDIA H100 80GB HBM3", ...
    device_path: str | None
    pci_address: str
    hbm_total_bytes: int | None = None
    hbm_used_bytes: int | None = None
    busy_percent: float | None = None
    cores_per_chip: int | None = None
    devices_per_chip: int | None = None
    owner_pids: tuple[int, ...] = ()
    reasons: Mapping[str, str] = field(default_factory=dict)
    # Whether this host's programs can open the chip: its device node exists
    # here (a sandbox may pass through one of the host's four chips). Tables
    # list usable chips only, unless asked for all.
    usable: bool = True

    @property
    def name(self) -> str:
        """``tpu0``, ``gpu1``: how tables name the chip."""
        return f"{'gpu' if self.vendor == 'nvidia' else 'tpu'}{self.index}"


@dataclass(frozen=True, slots=True)
class OwnerRecord:
    """A process that holds a local chip open, hooked or not (from ``/proc``).

    Empty strings are what ``/proc`` would not tell (the process exited
    between the scans, or another user's ``cmdline``).
    """

    pid: int
    name: str = ""  # /proc/<pid>/comm: python3
    user: str = ""  # the real uid's name, or the uid as digits
    command: str = ""  # /proc/<pid>/cmdline joined by spaces


@dataclass(frozen=True, slots=True)
class LocalScan:
    """Every local accelerator, and why some could not be seen.

    ``reasons`` maps a scope (``tpu``, ``gpu``, ``owners``) to a sentence:
    no TPU chips in sysfs, NVML absent, no permission to read ``/proc``.
    ``owners`` names each pid of any chip's ``owner_pids``.
    """

    chips: tuple[ChipRecord, ...] = ()
    reasons: Mapping[str, str] = field(default_factory=dict)
    owners: tuple[OwnerRecord, ...] = ()

    def owner(self, pid: int) -> OwnerRecord | None:
        """The owner record of ``pid``, None when the scan did not name it."""
        return next((o for o in self.owners if o.pid == pid), None)

    @property
    def tpus(self) -> tuple[ChipRecord, ...]:
        return tuple(c for c in self.chips if c.vendor == "tpu")

    @property
    def gpus(self) -> tuple[ChipRecord, ...]:
        return tuple(c for c in self.chips if c.vendor == "nvidia")


@dataclass(frozen=True, slots=True)
class MetricInfo:
    """One name a hook records (``tpu_info.v1.Monitor/ListMetrics``).

    ``kind`` is ``"counter"`` or ``"distribution"``.
    """

    name: str
    kind: str
    unit: Unit
    help: str = ""
