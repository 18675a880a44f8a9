"""What one ``tpu-info`` run looked at, and the values its tables derive from it.

A :class:`TargetView` is one target (a hooked process, or libtpu) with the
:class:`~tpu_info.contract.model.Snapshot` read from it or the error that stopped the
read; a :class:`Header` says when and where. The helpers below turn records
into the numbers the tables and ``--json`` show (transfer percentiles, engine
labels, per-chip HBM) and say why a number is missing: each returns ``None``
with a reason rather than raising. Everything here is pure.

Example:
    >>> from tpu_info.contract.model import Snapshot
    >>> v = TargetView("127.0.0.1:8431", Snapshot(taken_at_unix=0.0))
    >>> h2d, d2h = transfer_stats(v.snapshot)
    >>> h2d.count, h2d.reasons["p50_ns"]
    (0, 'no host->device transfers recorded')
    >>> format_bytes(3 * 2**30), format_ns(1_500_000)
    ('3.00 GiB', '1.50 ms')
"""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, tzinfo

from tpu_info import __version__
from tpu_info.contract import catalog
from tpu_info.contract.buckets import percentile
from tpu_info.contract.model import (
    FIRST_CALL,
    STEPS_INFERRED,
    DistributionReading,
    GraphRecord,
    ProcessRecord,
    RecompileCause,
    Snapshot,
)
from tpu_info.contract.safe import MAX_TEXT, clean  # noqa: F401 - the renderers' one cleaner
from tpu_info.views.causes import classify, clean_type

NA = "N/A"


@dataclass(frozen=True, slots=True)
class TargetView:
    """One target as this run saw it.

    Attributes:
        target: its address (``127.0.0.1:8431``) or another label.
        snapshot: what was read, or None when reading failed.
        error: why nothing was read (port refused, timeout, no hook).
        source: ``hook`` (our service) or ``libtpu`` (the runtime's).
    """

    target: str
    snapshot: Snapshot | None = None
    error: str = ""
    source: str = "hook"

    @property
    def ok(self) -> bool:
        return self.snapshot is not None


@dataclass(frozen=True, slots=True)
class Header:
    """The top lines: who, where, when. ``tz`` None means local time."""

    host: str
    time_unix: float
    version: str = __version__
    libtpu_version: str | None = None
    accelerator_type: str | None = None
    tz: tzinfo | None = None

    @classmethod
    def now(cls, **kwargs: object) -> Header:
        """A header for this host at this moment."""
        return cls(host=socket.gethostname(), time_unix=time.time(), **kwargs)  # type: ignore[arg-type]

    def time_text(self) -> str:
        dt = datetime.fromtimestamp(self.time_unix, tz=self.tz).astimezone(self.tz)
        return dt.strftime("%Y-%m-%d %H:%M:%S %Z").strip()


class Reasons:
    """Collects ``(where, reason)`` for every value shown as N/A."""

    def __init__(self) -> None:
        self.pairs: list[tuple[str, str]] = []

    def na(self, where: str, reason: str) -> str:
        """Records why ``where`` is missing; returns the text to show."""
        pair = (where, reason or "not reported")
        if pair not in self.pairs:
            self.pairs.append(pair)
        return NA


# Formatting -----------------------------------------------------------------

