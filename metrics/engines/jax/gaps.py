"""Periodic work in the step loop's gaps, named and measured: evaluation,
checkpoints, logging every N steps.

A gap is what the program did between two calls of the step function (the
inferred or tracked one: ``JaxContext.step_owner``): the hook notes the
first call of another jitted function after anything else (``CALL``: at
the step loop's line that led to it, the ``evaluate(...)`` or
``callback(params, t)`` the user would run less often, found by walking
out to the code that calls the step; else at the call's own line; also an
eager op that waited for the steps after steps that ran none, noted by
:mod:`~metrics.engines.jax.eager` as ``EAGER_CALL``), a
``jax.device_get`` (``GET``: a checkpoint's copy of the state) and the
reads (``float(loss)``, ``print(loss)``), each with the step index it
ran after; the step's next call writes ``GAP_END`` with its time. Both
hot-path checks are one identity test (``JaxContext.gap_owner``); the
walk to the loop's line runs once per noted call; everything else
happens here, at fold time.

Each gap's time is what it added to the loop: its wall time ``W``, from its
first record's start to the step's next call, less what would have taken
that time without it: the device's remaining work on the training steps
queued before the gap, ``Q``, and the host's usual step and the compile work
inside the gap, ``U + C`` (an evaluation's first call compiles: said as a
compile, and the steps' compile time already holds it); the device drains
its queue while the host compiles or loads the next batch, so the two
overlap: ``W - max(Q, U + C)``, between 0 and ``W``. ``Q`` is what the gap
waited for them, up to its first wait's return (a read, a ``device_get``: it
had them done); a gap that waited for nothing holds no wait for them, and
``Q`` is 0 (its wall time is the host's, and the device work it sent, which
that wall time does not show, is in the device's queue). A gap that sent no
device work of its own (a jitted call) before its first wait waited there
for the queued steps only: ``Q`` is that wait, from the gap's start (an
evaluation that starts with ``float(loss)``), unless the wait passed the
model's queue below taken at the top of the samples' spread (each step an
eighth over ``d``, or their upper quartile where wider: :func:`top_ns`),
with its later waits (the queue was done: they waited for
work sent in the gap), by more than the usual step and the sync's latency
(:func:`unseen_ns`): then it waited for device work the gap sent by no call
the hook saw (eager ops JAX runs in C++ after their first call: jax's mnist examples'
un-jitted ``accuracy()`` of the whole set before a print each epoch, 0.45 s
a wait said as 2.8 ms), ``Q`` is the model's, and a gap a read led is
``device_work`` (the read's line: :data:`UNSEEN_GAPS`), not logging. Where
the gap's first call or eager op took the steps' latest output not yet
ready, the watcher of :mod:`~metrics.engines.jax.device_time` waits for it
off the training thread (``DeviceTimes.probe``) and ``Q`` is measured: from
the gap's start to that output's completion (optax's nanolm: 19 queued
steps of 250-565 ms under load, the sampled median's model 1.7 s off on an
evaluation of 0.12 s). Else: the ``n`` steps
dispatched since the step's previous call after a gap (its ``GAP_END``)
start on the device no earlier than that call or the end of the previous
gap's device work, whichever is later, and each takes the step's measured
device time ``d`` (the median of the samples
:mod:`~metrics.engines.jax.device_time` timed off the training thread): they
end at ``max(resume, free) + n * d`` at the earliest, and ``Q`` is what of
that lies after the gap's start, up to the first wait's return. Without a
measured ``d`` (or before any ``GAP_END``) that ``Q`` is 0 and the figure an
upper bound: it holds the wait for the queued steps, which run either way
(the views say so). ``U``: the host's own work per step before the gap (the
previous call after a gap to the gap's start, over ``n``, less the step's
call and the waits in it: :meth:`Gaps._own_part`). The reads' own
drains (:mod:`~metrics.engines.jax.drains`: per read, from the host's time
since the previous read) are no measure of a gap: its first read's host time
reaches back to the previous gap, 50 steps of host work that overlapped the
queue it waits for (hk_rnn's sampling and evaluation every 50 steps: 1.7 s a
gap said where the program times 0.19-0.33 s of its own after the queue
drained). The gap is charged to the line that led it: the call site of the
other jitted function with the most calls noted in it (evaluation), else the
``device_get`` (checkpoint), else the first read (logging); the gap's other
lines are ``within`` it (their cost is the lead's), and so are the numpy
arguments of the functions called in it (counted apart: numpy_runs.py).
A gap is kept under the step function whose call closed it; only the
step named when read has gaps (while the step was a guess, an evaluation's
two functions alternating before the loop made each call of one a "gap"
of the other). Gaps of marked steps
(``metrics.mark_step``) are not measured here: their step times are
(``slow_steps``).

Example:
    >>> from metrics.engines.jax.gaps import lead_of
    >>> from metrics.engines.jax.gap_costs import own_ns, queued_ns
    >>> lead_of({(0, 11, 4): 1, (CALL, 12, 8): 40})   # a read and an evaluation's calls
    ((6, 12, 8), 'evaluation')
    >>> # 2.4 s of a 3.5 s gap waited for 50 queued 100 ms steps: 1.1 s its own
    >>> own_ns(3_500, queued=queued_ns(0, 2_600, 50, 100, 2_400), usual=52, compiles=0)
    1100
"""

