"""Readings owned by an engine (torch._lazy, torch_xla) turned into ours.

Those engines keep their own counters and metrics in C++; their adapters read
them at scrape time only and re-export them under their own names. This
module holds the pure parts: units from torch_xla-style report text,
percentiles over the samples the engine kept, and baselines so that
``metrics.clear_counters()`` does not reset the engine's own view.

Example:
    >>> unit_of_accumulator("075ms432.738us").value
    'ns'
    >>> parse_value("01s352ms039.967us")
    1352039967.0
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from tpu_info.contract import catalog as names
from tpu_info.contract.model import PERCENTILES, CounterReading, DistributionReading, Samples, Unit

_TIME_PART = re.compile(r"(\d+(?:\.\d+)?)(d|h|m(?!s)|s|ms|us|ns)")
_TIME_NS = {"d": 86400e9, "h": 3600e9, "m": 60e9, "s": 1e9, "ms": 1e6, "us": 1e3, "ns": 1.0}
_BYTES = re.compile(r"^(\d+(?:\.\d+)?)(B|KB|MB|GB|TB|PB)$")
_BYTE_SCALE = {"B": 1, "KB": 2**10, "MB": 2**20, "GB": 2**30, "TB": 2**40, "PB": 2**50}
_METRIC_BLOCK = re.compile(r"^Metric: (?P<name>\S+)\n(?P<body>(?:  .*\n?)*)", re.M)


def unit_of_accumulator(text: str) -> Unit:
    """The unit of one report's ``Accumulator:`` value text."""
    text = text.strip()
    if _BYTES.match(text):
        return Unit.BYTES
    if _TIME_PART.search(text) and not re.fullmatch(r"[\d.]+", text):
        return Unit.TIME_NS
    return Unit.NUMBER


def parse_value(text: str) -> float:
    """A report value (``075ms432.738us``, ``4.00KB``, ``36.00``) in ns,
    bytes or plain numbers."""
    text = text.strip()
    m = _BYTES.match(text)
    if m:
        return float(m.group(1)) * _BYTE_SCALE[m.group(2)]
    if re.fullmatch(r"-?[\d.]+(?:e[-+]?\d+)?", text):
        return float(text)
    return sum(float(v) * _TIME_NS[u] for v, u in _TIME_PART.findall(text))


def report_metrics(report: str) -> dict[str, dict[str, str]]:
    """``Metric:`` blocks of a torch_xla-style report: name -> field -> text."""
    out: dict[str, dict[str, str]] = {}
    for m in _METRIC_BLOCK.finditer(report):
        fields: dict[str, str] = {}
        for line in m.group("body").splitlines():
            key, _, value = line.strip().partition(": ")
            fields[key] = value
        out[m.group("name")] = fields
    return out


def percentiles(values: Sequence[float]) -> tuple[tuple[float, float], ...]:
    """torch_xla's percentile set over ``values`` (linear interpolation)."""
    if not values:
        return ()
    xs = sorted(values)
    n = len(xs)
    out = []
    for p in PERCENTILES:
        pos = (n - 1) * p / 100.0
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        out.append((p, xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)))
    return tuple(out)


def distribution(name: str, unit: Unit, count: int, total: float,
                 samples: Sequence[tuple[float, float]],
                 pct: tuple[tuple[float, float], ...] | None = None) -> DistributionReading:
    """A reading from an engine's own metric: exact count and total; min, max,
    rates and percentiles over the samples it kept (torch_xla: the last 1024)."""
    values = [v for _, v in samples]
    rate = value_rate = None
    if len(samples) > 1:
        span = samples[-1][0] - samples[0][0]
        if span > 0:
            rate = (len(samples) - 1) / span
            value_rate = sum(values[1:]) / span
    return DistributionReading(
        name=name, unit=unit, count=count, total=total,
        min=min(values) if values else None, max=max(values) if values else None,
        rate_per_second=rate, value_rate_per_second=value_rate,
        percentiles=pct if pct is not None else percentiles(values),
        recent=Samples.of(samples[-64:]), buckets=None,
        help=names.help_for(name) or f"{name} as the engine itself counts it "
                                      "(percentiles over the samples it keeps).",
    )


class Baseline:
    """Values at the last ``clear``: what ``metrics.clear_*()`` subtracts,
    leaving the engine's own counters untouched."""

    def __init__(self) -> None:
        self.counters: dict[str, int] = {}
        self.metrics: dict[str, tuple[int, float]] = {}

    def counter(self, name: str, value: int) -> int:
        return max(0, value - self.counters.get(name, 0))

    def metric(self, name: str, count: int, total: float) -> tuple[int, float]:
        c0, t0 = self.metrics.get(name, (0, 0.0))
        if count < c0:  # the engine was reset underneath us
            return count, total
        return count - c0, total - t0


def counter_readings(values: Iterable[tuple[str, int]], base: Baseline,
                     skip: frozenset[str] = frozenset()) -> list[CounterReading]:
    out = []
    for name, value in values:
        if name in skip or value is None:
            continue
        v = base.counter(name, int(value))
        if v:
            text = names.help_for(name) or f"{name} (the engine's own counter)."
            out.append(CounterReading(name, v, names.unit_for(name), text))
    return out
