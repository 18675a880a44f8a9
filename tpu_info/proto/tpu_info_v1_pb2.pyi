from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Unit(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNIT_UNSPECIFIED: _ClassVar[Unit]
    UNIT_NS: _ClassVar[Unit]
    UNIT_BYTES: _ClassVar[Unit]
    UNIT_NUMBER: _ClassVar[Unit]
UNIT_UNSPECIFIED: Unit
UNIT_NS: Unit
UNIT_BYTES: Unit
UNIT_NUMBER: Unit

class Cursor(_message.Message):
    __slots__ = ("instance", "generation")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    instance: str
    generation: int
    def __init__(self, instance: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("events_since", "max_events", "cursor")
    EVENTS_SINCE_FIELD_NUMBER: _ClassVar[int]
    MAX_EVENTS_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    events_since: int
    max_events: int
    cursor: Cursor
    def __init__(self, events_since: _Optional[int] = ..., max_events: _Optional[int] = ..., cursor: _Optional[_Union[Cursor, _Mapping]] = ...) -> None: ...

class StreamRequest(_message.Message):
    __slots__ = ("interval_ms", "events_since", "max_events", "cursor")
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_SINCE_FIELD_NUMBER: _ClassVar[int]
    MAX_EVENTS_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    interval_ms: int
    events_since: int
    max_events: int
    cursor: Cursor
    def __init__(self, interval_ms: _Optional[int] = ..., events_since: _Optional[int] = ..., max_events: _Optional[int] = ..., cursor: _Optional[_Union[Cursor, _Mapping]] = ...) -> None: ...

class Process(_message.Message):
    __slots__ = ("pid", "name", "argv", "host", "user", "engine", "versions", "start_time_unix", "waiting", "process_index", "process_count", "process_index_source")
    class VersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    START_TIME_UNIX_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    PROCESS_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROCESS_COUNT_FIELD_NUMBER: _ClassVar[int]
    PROCESS_INDEX_SOURCE_FIELD_NUMBER: _ClassVar[int]
    pid: int
    name: str
    argv: _containers.RepeatedScalarFieldContainer[str]
    host: str
    user: str
    engine: str
    versions: _containers.ScalarMap[str, str]
    start_time_unix: float
    waiting: str
    process_index: int
    process_count: int
    process_index_source: str
    def __init__(self, pid: _Optional[int] = ..., name: _Optional[str] = ..., argv: _Optional[_Iterable[str]] = ..., host: _Optional[str] = ..., user: _Optional[str] = ..., engine: _Optional[str] = ..., versions: _Optional[_Mapping[str, str]] = ..., start_time_unix: _Optional[float] = ..., waiting: _Optional[str] = ..., process_index: _Optional[int] = ..., process_count: _Optional[int] = ..., process_index_source: _Optional[str] = ...) -> None: ...

class Memory(_message.Message):
    __slots__ = ("used_bytes", "peak_bytes", "limit_bytes", "source", "reason")
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    used_bytes: int
    peak_bytes: int
    limit_bytes: int
    source: str
    reason: str
    def __init__(self, used_bytes: _Optional[int] = ..., peak_bytes: _Optional[int] = ..., limit_bytes: _Optional[int] = ..., source: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("id", "kind", "platform", "memory", "busy_percent", "busy_reason", "busy_source")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    BUSY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    BUSY_REASON_FIELD_NUMBER: _ClassVar[int]
    BUSY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    id: int
    kind: str
    platform: str
    memory: Memory
    busy_percent: float
    busy_reason: str
    busy_source: str
    def __init__(self, id: _Optional[int] = ..., kind: _Optional[str] = ..., platform: _Optional[str] = ..., memory: _Optional[_Union[Memory, _Mapping]] = ..., busy_percent: _Optional[float] = ..., busy_reason: _Optional[str] = ..., busy_source: _Optional[str] = ...) -> None: ...

class Counter(_message.Message):
    __slots__ = ("name", "value", "unit", "help")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    HELP_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: int
    unit: Unit
    help: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[int] = ..., unit: _Optional[_Union[Unit, str]] = ..., help: _Optional[str] = ...) -> None: ...

class Buckets(_message.Message):
    __slots__ = ("gamma", "positive_keys", "positive_counts", "negative_keys", "negative_counts", "zero")
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    POSITIVE_KEYS_FIELD_NUMBER: _ClassVar[int]
    POSITIVE_COUNTS_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_KEYS_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_COUNTS_FIELD_NUMBER: _ClassVar[int]
    ZERO_FIELD_NUMBER: _ClassVar[int]
    gamma: float
    positive_keys: _containers.RepeatedScalarFieldContainer[int]
    positive_counts: _containers.RepeatedScalarFieldContainer[int]
    negative_keys: _containers.RepeatedScalarFieldContainer[int]
    negative_counts: _containers.RepeatedScalarFieldContainer[int]
    zero: int
    def __init__(self, gamma: _Optional[float] = ..., positive_keys: _Optional[_Iterable[int]] = ..., positive_counts: _Optional[_Iterable[int]] = ..., negative_keys: _Optional[_Iterable[int]] = ..., negative_counts: _Optional[_Iterable[int]] = ..., zero: _Optional[int] = ...) -> None: ...

class Distribution(_message.Message):
    __slots__ = ("name", "unit", "count", "total", "min", "max", "rate_per_second", "value_rate_per_second", "percentile_percents", "percentile_values", "recent_times_unix", "recent_values", "buckets", "help", "series")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    RATE_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    VALUE_RATE_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    PERCENTILE_PERCENTS_FIELD_NUMBER: _ClassVar[int]
    PERCENTILE_VALUES_FIELD_NUMBER: _ClassVar[int]
    RECENT_TIMES_UNIX_FIELD_NUMBER: _ClassVar[int]
    RECENT_VALUES_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    HELP_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    name: str
    unit: Unit
    count: int
    total: float
    min: float
    max: float
    rate_per_second: float
    value_rate_per_second: float
    percentile_percents: _containers.RepeatedScalarFieldContainer[float]
    percentile_values: _containers.RepeatedScalarFieldContainer[float]
    recent_times_unix: _containers.RepeatedScalarFieldContainer[float]
    recent_values: _containers.RepeatedScalarFieldContainer[float]
    buckets: Buckets
    help: str
    series: RunSeries
    def __init__(self, name: _Optional[str] = ..., unit: _Optional[_Union[Unit, str]] = ..., count: _Optional[int] = ..., total: _Optional[float] = ..., min: _Optional[float] = ..., max: _Optional[float] = ..., rate_per_second: _Optional[float] = ..., value_rate_per_second: _Optional[float] = ..., percentile_percents: _Optional[_Iterable[float]] = ..., percentile_values: _Optional[_Iterable[float]] = ..., recent_times_unix: _Optional[_Iterable[float]] = ..., recent_values: _Optional[_Iterable[float]] = ..., buckets: _Optional[_Union[Buckets, _Mapping]] = ..., help: _Optional[str] = ..., series: _Optional[_Union[RunSeries, _Mapping]] = ...) -> None: ...

class RunSeries(_message.Message):
    __slots__ = ("width", "first_unix", "last_unix", "counts", "totals", "mins", "maxs")
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    FIRST_UNIX_FIELD_NUMBER: _ClassVar[int]
    LAST_UNIX_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    MINS_FIELD_NUMBER: _ClassVar[int]
    MAXS_FIELD_NUMBER: _ClassVar[int]
    width: int
    first_unix: _containers.RepeatedScalarFieldContainer[float]
    last_unix: _containers.RepeatedScalarFieldContainer[float]
    counts: _containers.RepeatedScalarFieldContainer[int]
    totals: _containers.RepeatedScalarFieldContainer[float]
    mins: _containers.RepeatedScalarFieldContainer[float]
    maxs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, width: _Optional[int] = ..., first_unix: _Optional[_Iterable[float]] = ..., last_unix: _Optional[_Iterable[float]] = ..., counts: _Optional[_Iterable[int]] = ..., totals: _Optional[_Iterable[float]] = ..., mins: _Optional[_Iterable[float]] = ..., maxs: _Optional[_Iterable[float]] = ...) -> None: ...

class RecompileCause(_message.Message):
    __slots__ = ("time_unix", "description", "location", "argument", "before", "after", "via", "kind", "dim", "name", "guard", "sync", "syncs_after", "seconds")
    TIME_UNIX_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    ARGUMENT_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    GUARD_FIELD_NUMBER: _ClassVar[int]
    SYNC_FIELD_NUMBER: _ClassVar[int]
    SYNCS_AFTER_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    time_unix: float
    description: str
    location: str
    argument: str
    before: str
    after: str
    via: str
    kind: str
    dim: int
    name: str
    guard: str
    sync: int
    syncs_after: int
    seconds: float
    def __init__(self, time_unix: _Optional[float] = ..., description: _Optional[str] = ..., location: _Optional[str] = ..., argument: _Optional[str] = ..., before: _Optional[str] = ..., after: _Optional[str] = ..., via: _Optional[str] = ..., kind: _Optional[str] = ..., dim: _Optional[int] = ..., name: _Optional[str] = ..., guard: _Optional[str] = ..., sync: _Optional[int] = ..., syncs_after: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class Signature(_message.Message):
    __slots__ = ("args",)
    ARGS_FIELD_NUMBER: _ClassVar[int]
    args: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, args: _Optional[_Iterable[str]] = ...) -> None: ...

class Graph(_message.Message):
    __slots__ = ("hash", "name", "engine", "first_seen_unix", "last_seen_unix", "compiles", "compile_seconds_total", "compile_seconds_last", "cache_hits", "executions", "signature", "signatures", "causes", "device_seconds", "device_samples", "loop_line", "loop_ops", "const_bytes")
    HASH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEEN_UNIX_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_FIELD_NUMBER: _ClassVar[int]
    COMPILES_FIELD_NUMBER: _ClassVar[int]
    COMPILE_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    COMPILE_SECONDS_LAST_FIELD_NUMBER: _ClassVar[int]
    CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    EXECUTIONS_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURES_FIELD_NUMBER: _ClassVar[int]
    CAUSES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    LOOP_LINE_FIELD_NUMBER: _ClassVar[int]
    LOOP_OPS_FIELD_NUMBER: _ClassVar[int]
    CONST_BYTES_FIELD_NUMBER: _ClassVar[int]
    hash: str
    name: str
    engine: str
    first_seen_unix: float
    last_seen_unix: float
    compiles: int
    compile_seconds_total: float
    compile_seconds_last: float
    cache_hits: int
    executions: int
    signature: _containers.RepeatedScalarFieldContainer[str]
    signatures: _containers.RepeatedCompositeFieldContainer[Signature]
    causes: _containers.RepeatedCompositeFieldContainer[RecompileCause]
    device_seconds: float
    device_samples: int
    loop_line: str
    loop_ops: int
    const_bytes: int
    def __init__(self, hash: _Optional[str] = ..., name: _Optional[str] = ..., engine: _Optional[str] = ..., first_seen_unix: _Optional[float] = ..., last_seen_unix: _Optional[float] = ..., compiles: _Optional[int] = ..., compile_seconds_total: _Optional[float] = ..., compile_seconds_last: _Optional[float] = ..., cache_hits: _Optional[int] = ..., executions: _Optional[int] = ..., signature: _Optional[_Iterable[str]] = ..., signatures: _Optional[_Iterable[_Union[Signature, _Mapping]]] = ..., causes: _Optional[_Iterable[_Union[RecompileCause, _Mapping]]] = ..., device_seconds: _Optional[float] = ..., device_samples: _Optional[int] = ..., loop_line: _Optional[str] = ..., loop_ops: _Optional[int] = ..., const_bytes: _Optional[int] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("seq", "time_unix", "kind", "name", "graph_hash", "detail", "location", "value", "via")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    GRAPH_HASH_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    seq: int
    time_unix: float
    kind: str
    name: str
    graph_hash: str
    detail: str
    location: str
    value: float
    via: str
    def __init__(self, seq: _Optional[int] = ..., time_unix: _Optional[float] = ..., kind: _Optional[str] = ..., name: _Optional[str] = ..., graph_hash: _Optional[str] = ..., detail: _Optional[str] = ..., location: _Optional[str] = ..., value: _Optional[float] = ..., via: _Optional[str] = ...) -> None: ...

class Site(_message.Message):
    __slots__ = ("kind", "location", "count", "bytes", "seconds", "function", "detail", "last_seen_unix", "first_seen_unix", "phase", "via", "occurrences", "steps_spanned", "drain_seconds", "timed", "timed_bytes", "work", "gaps", "gap_seconds", "within", "in_generator", "estimated", "interval_share")
    KIND_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEEN_UNIX_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    OCCURRENCES_FIELD_NUMBER: _ClassVar[int]
    STEPS_SPANNED_FIELD_NUMBER: _ClassVar[int]
    DRAIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TIMED_FIELD_NUMBER: _ClassVar[int]
    TIMED_BYTES_FIELD_NUMBER: _ClassVar[int]
    WORK_FIELD_NUMBER: _ClassVar[int]
    GAPS_FIELD_NUMBER: _ClassVar[int]
    GAP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WITHIN_FIELD_NUMBER: _ClassVar[int]
    IN_GENERATOR_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_SHARE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    location: str
    count: int
    bytes: int
    seconds: float
    function: str
    detail: str
    last_seen_unix: float
    first_seen_unix: float
    phase: str
    via: str
    occurrences: int
    steps_spanned: int
    drain_seconds: float
    timed: int
    timed_bytes: int
    work: str
    gaps: int
    gap_seconds: float
    within: str
    in_generator: bool
    estimated: bool
    interval_share: float
    def __init__(self, kind: _Optional[str] = ..., location: _Optional[str] = ..., count: _Optional[int] = ..., bytes: _Optional[int] = ..., seconds: _Optional[float] = ..., function: _Optional[str] = ..., detail: _Optional[str] = ..., last_seen_unix: _Optional[float] = ..., first_seen_unix: _Optional[float] = ..., phase: _Optional[str] = ..., via: _Optional[str] = ..., occurrences: _Optional[int] = ..., steps_spanned: _Optional[int] = ..., drain_seconds: _Optional[float] = ..., timed: _Optional[int] = ..., timed_bytes: _Optional[int] = ..., work: _Optional[str] = ..., gaps: _Optional[int] = ..., gap_seconds: _Optional[float] = ..., within: _Optional[str] = ..., in_generator: _Optional[bool] = ..., estimated: _Optional[bool] = ..., interval_share: _Optional[float] = ...) -> None: ...

class Steps(_message.Message):
    __slots__ = ("count", "source", "basis", "seconds_total", "first_unix", "last_unix", "excluded_calls", "loop_ended", "step_line")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    BASIS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    FIRST_UNIX_FIELD_NUMBER: _ClassVar[int]
    LAST_UNIX_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_CALLS_FIELD_NUMBER: _ClassVar[int]
    LOOP_ENDED_FIELD_NUMBER: _ClassVar[int]
    STEP_LINE_FIELD_NUMBER: _ClassVar[int]
    count: int
    source: str
    basis: str
    seconds_total: float
    first_unix: float
    last_unix: float
    excluded_calls: int
    loop_ended: bool
    step_line: str
    def __init__(self, count: _Optional[int] = ..., source: _Optional[str] = ..., basis: _Optional[str] = ..., seconds_total: _Optional[float] = ..., first_unix: _Optional[float] = ..., last_unix: _Optional[float] = ..., excluded_calls: _Optional[int] = ..., loop_ended: _Optional[bool] = ..., step_line: _Optional[str] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("protocol_version", "taken_at_unix", "process", "devices", "counters", "distributions", "graphs", "events", "last_seq", "uptime_seconds", "sites", "steps", "blind_spots", "instance", "generation", "unchanged", "kept")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TAKEN_AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTIONS_FIELD_NUMBER: _ClassVar[int]
    GRAPHS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SITES_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    BLIND_SPOTS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    taken_at_unix: float
    process: Process
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    counters: _containers.RepeatedCompositeFieldContainer[Counter]
    distributions: _containers.RepeatedCompositeFieldContainer[Distribution]
    graphs: _containers.RepeatedCompositeFieldContainer[Graph]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    last_seq: int
    uptime_seconds: float
    sites: _containers.RepeatedCompositeFieldContainer[Site]
    steps: Steps
    blind_spots: _containers.RepeatedScalarFieldContainer[str]
    instance: str
    generation: int
    unchanged: _containers.RepeatedScalarFieldContainer[str]
    kept: _containers.RepeatedCompositeFieldContainer[Kept]
    def __init__(self, protocol_version: _Optional[int] = ..., taken_at_unix: _Optional[float] = ..., process: _Optional[_Union[Process, _Mapping]] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., counters: _Optional[_Iterable[_Union[Counter, _Mapping]]] = ..., distributions: _Optional[_Iterable[_Union[Distribution, _Mapping]]] = ..., graphs: _Optional[_Iterable[_Union[Graph, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., last_seq: _Optional[int] = ..., uptime_seconds: _Optional[float] = ..., sites: _Optional[_Iterable[_Union[Site, _Mapping]]] = ..., steps: _Optional[_Union[Steps, _Mapping]] = ..., blind_spots: _Optional[_Iterable[str]] = ..., instance: _Optional[str] = ..., generation: _Optional[int] = ..., unchanged: _Optional[_Iterable[str]] = ..., kept: _Optional[_Iterable[_Union[Kept, _Mapping]]] = ...) -> None: ...

class Kept(_message.Message):
    __slots__ = ("part", "keys")
    PART_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    part: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, part: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ...) -> None: ...

class SavedRun(_message.Message):
    __slots__ = ("format_version", "snapshot", "ended", "ended_unix", "exit_code", "signal", "error")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    ENDED_UNIX_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    snapshot: Snapshot
    ended: str
    ended_unix: float
    exit_code: int
    signal: str
    error: str
    def __init__(self, format_version: _Optional[int] = ..., snapshot: _Optional[_Union[Snapshot, _Mapping]] = ..., ended: _Optional[str] = ..., ended_unix: _Optional[float] = ..., exit_code: _Optional[int] = ..., signal: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class ListMetricsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MetricInfo(_message.Message):
    __slots__ = ("name", "kind", "unit", "help")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    HELP_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    unit: Unit
    help: str
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., unit: _Optional[_Union[Unit, str]] = ..., help: _Optional[str] = ...) -> None: ...

class ListMetricsReply(_message.Message):
    __slots__ = ("protocol_version", "metrics")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    metrics: _containers.RepeatedCompositeFieldContainer[MetricInfo]
    def __init__(self, protocol_version: _Optional[int] = ..., metrics: _Optional[_Iterable[_Union[MetricInfo, _Mapping]]] = ...) -> None: ...

class CaptureRequest(_message.Message):
    __slots__ = ("duration_ms", "device")
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    duration_ms: int
    device: bool
    def __init__(self, duration_ms: _Optional[int] = ..., device: _Optional[bool] = ...) -> None: ...

class CaptureFile(_message.Message):
    __slots__ = ("name", "size_bytes", "data", "server_path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SERVER_PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    size_bytes: int
    data: bytes
    server_path: str
    def __init__(self, name: _Optional[str] = ..., size_bytes: _Optional[int] = ..., data: _Optional[bytes] = ..., server_path: _Optional[str] = ...) -> None: ...

class CaptureReply(_message.Message):
    __slots__ = ("trace", "format", "protocol_version", "files", "truncated", "notes", "event_count")
    TRACE_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    trace: bytes
    format: str
    protocol_version: int
    files: _containers.RepeatedCompositeFieldContainer[CaptureFile]
    truncated: bool
    notes: _containers.RepeatedScalarFieldContainer[str]
    event_count: int
    def __init__(self, trace: _Optional[bytes] = ..., format: _Optional[str] = ..., protocol_version: _Optional[int] = ..., files: _Optional[_Iterable[_Union[CaptureFile, _Mapping]]] = ..., truncated: _Optional[bool] = ..., notes: _Optional[_Iterable[str]] = ..., event_count: _Optional[int] = ...) -> None: ...