from __future__ import annotations

import itertools
import operator
import time
from collections.abc import Callable
from threading import get_ident
from typing import TYPE_CHECKING, Any

from metrics.engines._frames import site_at
from metrics.engines.jax.gap_costs import (
    copies_state,
    net_ns,
    queued_ns,
    settled_ns,
    top_ns,
    unseen_ns,
)
from metrics.engines.jax.gap_sites import GapSite
from metrics.engines.jax.kinds import CALL, GAP_END, GET, SYNC
from metrics.engines.jax.library_step import loop_frame, user_frame
from metrics.recording.thread_busy import blocked_ns, run_queue_wait_ns

if TYPE_CHECKING:
    from metrics.engines.jax.calls import Owner
    from metrics.engines.jax.context import JaxContext

# CALL, GET, GAP_END (kinds.py): the record kinds in the transfer hook's journal
# beside its own: a call of a jitted function that is not the step (its first
# after other work), a jax.device_get, the step's call after a gap.
EVALUATION, CHECKPOINT, LOGGING = "evaluation", "checkpoint", "logging"
# A read-led gap whose read waited for device work sent in the gap that the
# hook did not see (unseen_ns): PeriodicWork.DEVICE_WORK.
DEVICE_WORK = "device_work"
# A CALL's name for the first eager op after the step's calls that waited for
# them (eager.py): an un-jitted evaluation's, its start the gap's.
EAGER_CALL = "un-jitted jnp ops"
# A read's gaps are device work where at least this share of them waited past
# the steps' queue (1/4: on a loaded CPU the samples run long as often as
# short, hiding the excess in some gaps; the JAX evaluation's mnist examples:
# 4 to 6 of 9).
UNSEEN_GAPS = 4
_WORK_OF = {CALL: EVALUATION, GET: CHECKPOINT, SYNC: LOGGING}
_LEAD_ORDER = (CALL, GET, SYNC)
_GAP_KINDS = frozenset((GAP_END, CALL, GET, SYNC))
# Device-time samples a queue is modelled on, at least (a donating step's one
# sample read 22 ms against 15: its evaluation 29 ms against 300 by A/B).
MIN_SAMPLES = 5
# Gaps a site keeps to cost when the step's device time is measured, at most
# (a gap every step with the step never sampled: the rest said as they close).
PENDING_MAX = 64
MAX_PROBES = 16  # queue ends awaited at once (one a gap; more: the gap not probed)


def lead_of(counts: dict[tuple[Any, ...], int]) -> tuple[tuple[Any, ...], str]:
    """The record key (``(kind, ...)``) that leads a gap holding ``counts``
    records per key, and the gap's work: another jitted function's calls
    (the most noted), else a device_get, else a read."""
    for kind in _LEAD_ORDER:
        keys = [k for k in counts if k[0] == kind]
        if keys:
            key = max(keys, key=counts.__getitem__)
            return key, _WORK_OF[kind]
    key = next(iter(counts))
    return key, LOGGING