def _sig3(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def format_bytes(n: float) -> str:
    """1024-based, three significant digits: ``512 MiB``, ``3.00 GiB``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{_sig3(n / scale)} {unit}"
    return f"{n:.0f} B"


def format_gib_pair(used: int | None, total: int | None) -> str:
    """Google's HBM format, ``1.20 GiB / 16.00 GiB``, with N/A for a gap."""
    u = NA if used is None else f"{used / 2**30:.2f} GiB"
    t = NA if total is None else f"{total / 2**30:.2f} GiB"
    return f"{u} / {t}"


def format_ns(ns: float) -> str:
    """A duration with three significant digits: ``812 ns``, ``1.50 ms``,
    ``12.3 s``."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            return f"{_sig3(ns / scale)} {unit}"
    return f"{ns:.0f} ns"


def format_uptime(seconds: float) -> str:
    """``45s``, ``12m03s``, ``3h04m``, ``2d03h`` (``-`` for a number that is
    not finite: a peer may send anything)."""
    if not math.isfinite(seconds):
        return "-"
    s = int(max(0.0, seconds))
    d, s = divmod(s, 86_400)
    h, s = divmod(s, 3_600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d{h:02d}h"
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def format_percent(p: float) -> str:
    return f"{p:.0f}%"


# Derived values ---------------------------------------------------------------

def engine_label(p: ProcessRecord) -> str | None:
    """``jax 0.10.0``; engines joined by commas; None when none reported."""
    names = [e for e in p.engine.split(",") if e]
    if not names:
        return None
    return ", ".join(f"{n} {p.versions[n]}" if n in p.versions else n for n in names)


def steps_label(s: Snapshot, short: bool = False) -> str | None:
    """Steps as tables show them: ``1,200`` when marked, ``1,200 (inferred:
    jit(train_step))`` when the hook picked the step itself (``short``:
    ``~1,200``); None when neither (see :data:`NO_STEPS`)."""
    st = s.steps
    if st is None:
        if not any(c.name == catalog.MARK_STEP for c in s.counters):
            return None
        return f"{s.counter(catalog.MARK_STEP):,}"
    if st.source == STEPS_INFERRED:
        if short:
            return f"~{st.count:,}"
        return f"{st.count:,} (inferred: {clean(st.basis.split(': ', 1)[0], 40)})"
    return f"{st.count:,}"


NO_STEPS = ("the program never called metrics.mark_step() (or its engine's step marker), "
            "and no compiled function has run often enough to infer the step")


def memory_totals(s: Snapshot) -> tuple[int | None, int | None]:
    """Sum of used and of limit bytes over the process's devices (None when
    no device reports it)."""
    used = [d.memory.used_bytes for d in s.devices if d.memory.used_bytes is not None]
    lim = [d.memory.limit_bytes for d in s.devices if d.memory.limit_bytes is not None]
    return (sum(used) if used else None, sum(lim) if lim else None)


def memory_reason(s: Snapshot) -> str:
    """Why a process has no device memory reading."""
    if not s.devices:
        return "the process reported no devices"
    why = {d.memory.reason for d in s.devices if d.memory.used_bytes is None and d.memory.reason}
    return "; ".join(sorted(why)) or "the engine does not report device memory"


# The fewest timed samples a percentile is shown from: below it our views (tables,
# dashboard, JSON) show N/A with the count, because a few timed transfers or
# steps (one of them the slow first) make any percentile of them an accident.
# metrics_report() keeps torch_xla's format and shows what it has. The hooks
# time every one of their first 64 calls (metrics/recording/sampling.py), so
# a distribution of 20 or more holds at least 20 timed values.
MIN_TIMED_SAMPLES = 20


def too_few(count: int) -> str:
    """Why a percentile of ``count`` timed samples is not shown ("" when it is)."""
    if 0 < count < MIN_TIMED_SAMPLES:
        return (f"only {count} timed sample{'s' * (count != 1)} (< {MIN_TIMED_SAMPLES}): "
                "too few for a percentile")
    return ""


@dataclass(frozen=True, slots=True)
class TransferStats:
    """Transfers one way: count, bytes, latency percentiles in ns.

    ``timed`` is how many samples the percentiles stand on: the count of the
    time distribution, which can be below ``count`` (transfers whose bytes
    were counted but that were not timed, such as numpy arguments of a jitted
    call); under sampled timing each timed call also stands for the untimed
    calls of its batch and is counted for them.
    """

    direction: str  # "h2d" or "d2h"
    count: int
    bytes: float | None
    p50_ns: float | None
    p90_ns: float | None
    p95_ns: float | None
    p999_ns: float | None
    reasons: dict[str, str] = field(default_factory=dict)
    # Of ``count``, the transfers nobody asked for (None: the engine does not
    # split them); ``implicit_bytes`` their bytes.
    implicit: int | None = None
    implicit_bytes: int | None = None
    timed: int = 0

    def timed_note(self) -> str:
        """``25 timed`` when the percentiles stand on fewer than all transfers, else ""."""
        return f"{self.timed:,} timed" if 0 < self.timed < self.count else ""


_TRANSFERS = (("h2d", "host->device", catalog.TRANSFER_TO_DEVICE_TIME, catalog.OUTBOUND_DATA),
              ("d2h", "device->host", catalog.TRANSFER_FROM_DEVICE_TIME, catalog.INBOUND_DATA))
_IMPLICIT = {"h2d": (catalog.IMPLICIT_TRANSFER_TO_DEVICE, catalog.IMPLICIT_OUTBOUND_BYTES),
             "d2h": (catalog.IMPLICIT_TRANSFER_FROM_DEVICE, catalog.IMPLICIT_INBOUND_BYTES)}
QUANTILES = (("p50_ns", 50.0), ("p90_ns", 90.0), ("p95_ns", 95.0), ("p999_ns", 99.9))


def dist_percentile(d: DistributionReading, percent: float) -> tuple[float | None, str]:
    """A shipped percentile, else one computed from the buckets, else a reason
    (none from fewer than :data:`MIN_TIMED_SAMPLES` samples)."""
    if d.count == 0:
        return None, "no samples"
    if few := too_few(d.count):
        return None, few
    v = d.percentile(percent)
    if v is not None:
        return v, ""
    if d.buckets is None:
        return None, f"P{percent:g} was not sent and the process sent no bucket counts"
    try:
        value = percentile(d.buckets, d.count, percent, d.min, d.max)
    except (ValueError, ArithmeticError) as e:  # a peer's buckets can overflow a double
        return None, f"bucket counts unusable ({e})"
    if not math.isfinite(value):
        return None, f"bucket counts unusable (P{percent:g} is {value!r})"
    return value, ""


def left_out(s: Snapshot, where: str) -> str:
    """Why the client kept the value at ``where`` out of ``s`` ("" if it did not)."""
    for w, why in s.left_out:
        if w == where:
            return f"the target sent a bad value: {why}"
    return ""


def transfer_stats(s: Snapshot) -> tuple[TransferStats, TransferStats]:
    """Host->device and device->host transfer statistics of one snapshot."""
    out = []
    for short, words, time_name, bytes_name in _TRANSFERS:
        t, b = s.distribution(time_name), s.distribution(bytes_name)
        reasons: dict[str, str] = {}
        # Some transfers have bytes but no time (the jit wrapper's numpy arguments).
        count = max(t.count if t is not None else 0, b.count if b is not None else 0)
        nbytes: float | None = b.total if b is not None else None
        if b is None:
            reasons["bytes"] = (left_out(s, f"distribution {bytes_name}")
                                or (f"no {words} transfers recorded" if count == 0
                                    else f"the engine does not report {bytes_name}"))
            if count == 0:
                nbytes = None
        values: dict[str, float | None] = {}
        for key, pct in QUANTILES:
            if t is None or t.count == 0:
                values[key] = None
                reasons[key] = (left_out(s, f"distribution {time_name}")
                                or (f"no {words} transfers recorded" if count == 0
                                    else f"the engine does not time {words} transfers"))
                continue
            values[key], why = dist_percentile(t, pct)
            if why:
                reasons[key] = why
        implicit_name, implicit_bytes = _IMPLICIT[short]
        split = any(c.name == implicit_name for c in s.counters)
        if t is not None and (few := too_few(t.count)) and count > t.count:
            for key, _ in QUANTILES:  # say how many of how many were timed
                reasons[key] = f"{few} of {count:,} {words} transfers"
        out.append(TransferStats(short, count, nbytes, values["p50_ns"], values["p90_ns"],
                                 values["p95_ns"], values["p999_ns"], reasons,
                                 s.counter(implicit_name) if split else None,
                                 s.counter(implicit_bytes) if split else None,
                                 t.count if t is not None else 0))
    return out[0], out[1]


# Counters an engine counts on import, before the program did anything.
AT_IMPORT = frozenset({"RegisterXLAFunctions"})


def recorded_anything(s: Snapshot) -> bool:
    """Whether the hook recorded any of the program's work: a graph, a line,
    steps, a count past import, a sample (an eager torch loop has no graph
    but steps and its reads)."""
    return bool(s.graphs or s.sites or (s.steps is not None and s.steps.count)
                or any(c.value for c in s.counters if c.name not in AT_IMPORT)
                or any(d.count for d in s.distributions))


def no_findings_text(views: Sequence[TargetView]) -> str:
    """What to say when no rule fired: "No problems found" only where a hooked engine
    recorded something and could see everything; otherwise what it could not see
    (the snapshot's blind spots)."""
    hooked = [v.snapshot for v in views if v.snapshot is not None
              and v.snapshot.process is not None and v.snapshot.process.engine]
    blind = list(dict.fromkeys(b for s in hooked for b in s.blind_spots))
    unseen = f"not counted here: {'; '.join(blind)}." if blind else ""
    if any(recorded_anything(s) for s in hooked):
        return f"No problems seen; {unseen}" if blind else "No problems found."
    if hooked:
        said = "Nothing recorded yet: no compiles, steps or transfers to judge."
        return f"{said} Also {unseen}" if blind else said
    return ("No hooked program read: findings need the metrics hook in the program "
            "(metrics.install(), or start it with `tpu-info run`).")


def presentable(c: RecompileCause) -> RecompileCause:
    """``c`` in clean words for output: its kind named, no JAX doc URLs or raw
    ``{weak_type=...}`` notation (the recorded cause stays as the engine said it)."""
    if c.description == FIRST_CALL:
        return c
    return replace(c, description=classify(c).words, before=clean_type(c.before) or None,
                   after=clean_type(c.after) or None)


def last_cause(g: GraphRecord) -> RecompileCause | None:
    """The latest cause that is a real recompile (not the first call), presentable."""
    real = [c for c in g.causes if c.description != FIRST_CALL]
    return presentable(max(real, key=lambda c: c.time_unix)) if real else None


def top_graphs(s: Snapshot, n: int) -> list[GraphRecord]:
    """The ``n`` graphs that cost the most compile time, then most compiles."""
    return sorted(s.graphs, key=lambda g: (-g.compile_seconds_total, -g.compiles, g.hash))[:n]
