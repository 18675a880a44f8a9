"""What a device->host read cost: what it added to the loop, not the queue it
waited for.

A read (``float(loss)``, ``print(loss)``, ``jax.device_get``) waits until the
device has run everything queued before it, then for the copy to come back.
Between two reads the host works for ``h`` (measured: from the previous
read's end to this one's start) and the read waits ``w`` (measured). With
the read, that stretch of the loop takes ``h + w``; without it, host and
device overlap and it takes ``max(h, d)``, ``d`` being the device's time for
the work queued in the stretch. So each read costs ``h + w - max(h, d)``,
between 0 and ``w``: the sync's own latency, and the device idling while the
host prepares the next step, but never the device's queued work, which runs
either way.

``d`` is measured, never assumed: the steps since the previous read (the
read's step index) times the step function's device time per execution
(:mod:`metrics.engines.jax.device_time`: completion times observed off the
training thread), and at least the wait less the sync latency (measured by
reading data already on the host's side of the wait: ``L``), since all of a
wait but its latency is device work; at most ``h + w - L``. Without a
measured device time, ``d`` is that lower bound; without either, ``d = w``
(the wait taken as all device work): ``min(w, h)``, a lower bound. Where
the steps' measured time covers at least 90 % of the stretch
(:data:`DEVICE_BOUND_NUM`), the stretch was device-bound and ``d`` is all
of it: the read costs its latency, never the difference of two large
numbers (50 steps x a sample a few per cent short of the period). And a
read that waited for :data:`DEEP_QUEUE` steps or more found the host that
far ahead: it costs at most its latency and the device's idle after the
previous read (that read's end to the step's next call, measured).

The steps' device time is taken at the top of its samples' spread (their
upper quartile: :data:`SPREAD`), as the gaps' queued work is
(:func:`~metrics.engines.jax.gaps.queued_ns`): under CPU contention the
samples spread wide, and their median can fall short of the device's
period (optax's mlp_mnist at load 4 to 6: a median of 36 ms
against a 40.5 ms step; 20 steps of that shortfall are 90 ms a print, where
removing the print saved nothing in 5 paired A/B rounds). ``h + w - max(h,
d)`` only falls as ``d`` grows, so the drain said is the least one the
samples allow: a drain inside their spread is not claimed. A read whose
step index is below the previous read's followed another step function's
(an evaluation before the loop): its steps since are all the new one's
calls, at most.

So a print every 20 steps of a device-bound loop costs about ``L`` (its
wait is 20 steps of device work); a ``float(loss)`` every step costs about
``L`` plus whatever of the host's time the device could have overlapped.
Folded per site beside its wait, off the hot path (at fold time, from the
records' start, end and step index the hot path already keeps).

Example:
    >>> from metrics.engines.jax.drains import Model, drains
    >>> drains([0, 2], [10, 40], [20, 60], last_end=0)   # (kinds, starts, ends)
    ([10, 20], 60)
    >>> Model(device_ns=3, latency_ns=7).cost(h=10, w=8, steps=1)  # 10 + 8 - max(10, 3)
    8
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from metrics.engines._frames import site_at
from metrics.engines.jax.kinds import EXPLICIT_D2H, GAP_END, SYNC
from metrics.engines.jax.startup import take_out

if TYPE_CHECKING:
    from metrics.engines.jax.device_time import DeviceTimes

_WAITS = frozenset((SYNC, EXPLICIT_D2H))  # a read, a jax.device_get's leaf: both wait
# A stretch whose steps' measured device time covers at least 9/10 of it
# (less the latency) was device-bound: the device ran the whole stretch, and
# ``d`` is taken as all of it. The samples are each within a few per cent of
# the device's period (late wake-ups, contention: hk_transformer's 37.7 ms
# against its 40.0 ms step), and 50 steps of a 2.3 ms shortfall would be
# charged to the read as 115 ms it did not cost.
DEVICE_BOUND_NUM, DEVICE_BOUND_DEN = 9, 10
# A read that waited for at least this many steps' device time, as many steps
# after the previous read, found the host that far ahead: the device had work
# from the step's first call after the previous read on, and the read costs
# at most its latency and the device's idle before that call (measured: the
# previous read's end to the step's next call, its GAP_END record). The
# samples can fall short of the period by more than 10 % (hk_transformer:
# 26.45 ms against 29.5, 89.7 %: 153 ms a log).
DEEP_QUEUE = 2
# The steps' device time a read's stretch is costed with: the samples' upper
# quartile (DeviceTimes.upper_ns), not their median (module docstring).
SPREAD = "upper quartile"


class Model(NamedTuple):
    """What a read is costed with: the step's device ns per execution (the
    samples' median, and their upper quartile: :data:`SPREAD`) and the sync
    latency (None: not measured), each with the samples it stands on."""

    device_ns: int | None = None
    latency_ns: int | None = None
    device_samples: int = 0
    latency_samples: int = 0
    device_top_ns: int | None = None  # the samples' upper quartile (None: the median)

    def cost(self, h: int, w: int, steps: int | None) -> int:
        """One read's cost in ns: ``h + w - max(h, d)`` (module docstring);
        ``steps``: steps dispatched since the previous read (None: not known)."""
        h, w = max(0, h), max(0, w)
        lat = self.latency_ns
        lo = w if lat is None else max(0, w - lat)  # the wait less its latency: device work
        d = lo
        dev = self.device_ns if self.device_top_ns is None else self.device_top_ns
        if dev is not None and steps is not None and steps >= 0:
            top = h + w - (lat or 0)
            d = min(max(steps * dev, lo if lat is not None else 0), top)
            if steps * dev * DEVICE_BOUND_DEN >= top * DEVICE_BOUND_NUM:
                d = top  # device-bound: busy the whole stretch (DEVICE_BOUND_NUM)
        return max(0, min(w, h + w - max(h, d)))


def drains(kinds: Sequence[int], starts: Sequence[int], ends: Sequence[int],
           last_end: int, steps: Sequence[int] | None = None, model: Model = Model(),
           last_step: int | None = None, compiles: Sequence[tuple[int, int]] = (),
           idle: list[int] | None = None) -> tuple[list[int], int]:
    """Per record (``-1`` for a record that is no wait), its cost in ns,
    given the end of the latest wait before them (``last_end``) and its step
    index (``last_step``); and the latest wait's end after them. ``steps``:
    each record's step index (a record's own end where none was told).
    ``compiles``: compile spans (start, end), in order, not overlapping: a
    read's host time counts from the latest one's end in its stretch (the
    device work it waits for was dispatched after it: a first step's compile
    is no host time the device could have overlapped; work queued before it
    that ran during it makes ``h`` shorter, the cost lower, never higher).
    ``idle``: ``[the device's idle after the latest read (ns, -1: not
    known), the end of the latest read whose step call is not seen yet (-1:
    none)]``, updated in place from the step's calls after reads (``GAP_END``
    records): :data:`DEEP_QUEUE`. Records are in the order they happened."""
    out = [-1] * len(kinds)
    if idle is None:
        idle = [-1, -1]
    # Model.cost inlined (a read every step: this loop is the fold's cost per
    # record; function calls, max and min, would triple it).
    lat, dev = model.latency_ns, model.device_ns
    top_dev = dev if model.device_top_ns is None else model.device_top_ns  # SPREAD
    j, spans = 0, len(compiles)  # the first compile span not before the stretch
    for i in [i for i, k in enumerate(kinds) if k in _WAITS or k == GAP_END]:
        s, e = starts[i], ends[i]
        if kinds[i] == GAP_END:  # the step's call after other work
            if idle[1] >= 0:
                idle[0], idle[1] = (e - idle[1] if e > idle[1] else 0), -1
            continue
        h = s - last_end
        if h < 0:
            h = 0
        if spans:  # from the latest compile's end in the stretch: the work came after it
            while j < spans and compiles[j][1] <= last_end:
                j += 1
            while j < spans and compiles[j][0] < s:
                b = compiles[j][1]
                h = s - (b if b < s else s)
                j += 1
            j = j - 1 if j else 0  # (the last one may reach into the next stretch)
        w = e - s
        if w < 0:
            w = 0
        step = steps[i] if steps is not None and steps[i] != e else None
        if step is not None and last_step is not None and step < last_step:
            last_step = 0  # another step function's count before: all of this one's calls
        lo = w if lat is None else (w - lat if w > lat else 0)  # the wait less its latency
        d = lo
        if top_dev is not None and step is not None and last_step is not None and (
                step >= last_step):
            d = (step - last_step) * top_dev
            if lat is not None and d < lo:
                d = lo
            top = h + w - (lat or 0)
            if d > top or d * DEVICE_BOUND_DEN >= top * DEVICE_BOUND_NUM:
                d = top
        c = h + w - d if d > h else w  # h + w - max(h, d), at most w
        if (idle[0] >= 0 and dev is not None and step is not None and last_step is not None
                and step - last_step >= DEEP_QUEUE and lo >= DEEP_QUEUE * dev):
            top = (lat or 0) + idle[0]  # the host far ahead (DEEP_QUEUE)
            if c > top:
                c = top
        idle[0], idle[1] = -1, e
        out[i] = c if c > 0 else 0
        if e > last_end:
            last_end = e
        last_step = step
    return out, last_end


class Drains:
    """Folds each read's drain into its site (``_Site.drain_ns``) after the
    site table's own fold; ``fold`` is the journal's fold function."""

    __slots__ = ("impl", "last_end", "fields", "last_step", "times", "model", "timeline",
                 "idle")

    def __init__(self, impl: Any, now_ns: int, fields: int) -> None:
        self.impl, self.fields = impl, fields  # fields: implicit.FIELDS a record
        self.last_end = now_ns  # no wait before the hook: the host's time counts from here
        self.last_step: int | None = None  # the latest wait's step index
        self.times: DeviceTimes | None = None  # the engine's (device_time.py)
        self.model = Model()  # the last fold's: what the costs stand on
        self.timeline: Any = None  # the engine's compile spans (compile_steps.CompileTimeline)
        self.idle = [-1, -1]  # drains()'s: the device's idle after the latest read

    def current(self) -> Model:
        """The model now: the step function's device time and the latency."""
        times = self.times
        if times is None:
            return Model()
        step = self.impl.context.step_owner
        measured = step is not None and hasattr(step, "graphs")
        dev = times.device_ns(step) if measured else None
        lat = times.latency_ns()
        return Model(dev[0] if dev else None, lat[0] if lat else None,
                     dev[1] if dev else 0, lat[1] if lat else 0,
                     times.upper_ns(step) if dev else None)

    def _compiles(self, starts: list[int]) -> list[tuple[int, int]]:
        """The compile spans that can fall in this batch's stretches (from the
        latest wait's end to its last record), in order, overlaps merged."""
        timeline = self.timeline
        if timeline is None or not starts:
            return []
        first, last = self.last_end, max(starts)
        merged: list[tuple[int, int]] = []
        for a, b in sorted((a, b) for a, b in list(timeline.spans) if b > first and a < last):
            if merged and a <= merged[-1][1]:
                if b > merged[-1][1]:
                    merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        return merged

    def fold(self, flat: list[Any]) -> None:
        impl = self.impl
        take_out(flat, self.fields, 4, 5, impl.context.startups)  # opening the device: apart
        impl._fold(flat)
        w = self.fields
        kinds = flat[0::w]
        if SYNC not in kinds and EXPLICIT_D2H not in kinds:
            if self.idle[1] >= 0 and GAP_END in kinds:  # the step's call after the latest read
                end = flat[5 + w * kinds.index(GAP_END)]
                self.idle[:] = [max(0, end - self.idle[1]), -1]
            return
        self.model = model = self.current()
        steps = flat[7::w]
        per, self.last_end = drains(kinds, flat[4::w], flat[5::w], self.last_end, steps, model,
                                    self.last_step, self._compiles(flat[4::w]), self.idle)
        for i in range(len(kinds) - 1, -1, -1):  # the latest wait's step index, for the next
            if per[i] >= 0:
                self.last_step = steps[i] if steps[i] != flat[5 + w * i] else None
                break
        sums: dict[tuple[int, int], int] = {}
        codes, offsets = flat[1::w], flat[2::w]
        for i in [i for i, k in enumerate(kinds) if k == SYNC]:
            key = (id(codes[i]), offsets[i])
            sums[key] = sums.get(key, 0) + per[i]
        with impl._lock:
            for (code, offset), ns in sums.items():
                site = site_at(impl._sites, (SYNC, code, offset)) or impl._other.get(SYNC)
                if site is not None:
                    site.drain_ns += ns