class Gaps:
    """Folds gap records after the transfer hook's own fold (``impl``: an
    ``ImplicitTransfers``, records of ``fields`` values)."""

    __slots__ = ("impl", "fields", "open", "by_owner", "called", "resume", "free_at",
                 "timeline", "models", "probes", "busy")

    def __init__(self, impl: Any, fields: int) -> None:
        self.impl, self.fields = impl, fields
        # The gap being filled: [step index, first start ns, {site key: records},
        # its first wait's end (-1: none yet), {names of the functions called},
        # bytes its device_gets copied, its latest wait's end, whether it
        # called a jitted function before its first wait, the ns its waits after
        # the first took while it had called none (device work sent unseen)]
        self.open: list[Any] | None = None
        # The step's latest call after a gap (its GAP_END): (ns, step index);
        # None before the first. The steps from it on are the next gap's queue.
        self.resume: tuple[int, int] | None = None
        # When the device had done the work before ``resume``'s steps, at the
        # earliest (ns; 0: not known): the latest gap's last wait's end, or
        # where no wait in it, the end of the queue it did not wait for.
        self.free_at = 0
        # Per step function whose call closed the gaps (the ``GAP_END``'s):
        # the transfer hook's _Site -> its GapSite. Only the step's gaps are
        # the loop's (:meth:`sites_of`): while the step was a guess (an
        # evaluation before the loop, its two functions alternating), each
        # call of one was a "gap" of the other.
        self.by_owner: dict[Any, dict[Any, GapSite]] = {}
        # Per step function: the jitted functions called in its gaps (their
        # names, as the CALL records' detail) -> the _Site that led the gap:
        # their numpy arguments, counted apart (numpy_runs.py), are its too.
        self.called: dict[Any, dict[str, Any]] = {}
        # The engine's compile spans (startup.CompileTimeline): a gap's compiles
        # (an evaluation's first call) are compile time, not the gap's.
        self.timeline: Any = None
        self.models: dict[Any, tuple[int | None, int | None, int]] = {}  # _model's, a fold's
        # A gap's first call's start ns -> when the steps queued before it ended
        # on the device ([ns]: 0 not yet, -1 not known): expect, DeviceTimes.probe.
        self.probes: dict[int, list[int]] = {}
        # The training thread's CPU share of its wall (ThreadBusy.cpu_share; None:
        # not measured): the host's usual step is its own work, not its waits.
        self.busy: Callable[[], float | None] | None = None

    def after(self, fold: Callable[[list[Any]], None]) -> Callable[[list[Any]], None]:
        """The journal's fold: ``fold`` (the transfer hook's, then its drains'),
        then this one's."""
        mine = self.fold

        def both(flat: list[Any]) -> None:
            fold(flat)
            mine(flat)
        return both

    def fold(self, flat: list[Any]) -> None:
        w = self.fields
        kinds = flat[0::w]
        if GAP_END not in kinds and CALL not in kinds and GET not in kinds and SYNC not in kinds:
            return  # the usual batch of a host-bound loop: its numpy arguments only
        steps, ends, details = flat[7::w], flat[5::w], flat[3::w]
        if kinds.count(SYNC) == len(kinds) > 1 and self._one_line_reads(flat, steps, ends):
            return
        # Only records of these kinds that carry a step index (a read's step
        # field is its end when no step function is known: no gap to be in).
        # Per record this is the fold's cost on a loop that reads every step.
        todo = [i for i, k in enumerate(kinds) if k in _GAP_KINDS and steps[i] != ends[i]]
        if not todo:
            return
        self.models.clear()  # (read once a fold: they change only with new samples)
        codes, offsets, starts, sizes = flat[1::w], flat[2::w], flat[4::w], flat[6::w]
        gap = self.open
        for i in todo:
            k = kinds[i]
            if k == GAP_END:
                if gap is not None and gap[0] < steps[i]:
                    self._close(gap, ends[i], details[i], sizes[i])
                gap = None
                self.resume = (ends[i], steps[i])
                continue
            if gap is None or gap[0] != steps[i]:
                gap = [steps[i], starts[i], {}, -1, set(), 0, -1, False, 0, None]
            key = (k, id(codes[i]), offsets[i])
            counts = gap[2]
            counts[key] = counts.get(key, 0) + 1
            if k == CALL:
                gap[4].add(details[i])
                probe = self.probes.pop(starts[i], None) if self.probes else None
                if probe is not None and gap[9] is None and gap[3] < 0:
                    gap[9] = probe  # the steps' queue's end, measured (set by now or soon)
                if gap[3] < 0 and not gap[7] and details[i] is EAGER_CALL and ends[i] > starts[i]:
                    # An un-jitted evaluation's first op waited for the steps'
                    # output until ``ends[i]``: the queue's end, measured (eager.py)
                    gap[3] = ends[i]
                    gap[6] = max(gap[6], ends[i])
                elif gap[3] < 0:
                    gap[7] = True  # device work of its own before its first wait
            else:  # a wait: the first one had the queued steps done
                if k == GET:
                    gap[5] += sizes[i]
                if gap[3] < 0:
                    gap[3] = ends[i]
                elif not gap[4]:  # a wait after the queue was done, no call seen: unseen work
                    gap[8] += max(0, ends[i] - starts[i])
                if ends[i] > gap[6]:
                    gap[6] = ends[i]
        self.open = gap

    def _one_line_reads(self, flat: list[Any], steps: list[Any], ends: list[int]) -> bool:
        """:meth:`fold` of reads of one line at one step index (a loop that reads
        and calls nothing), in C list operations; False (nothing done) otherwise."""
        w, step = self.fields, steps[0]
        codes, offsets = flat[1::w], flat[2::w]
        n = len(codes)
        if (step == ends[0] or steps.count(step) != n or offsets.count(offsets[0]) != n
                or not all(map(operator.is_, codes, itertools.repeat(codes[0])))):
            return False
        gap = self.open
        if gap is None or gap[0] != step:
            gap = self.open = [step, flat[4], {}, -1, set(), 0, -1, False, 0, None]
        key = (SYNC, id(codes[0]), offsets[0])
        gap[2][key] = gap[2].get(key, 0) + n
        waits = list(map(max, map(operator.sub, ends, flat[4::w]), itertools.repeat(0, n)))
        if gap[3] < 0:  # the first wait had the queued steps done; the later, unseen work
            gap[3], waits[0] = ends[0], 0
        if not gap[4]:
            gap[8] += sum(waits)
        gap[6] = max(gap[6], max(ends))
        return True

    def expect(self, start: int, cell: list[int] | None) -> None:
        """The queue's end for the gap whose first call or eager op began at
        ``start``, to be set by the device-time watcher (``cell``:
        DeviceTimes.probe's)."""
        if cell is not None and len(self.probes) < MAX_PROBES:
            self.probes[start] = cell

    def sites_of(self, step: Any) -> dict[Any, GapSite]:
        """The gaps ``step`` (the step function now named) closed, by site."""
        return self.by_owner.get(step_key(step), {})

    def own(self, g: GapSite, step: Any) -> int:
        """The own time of ``g``'s gaps, ns: those closed before the step's device
        time was measured costed with it now (:func:`settled_ns`)."""
        ns = g.gap_ns
        if g.pending:
            self.models.pop(step, None)  # (samples may have come since the last fold)
            dev = self._model(step)[0]
            within = self.timeline.within if self.timeline is not None else None
            ns += sum(settled_ns(raw, dev, within) for raw in list(g.pending))
        return ns

    def called_in(self, step: Any) -> dict[str, Any]:
        """The functions called in ``step``'s gaps, by name -> the _Site that
        led the (latest) gap they were called in."""
        return self.called.get(step_key(step), {})

    def _own_part(self, usual: int, step: Any) -> int:
        """The host's usual work between the step's calls in a period of ``usual``
        ns, what a gap would have spent anyway: not the step's call (the CPU
        backend runs the step in it), nor a wait at a read every step (even one
        not seen, ``x.item()`` on the CPU: the thread's CPU share, ``busy``),
        both done before the gap began (ais_translation: 1.4 s said 92 ms)."""
        call = getattr(step, "usual_ns", 0)
        own = usual - call if 0 < call < usual else usual
        share = self.busy() if self.busy is not None else None
        return own if share is None else min(own, int(usual * share))

    def _close(self, gap: list[Any], end: int, step: Any, blocked: int = 0) -> None:
        start = gap[1]
        wall = max(0, end - start)
        compiles = self.timeline.within(start, end) if self.timeline is not None and wall else 0
        queued = usual = 0
        unseen = False
        pending = None
        resume = self.resume
        if resume is not None and resume[0] > start:
            resume = None
        n = max(1, gap[0] - resume[1] + 1) if resume is not None else 1  # the step's calls
        if resume is not None:
            usual = (start - resume[0]) // n
        own_usual = self._own_part(usual, step)
        if gap[3] >= 0:  # it waited: for the queued steps first (none waited: none in it)
            first = gap[3] - start
            dev, upper, latency = self._model(step)
            if resume is None:
                dev = None
            model = (queued_ns(max(resume[0], self.free_at), start, n, dev, first)
                     if dev is not None and resume is not None else None)
            if gap[7]:  # it sent device work of its own before: the steps' by the model
                queued = model or 0
                if model is None and resume is not None:  # costed when read, with the model
                    pending = (wall, first, start, n, max(resume[0], self.free_at),
                               own_usual, compiles)
            else:  # the whole wait, unless beyond the model's queue (work it sent, unseen)
                queued = first
                if (model is not None and dev is not None and resume is not None and n > 1
                        and EAGER_CALL not in gap[4]):
                    top = queued_ns(max(resume[0], self.free_at), start, n,
                                    top_ns(dev, upper), first)
                    if unseen_ns(first, top, gap[8]) > usual + latency:
                        queued, unseen = model, True
        elif gap[4] and blocked and resume is not None:
            # No wait, but its calls' dispatch blocked (the thread off the CPU
            # ``blocked`` ns from its first call on): behind the queued steps,
            # as far as their device time says (a write to disk blocks too).
            dev = self._model(step)[0]
            if dev is not None:
                queued = min(blocked, queued_ns(max(resume[0], self.free_at), start, n, dev,
                                                wall))
        probed = gap[9][0] if gap[9] is not None else 0
        if probed > 0:  # the queue's end, measured (the watcher saw it, late by its
            # wake-up: a wait's return that came before it is the earlier sight)
            seen = min(probed, gap[3]) if gap[3] >= 0 else probed
            queued, pending = max(0, min(seen - start, wall)), None
        self.free_at = gap[6] if gap[6] >= 0 else start + queued
        within = self.timeline.within if self.timeline is not None else None
        wall = 0 if pending else net_ns(wall, start, queued, own_usual, compiles, within)
        counts = gap[2]
        if len(counts) == 1:  # the usual gap: one line (a read every step)
            lead_key = next(iter(counts))
            work = _WORK_OF.get(lead_key[0], LOGGING)
        else:
            lead_key, work = lead_of(counts)
        if work == CHECKPOINT and not copies_state(gap[5], getattr(step, "state_bytes", 0)):
            work = LOGGING  # device_get of a loss or a few metrics: no checkpoint
        if unseen and work == LOGGING:
            work = DEVICE_WORK  # its read waited for device work sent in it, unseen
        sites = self.impl._sites
        lead = sites.get(lead_key) or site_at(sites, lead_key)
        if lead is None:
            return
        by_site = self.by_owner.get(step_key(step))
        if by_site is None:
            by_site = self.by_owner[step_key(step)] = {}
        g = by_site.get(lead)
        if g is None:
            g = by_site[lead] = GapSite()
        if pending and len(g.pending) < PENDING_MAX:
            g.pending.append(pending)
        elif pending:  # (a step never measured: each gap an upper bound now)
            wall = settled_ns(pending, None, within)
        rare = None if pending else g.rare_part(wall, counts, lead_key)
        split = rare and (sites.get(rare[0]) or site_at(sites, rare[0]))
        if rare and split is not None and split is not lead:  # (gap_sites.py)
            r = by_site.get(split) or by_site.setdefault(split, GapSite())
            r.gap_ns, r.gaps, r.within = r.gap_ns + rare[1], r.gaps + 1, None
            r.work, wall = _WORK_OF.get(rare[0][0], LOGGING), wall - rare[1]
            if r.work == CHECKPOINT and not copies_state(gap[5], getattr(step, "state_bytes", 0)):
                r.work = LOGGING
        g.gap_ns += wall
        # The step's own calls in a gap came while another function was the
        # step's guess: its numpy arguments are the loop's, not the gap's.
        names = gap[4] - {getattr(step, "name", None)} if gap[4] else gap[4]
        if names:
            called = self.called.get(step_key(step))
            if called is None:
                called = self.called[step_key(step)] = {}
            for name in names:
                called[name] = lead
        g.gaps += 1
        if work == DEVICE_WORK or work == LOGGING:  # a read's: UNSEEN_GAPS of its gaps say
            g.unseen += work == DEVICE_WORK
            work = DEVICE_WORK if UNSEEN_GAPS * g.unseen >= g.gaps else LOGGING
        g.work = work
        if len(counts) > 1:
            for k in counts:
                other = sites.get(k) or site_at(sites, k)
                if other is not None and other is not lead and other is not split:
                    o = by_site.get(other)
                    if o is None:
                        o = by_site[other] = GapSite()
                    o.within = lead

    def _model(self, step: Any) -> tuple[int | None, int | None, int]:
        """The step's queue model (device_time.py), once a fold: its median device
        ns per execution (None: under MIN_SAMPLES; not the top of the spread a
        drain takes, drains.SPREAD: a queue taken long swallows the work a gap
        sent after it), their upper quartile (past which a wait is work the gap
        sent: :func:`unseen_ns`) and the sync latency (0)."""
        got = self.models.get(step)
        if got is None:
            times = getattr(getattr(self.impl, "drains", None), "times", None)
            dev = times.device_ns(step) if times is not None else None
            upper = getattr(times, "upper_ns", None)
            lat = times.latency_ns() if times is not None else None
            dev = dev if dev and dev[1] >= MIN_SAMPLES else None  # (fewer: the wall stays in)
            got = self.models[step] = (dev[0] if dev else None, upper(step) if upper is not None
                                       and dev else None, lat[0] if lat else 0)
        return got

    def clear(self) -> None:
        self.open = None
        self.resume, self.free_at = None, 0
        self.by_owner.clear()
        self.called.clear()


