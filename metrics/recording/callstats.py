"""Calls and host time per compiled function, and the step they suggest.

Engines fold their calls journals through :meth:`CallTimes.fold` (a batch at a
time, never per call); :meth:`CallTimes.steps` then names the step when the
program never marks one: among functions called at least ``min_calls``
times, the one with the most time inside its calls (ties: more calls). A
function the user wrapped in ``metrics.track`` (``explicit``) wins over any
the hook only watched, whatever their times.

Example:
    >>> step = type("Owner", (), {"name": "jit(step)", "explicit": False})()
    >>> times = CallTimes("jitted function")
    >>> times.fold([step] * 12, list(range(12)), list(range(1, 13)))
    (0, 12)
    >>> times.steps().basis
    'jit(step): the jitted function with the most time (12 calls)'
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Sequence
from typing import Any

from tpu_info.contract.model import STEPS_INFERRED, STEPS_MARKED, StepsReading

MIN_CALLS = 10  # fewer calls than this are too little history to call a step

# Names of functions that evaluate rather than train (the word inside jit(...)).
_EVALUATION = re.compile(r"(?:^|[(._])(?:eval|evaluate|evaluation|test|predict|prediction|infer|"
                         r"inference|accuracy|valid|validate|validation|metrics?)(?:$|[)._\d])",
                         re.IGNORECASE)


def evaluation(name: str) -> bool:
    """Whether a function's name says it evaluates (``jit(evaluate)``,
    ``jit(eval_step)``, ``compile(Model.predict)``), not trains."""
    return _EVALUATION.search(name) is not None
_FEW_OWNERS = 8  # up to this many functions in a batch: grouped in C, by mask


class FunctionCalls:
    """Calls of one function (by name): count, host ns inside them, the
    monotonic ns of the first call's start and the last timed call's end, the
    calls counted after that end (``trailing``: untimed ones, when timing
    is sampled; :mod:`metrics.recording.sampling`) and the first owner
    object folded under the name (the engine's, for :meth:`CallTimes.step_owner`)."""

    __slots__ = ("calls", "ns", "first", "last", "trailing", "owner")

    def __init__(self) -> None:
        self.owner: Any = None
        self.calls = 0
        self.ns = 0
        self.first: int | None = None
        self.last = 0
        self.trailing = 0


class CallTimes:
    """Per-function call times of one engine; bounded to ``max_functions``
    names (later names are not kept; ``dropped`` counts their batches)."""

    def __init__(self, what: str, max_functions: int = 1024,
                 to_unix: float | None = None) -> None:
        self.what = what  # "jitted function", "compiled graph": for the basis
        # monotonic ns / 1e9 + to_unix is unix time: the step loop's bounds
        # (None: not told).
        self.to_unix = to_unix
        self.by_key: dict[tuple[str, bool], FunctionCalls] = {}
        self.max_functions = max_functions
        self.dropped = 0

    def fold(self, owners: Sequence[Any], starts: Sequence[int], ends: Sequence[int],
             durations: Sequence[int] | None = None,
             uniq: set[Any] | None = None,
             weights: Sequence[int] | None = None,
             trailing: dict[Any, int] | None = None) -> tuple[int, int]:
        """Adds one batch (records in journal order; each owner has ``name``
        and, optionally, ``explicit``; ``uniq``: ``set(owners)`` if the
        caller has it; ``weights``: the calls each record stands for, when
        timing was sampled, and ``trailing`` each owner's calls after its last
        timed one, :mod:`metrics.recording.sampling`); returns the
        ns inside explicit (tracked) calls and inside the others."""
        if durations is None:
            durations = list(map(operator.sub, ends, starts))
        if uniq is None:
            uniq = set(owners)
        if weights is not None:
            parts = _weighted_parts(owners, starts, ends, durations, weights)
            return self._add_parts(parts, trailing)
        elif len(uniq) == 1:
            parts = [(owners[0], len(owners), sum(durations), starts[0], ends[-1])]
        elif len(uniq) <= _FEW_OWNERS:
            parts = []
            for o in uniq:
                mask = list(map(operator.is_, owners, itertools.repeat(o)))
                s = list(itertools.compress(starts, mask))
                e = list(itertools.compress(ends, mask))
                parts.append((o, len(s), sum(itertools.compress(durations, mask)), s[0], e[-1]))
        else:  # many functions in one batch (a function re-jitted per call): a loop
            acc: dict[Any, list[int]] = {}
            for o, s, e, d in zip(owners, starts, ends, durations, strict=True):
                a = acc.get(o)
                if a is None:
                    acc[o] = [1, d, s, e]
                else:
                    a[0] += 1
                    a[1] += d
                    a[3] = e
            parts = [(o, *a) for o, a in acc.items()]
        return self._add_parts(parts)

    def fold_untimed(self, counts: dict[Any, int]) -> tuple[int, int]:
        """Adds calls that were counted but not timed, at each function's mean
        over its calls that did not compile (its ``usual_ns`` when it has
        one), else over all so far (none yet: no time); returns the estimated
        (tracked, other) ns."""
        return self._add_parts([(owner, n, n * (self.mean_ns(owner) or 0), None, 0)
                                for owner, n in counts.items()], untimed=True)

    def last_end(self, owner: Any) -> int | None:
        """Monotonic ns of the end of ``owner``'s latest timed call folded (None: none)."""
        f = self.by_key.get((owner.name, bool(getattr(owner, "explicit", False))))
        return None if f is None or f.first is None else f.last

    def mean_ns(self, owner: Any) -> int | None:
        """Mean host ns of ``owner``'s calls, what an untimed one is taken
        at: over its timed calls that did not compile (``usual_ns``) when it
        has one, else over all calls so far; None before any."""
        usual = getattr(owner, "usual_ns", 0)
        if usual:
            return usual
        f = self.by_key.get((owner.name, bool(getattr(owner, "explicit", False))))
        return f.ns // f.calls if f is not None and f.calls else None

    def _add_parts(self, parts: list[tuple[Any, int, int, int | None, int]],
                   trailing: dict[Any, int] | None = None,
                   untimed: bool = False) -> tuple[int, int]:
        explicit_ns = inferred_ns = 0
        for owner, n, ns, first, last in parts:
            explicit = bool(getattr(owner, "explicit", False))
            if explicit:
                explicit_ns += ns
            else:
                inferred_ns += ns
            f = self._entry(owner.name, explicit)
            if f is None:
                continue
            if f.owner is None or (not untimed and owner is not f.owner and last >= f.last):
                f.owner = owner  # (of one name, the one called last: a second loop's step)
            f.calls += n
            f.ns += ns
            if untimed:
                f.trailing += n
                continue
            if f.first is None:
                f.first = first
            f.last = max(f.last, last)
            f.trailing = trailing.get(owner, 0) if trailing else 0
        return explicit_ns, inferred_ns

    def _entry(self, name: str, explicit: bool) -> FunctionCalls | None:
        key = (name, explicit)
        f = self.by_key.get(key)
        if f is None:
            if len(self.by_key) >= self.max_functions:
                self.dropped += 1
                return None
            f = self.by_key[key] = FunctionCalls()
        return f

    def dominant(self, explicit: bool, min_calls: int) -> tuple[str, FunctionCalls] | None:
        """The function with the most time among those called ``min_calls``
        times or more (ties: more calls, then the name); a watched function
        whose name says evaluation (``jit(evaluate)``, ``jit(eval_step)``,
        ``jit(accuracy)``) only when no other qualifies: a slow evaluation
        run once an epoch is not the training step; a library's function
        (the owner's ``library``: optax's helpers called from the user's
        train step) only when no function of the user's qualifies. Before time, a function
        whose output feeds its next call (the owner's ``fed_back``: a training
        step carries its state, an evaluation over many batches does not)."""
        best = None
        for (name, exp), f in list(self.by_key.items()):
            if exp is not explicit or f.calls < min_calls:
                continue
            rank = (explicit or not evaluation(name), not getattr(f.owner, "library", False),
                    getattr(f.owner, "fed_back", 0) > 0, f.ns, f.calls, name)
            if best is None or rank > best[0]:
                best = (rank, name, f)
        return None if best is None else (best[1], best[2])

    def steps(self, min_calls: int = MIN_CALLS) -> StepsReading | None:
        """Steps from the tracked function with the most time, else inferred
        from the watched one (None with too little history)."""
        tracked = self.dominant(True, 1)
        if tracked is not None:
            name, f = tracked
            basis = (f"metrics.track({name}): the tracked function with the most time "
                     f"({f.calls:,} calls)")
            return StepsReading(count=f.calls, source=STEPS_MARKED, basis=basis,
                                seconds_total=_span(f), **self._bounds(f))
        inferred = self.dominant(False, min_calls)
        if inferred is None:
            return None
        name, f = inferred
        return StepsReading(count=f.calls, source=STEPS_INFERRED,
                            basis=f"{name}: the {self.what} with the most time ({f.calls:,} calls)",
                            seconds_total=_span(f), **self._bounds(f))

    def step_owner(self, min_calls: int = MIN_CALLS) -> Any:
        """The owner object of the function :meth:`steps` counts (the
        tracked one, else the inferred one), None without one."""
        found = self.dominant(True, 1) or self.dominant(False, min_calls)
        return None if found is None else found[1].owner

    def _bounds(self, f: FunctionCalls) -> dict[str, float | None]:
        """The step loop's bounds: the first call's start, the last timed call's end."""
        if self.to_unix is None or f.first is None:
            return {}
        return {"first_unix": f.first / 1e9 + self.to_unix,
                "last_unix": max(f.first, f.last) / 1e9 + self.to_unix}

    def clear(self) -> None:
        self.by_key.clear()
        self.dropped = 0


def _weighted_parts(owners: Sequence[Any], starts: Sequence[int], ends: Sequence[int],
                    durations: Sequence[int], weights: Sequence[int]
                    ) -> list[tuple[Any, int, int, int | None, int]]:
    """Per owner: (owner, calls, ns, first start, last end) of timed records
    that each stand for ``weights[i]`` calls (a few hundred a batch: a loop)."""
    acc: dict[Any, list[int]] = {}
    for o, s, e, d, w in zip(owners, starts, ends, durations, weights, strict=True):
        a = acc.get(o)
        if a is None:
            acc[o] = [w, d * w, s, e]
        else:
            a[0] += w
            a[1] += d * w
            a[3] = e
    return [(o, *a) for o, a in acc.items()]


def _span(f: FunctionCalls) -> float | None:
    """Wall seconds from the first call's start to the last call's end (the
    last timed one's, carried on over the calls counted after it at the
    same rate)."""
    if f.first is None or f.last <= f.first:
        return None
    covered = f.calls - f.trailing
    if f.trailing and covered > 1:
        return (f.last - f.first) / 1e9 * (f.calls - 1) / (covered - 1)
    return (f.last - f.first) / 1e9
