"""Two runs compared: the changes that matter, and the conditions CI fails on.

``tpu-info diff A B`` reads two snapshots (saved runs or live targets) and
says, side by side, what a performance engineer checks after a change. Two
runs need not be of one length (a 10,000-step baseline, a 3,000-step pull
request), so only **rates** are judged better or worse: steps/s, step time
P50/P99, compiles and compile time per 1,000 steps, transfers and reads to
the host per step. **Totals** (steps, compiles, compile time, distinct
graphs) grow with the run: they are shown, with their change, and never
called better or worse (:attr:`Row.judged`). Then the graphs new in B (by
computation: function name and input signature, never the hash, which moves
with any code change), the recompile causes new in B, and the findings that
appeared or went away.

``--fail-on 'step_time_p50>+5%,compiles>+0'`` turns it into a gate: each
condition names a row, ``>`` or ``<``, and a change: relative (``+5%``) or
absolute (``+0``, ``-10``). A condition whose row has no value on either
side does not hold, and says so.

Example:
    >>> from tpu_info.contract.model import Snapshot, StepsReading
    >>> a = Snapshot(0.0, steps=StepsReading(100, "marked", "m", 10.0))
    >>> b = Snapshot(0.0, steps=StepsReading(100, "marked", "m", 12.5))
    >>> [r.change_words() for r in compare(a, b).rows if r.key == "steps_per_s"]
    ['-20%']
    >>> [(r.key, r.worse()) for r in compare(a, b).rows if r.key in ("steps", "steps_per_s")]
    [('steps_per_s', True), ('steps', False)]
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from tpu_info.contract import catalog
from tpu_info.contract.model import SiteKind, Snapshot
from tpu_info.views.cost import short_location, steps_of
from tpu_info.views.findings import find
from tpu_info.views.values import dist_percentile, transfer_stats

RATE, TOTAL = "rate", "total"


@dataclass(frozen=True, slots=True)
class Row:
    """One compared figure; ``better`` is which way is good (``up``/``down``).

    ``kind`` is :data:`RATE` (per step, per second, per 1,000 steps: the
    same for a run of any length, so judged) or :data:`TOTAL` (grows with
    the run: shown, never judged better or worse)."""

    key: str
    label: str
    a: float | None
    b: float | None
    unit: str = ""
    better: str = "down"
    kind: str = RATE

    @property
    def judged(self) -> bool:
        """Whether a change may be called better or worse (rates only)."""
        return self.kind == RATE

    @property
    def change(self) -> float | None:
        if self.a is None or self.b is None:
            return None
        return self.b - self.a

    @property
    def relative(self) -> float | None:
        if self.change is None or not self.a:
            return None
        return self.change / abs(self.a)

    def change_words(self) -> str:
        if self.change is None:
            return "-"
        if self.relative is not None:
            return f"{self.relative:+.0%}" if abs(self.relative) >= 0.01 else "same"
        return f"{self.change:+g}" if self.change else "same"

    def worse(self) -> bool:
        """Whether B moved the wrong way by more than 1% (or at all, from 0);
        never for a total, which moves with the run's length."""
        c = self.change
        if not self.judged or c is None or c == 0:
            return False
        if self.relative is not None and abs(self.relative) < 0.01:
            return False
        return c > 0 if self.better == "down" else c < 0


