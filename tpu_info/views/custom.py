"""Metrics outside the catalog: the program's own (``metrics.counter`` /
``metrics.distribution``, with a unit and help), ``jax.monitoring`` events of
any library, and the engines' per-op counters (``aten::nonzero``).

One reading per name for ``--json`` (``custom_metrics``) and for ``--metric
NAME`` with such a name; values stay in the recorded unit (``ns``, ``bytes``,
``1``), which each entry names.

Example:
    >>> from tpu_info.contract.model import DistributionReading, Snapshot, Unit
    >>> s = Snapshot(0.0, distributions=(DistributionReading(
    ...     "/myapp/checkpoint/save", Unit.TIME_NS, 1, 2e8, 2e8, 2e8, help="jax.monitoring"),))
    >>> [(m.name, m.kind, m.unit, m.total) for m in custom_metrics(s)]
    [('/myapp/checkpoint/save', 'distribution', 'ns', 200000000.0)]
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_info.contract.catalog import CATALOG
from tpu_info.contract.model import Snapshot

JSON_PERCENTILES = (50.0, 90.0, 99.0)


@dataclass(frozen=True, slots=True)
class CustomMetric:
    """One metric outside the catalog; ``value`` for a counter, ``count``..
    ``percentiles`` for a distribution (``None`` where it has none)."""

    name: str
    kind: str  # "counter" or "distribution"
    unit: str  # the Unit value: "ns", "bytes", "1"
    help: str
    value: int | None = None
    count: int | None = None
    total: float | None = None
    min: float | None = None
    max: float | None = None
    percentiles: tuple[tuple[float, float | None], ...] = ()


def is_custom(name: str) -> bool:
    """Whether ``name`` is outside the catalog (a program's or library's own)."""
    return name not in CATALOG


def custom_metrics(s: Snapshot) -> list[CustomMetric]:
    """Every counter and distribution of ``s`` outside the catalog, by name."""
    out = [CustomMetric(c.name, "counter", c.unit.value, c.help, value=c.value)
           for c in s.counters if is_custom(c.name)]
    out += [CustomMetric(d.name, "distribution", d.unit.value, d.help, count=d.count,
                         total=d.total, min=d.min, max=d.max,
                         percentiles=tuple((p, d.percentile(p)) for p in JSON_PERCENTILES))
            for d in s.distributions if is_custom(d.name)]
    return sorted(out, key=lambda m: (m.name, m.kind))