def step_key(step: Any) -> Any:
    """What a step's gaps are kept under: its function's name (a second
    training loop's step of the same name goes on with the first's gaps:
    JaxContext.succeed), else the step itself (marked steps)."""
    return getattr(step, "name", None) or step


def at_call(context: JaxContext, owner: Owner, frame: Any,
            args: tuple[Any, ...] = ()) -> bool | None:
    """A call of ``owner`` after other work (``context.gap_owner`` was not
    it): the step's call closes the gap (``GAP_END``, with the step);
    another function's call is noted (``CALL``), once until other work, at
    the line of the loop that led to it (:func:`~.library_step.loop_frame`), else at the
    user's line of the call."""
    step = context.step_owner
    if owner is not step and context.step_thread and get_ident() != context.step_thread:
        return False  # another thread's call (hk_impala's actors): not the loop's gap
    context.gap_owner = owner
    eng = context.active
    if eng is None:
        return None
    impl = eng.implicit
    if owner.caller_code is None:  # once per function: the user's code calling it
        at = user_frame(impl._frames, frame)
        owner.caller_code = at[0] if at else False
    if step is None:
        return None
    now = time.monotonic_ns()
    if owner is step:
        q = impl.queue
        blocked, began = 0, context.gap_cpu
        if began is not None:  # (gaps with another function's calls only: rare)
            context.gap_cpu = None
            blocked = blocked_ns(began, (now, time.thread_time_ns(), run_queue_wait_ns()))
        q.extend((GAP_END, None, 0, owner, now, now, blocked, owner.calls))
        context.gap_call, context.step_thread = (now, owner.calls, owner), get_ident()
    elif not owner.explicit:
        last = context.gap_call
        # (not where another function runs in every step's gap: two thread-CPU
        # reads a step, 5.6 us each under gVisor, for gaps that are the step's)
        if context.gap_cpu is None and (last is None or step.calls - last[1] > 2):
            context.gap_cpu = (now, time.thread_time_ns(), run_queue_wait_ns())
            impl.gaps.expect(now, eng.device_times.probe(args))  # the queue's end, measured
        loop = loop_frame(frame, getattr(step, "caller_code", None) or None)
        impl.record(CALL, loop or frame, now, now, 0, owner.name)
    return None