@dataclass(frozen=True)
class Comparison:
    """What changed from A to B."""

    rows: list[Row]
    new_graphs: list[str] = field(default_factory=list)
    gone_graphs: list[str] = field(default_factory=list)
    new_causes: list[str] = field(default_factory=list)
    new_findings: list[str] = field(default_factory=list)
    gone_findings: list[str] = field(default_factory=list)

    def row(self, key: str) -> Row | None:
        return next((r for r in self.rows if r.key == key), None)

    @property
    def rates(self) -> list[Row]:
        return [r for r in self.rows if r.kind == RATE]

    @property
    def totals(self) -> list[Row]:
        return [r for r in self.rows if r.kind == TOTAL]

    def length_words(self) -> str:
        """``B ran 70% fewer steps than A (3,000 vs 10,000)``, when the two
        runs' step counts differ by 10% or more; else ``""``."""
        r = self.row("steps")
        if r is None or not r.a or not r.b or r.relative is None or abs(r.relative) < 0.1:
            return ""
        how = f"{abs(r.relative):.0%} {'more' if r.relative > 0 else 'fewer'}"
        return f"B ran {how} steps than A ({_fmt(r.b)} vs {_fmt(r.a)})"


def _per_step(s: Snapshot, count: float | None, per: float = 1.0) -> float | None:
    """``count`` per step (per ``per`` steps); None without steps."""
    steps = steps_of(s)
    if steps is None or count is None or not steps.count:
        return None
    return count / steps.count * per


def _step_time_ms(s: Snapshot, percent: float) -> float | None:
    d = s.distribution(catalog.STEP_TIME)
    if d is not None and d.count:
        value, _ = dist_percentile(d, percent)
        if value is not None:
            return value / 1e6
    steps = steps_of(s)
    if percent == 50 and steps is not None and steps.seconds_total:
        return steps.seconds_total / steps.count * 1e3  # the mean: no distribution
    return None


def _figures(s: Snapshot) -> dict[str, float | None]:
    steps = steps_of(s)
    ct = s.distribution(catalog.COMPILE_TIME)
    h2d, d2h = transfer_stats(s)
    syncs = sum(x.count for x in s.sites if x.kind == SiteKind.SYNC.value)
    compiles = sum(g.compiles for g in s.graphs) or (ct.count if ct is not None else None)
    compile_s = ct.total / 1e9 if ct is not None else (
        sum(g.compile_seconds_total for g in s.graphs) if s.graphs else None)
    return {
        "steps": float(steps.count) if steps is not None else None,
        "steps_per_s": (steps.count / steps.seconds_total
                        if steps is not None and steps.seconds_total else None),
        "step_time_p50": _step_time_ms(s, 50),
        "step_time_p99": _step_time_ms(s, 99),
        "compiles": float(compiles) if compiles is not None else None,
        "compile_s": compile_s,
        "compiles_per_1k_steps": _per_step(s, compiles, 1000.0),
        "compile_s_per_1k_steps": _per_step(s, compile_s, 1000.0),
        "h2d_per_step": _per_step(s, h2d.count if h2d.count else None),
        "d2h_per_step": _per_step(s, d2h.count if d2h.count else None),
        "syncs_per_step": _per_step(s, syncs if s.sites else None),
        "graphs": float(len(s.graphs)),
    }


# key, label, unit, which way is better, rate or total. Rates first: the
# figures a run's length does not move, the only ones judged.
ROWS: tuple[tuple[str, str, str, str, str], ...] = (
    ("steps_per_s", "steps/s", "", "up", RATE),
    ("step_time_p50", "step time P50", "ms", "down", RATE),
    ("step_time_p99", "step time P99", "ms", "down", RATE),
    ("compiles_per_1k_steps", "compiles per 1,000 steps", "", "down", RATE),
    ("compile_s_per_1k_steps", "compile time per 1,000 steps", "s", "down", RATE),
    ("h2d_per_step", "host->device transfers/step", "", "down", RATE),
    ("d2h_per_step", "device->host transfers/step", "", "down", RATE),
    ("syncs_per_step", "reads to the host/step", "", "down", RATE),
    ("steps", "steps", "", "up", TOTAL),
    ("compiles", "compiles", "", "down", TOTAL),
    ("compile_s", "compile time", "s", "down", TOTAL),
    ("graphs", "distinct graphs", "", "down", TOTAL),
)
KEYS = tuple(k for k, *_ in ROWS)


def _graph_keys(s: Snapshot) -> set[str]:
    """Each graph by what it computes: its function and input signature."""
    return {f"{g.name}({', '.join(g.signature)})" for g in s.graphs}


def _cause_keys(s: Snapshot) -> set[str]:
    return {f"{g.name}: {c.description}" for g in s.graphs for c in g.causes
            if c.description and "first call" not in c.description}


def _finding_keys(s: Snapshot) -> dict[str, str]:
    out = {}
    for f in find(s):
        where = short_location(f.location)
        key = f"{f.kind}{' at ' + where if where else ''}"
        out.setdefault(key, f"{key}: {f.message[:160]}")
    return out


def compare(a: Snapshot, b: Snapshot) -> Comparison:
    """What changed from ``a`` to ``b``."""
    fa, fb = _figures(a), _figures(b)
    rows = [Row(key, label, fa[key], fb[key], unit, better, kind)
            for key, label, unit, better, kind in ROWS]
    ga, gb = _graph_keys(a), _graph_keys(b)
    finds_a, finds_b = _finding_keys(a), _finding_keys(b)
    return Comparison(
        rows=rows,
        new_graphs=sorted(gb - ga),
        gone_graphs=sorted(ga - gb),
        new_causes=sorted(_cause_keys(b) - _cause_keys(a)),
        new_findings=[finds_b[k] for k in sorted(set(finds_b) - set(finds_a))],
        gone_findings=[finds_a[k] for k in sorted(set(finds_a) - set(finds_b))],
    )


_CONDITION = re.compile(r"^\s*([a-z0-9_]+)\s*([<>])\s*([+-]?\d+(?:\.\d+)?)(%?)\s*$")


@dataclass(frozen=True, slots=True)
class Condition:
    """``step_time_p50>+5%``: the row, the direction and the threshold."""

    key: str
    op: str
    value: float
    relative: bool
    text: str

    def check(self, c: Comparison) -> tuple[bool, str]:
        """Whether it holds, and the words for it."""
        r = c.row(self.key)
        if r is None or r.change is None:
            return False, f"{self.text}: not known on both sides"
        if self.relative:
            if r.relative is None:
                return False, f"{self.text}: A is 0, no relative change"
            moved, shown = r.relative * 100, f"{r.relative:+.1%}"
        else:
            moved, shown = r.change, f"{r.change:+g}"
        held = moved > self.value if self.op == ">" else moved < self.value
        return held, f"{self.text}: {r.label} {shown} ({_fmt(r.a)} -> {_fmt(r.b)})"


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 or float(v).is_integer() else f"{v:,.3g}"


def parse_conditions(text: str) -> list[Condition]:
    """``'step_time_p50>+5%,compiles>+0'`` -> conditions.

    Raises:
        ValueError: a condition that does not parse or names no row (the
            message lists the rows).
    """
    out = []
    for part in (p for p in text.split(",") if p.strip()):
        m = _CONDITION.match(part)
        if m is None:
            raise ValueError(f"--fail-on {part.strip()!r}: write NAME>+5% or NAME>+0 "
                             f"(NAME one of {', '.join(KEYS)})")
        key, op, number, pct = m.groups()
        if key not in KEYS:
            raise ValueError(f"--fail-on {part.strip()!r}: no row {key!r} "
                             f"(one of {', '.join(KEYS)})")
        out.append(Condition(key, op, float(number), bool(pct), part.strip()))
    if not out:
        raise ValueError("--fail-on is empty: give conditions such as 'step_time_p50>+5%'")
    return out


def failed(conditions: Sequence[Condition], c: Comparison) -> list[tuple[bool, str]]:
    """Each condition checked: (held, words)."""
    return [cond.check(c) for cond in conditions]


def fmt(value: float | None, unit: str = "") -> str:
    """A figure for the table: ``-`` when unknown."""
    if value is None:
        return "-"
    return f"{_fmt(value)}{' ' + unit if unit else ''}"
