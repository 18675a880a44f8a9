"""Eager (un-jitted) JAX primitives run outside ``jax.jit``, counted per user line.

Every primitive JAX runs eagerly is bound on the evaluation trace:
``Primitive.bind`` -> ``EvalTrace.process_primitive`` -> its implementation
(for most, ``dispatch.apply_primitive``: one single-op graph dispatched from
Python). Inside ``jax.jit`` (and ``vmap``/``grad`` tracing) primitives go
to other traces, so ``EvalTrace.process_primitive`` sees only eager work.
It is wrapped on the class (``apply_primitive`` itself cannot be: each
primitive's implementation holds it in a ``functools.partial`` made when
JAX was imported, and some eager primitives, ``random_split`` or
``slice``, have implementations of their own).

What counts: every primitive bound there, except host->device transfers
(``device_put``, ``stage``: the transfer hooks count them), a PRNG key's
wrapping (``random_wrap``, ``random_unwrap``: metadata, no dispatch) and a jitted
call JAX makes from its own jit wrapper (its executions are counted
elsewhere); a ``jit`` bound there by an eager ``vmap`` or ``grad`` is eager
work, named by its function (``multiply``). Primitives nested in another
one's implementation are the outer one's time. Eager indexing (``x[idx]``,
``x.at[idx].set(y)``) is timed whole, from entry to return, as one record
named by its gather or scatter: most of it is Python around its primitives
(:mod:`~metrics.engines.jax.indexing`).

On each: the clock before and after, the primitive's name, and the user's
code object and instruction offset, found with the implicit-transfer
hook's frame classes (:class:`~metrics.engines.jax.implicit.ImplicitTransfers`,
whose site table keeps these sites as ``EAGER_OP``, lines resolved at read
time, with the library call they went through as ``via``). A call that
compiled (the first of each op and shape) keeps its count but not its time:
the compile is the compile's. ``count`` is how many times the line ran
eager ops (one ``random.split(key)`` binds three primitives: one time): a
record starts a new time unless the previous record came from the same
instruction with nothing else recorded in between (no counted jitted call,
step mark, transfer or sync: what separates steps), so a periodic
evaluation's hundreds of ops at one line are one time each, never "per step".
Each record also carries its step (the step function's calls so far, as a
device->host read does), so a line's ``occurrences`` are the steps it ran
in and ``steps_spanned`` how far apart: an evaluation's ops every 47 steps
read "every 47 steps", however long its own passes take.

An op dispatched behind queued device work can wait for it (an input not
ready yet, or CPU JAX's bound on computations in flight: the first ops of an
evaluation after an epoch of queued steps wait for them). That wait is the
queued steps' device time, not the op's: before the op, its array inputs'
``is_ready()`` is read (non-blocking, a few hundred ns each); an op that
found one not ready keeps the step's latest call after other work
(``JaxContext.gap_call``: the device runs none of the steps from it on
before it), and at fold time is charged only its time past the queue's
end, which comes no sooner than that call plus the steps since times the
step's measured device time: :mod:`~metrics.engines.jax.drains`' ``h + w -
max(h, d)`` for a read. An op can also wait with its inputs ready, for a
slot behind the queue (CPU JAX's bound: dm-haiku's ``next(rng)``, an eager
split of a key nothing queued touches, waited 379 ms every 50 steps, and
removing it saved nothing). So an op that began while the device was busy
with earlier work (an input not ready, or the device-time watcher waiting
on a sampled call: two attribute reads) also reads this thread's CPU clock
around it, and is charged at most that: a wait, blocked in the runtime,
takes none (a split behind the queue: 98 ms of wall time, 1.1 ms of CPU;
with nothing queued, 0.82 and 0.83 ms).

An op that waited for the step's output, at a step index after steps that
ran no eager op (eager indexing every step is none), is an un-jitted
evaluation's: it is also noted as a call in the loop's gap
(:mod:`~metrics.engines.jax.gaps`, ``EAGER_CALL``), at the loop's line,
so the gap is timed from it and named an evaluation (jax's
mnist_classifier_fromscratch: its ``accuracy()`` each epoch, not said
before, 224-243 ms an epoch said against 220 ms by A/B).

An op bound on numpy inputs (``jax.lax.with_sharding_constraint(data,
sharding)`` of a numpy data set each epoch) copies them to the device each
time: their bytes are the site's bytes (an ``isinstance`` per input), so the
advice can be to put the data on the device once.

Not seen: eager calls of functions JAX jitted itself (``jnp.sin(x)``,
``x + 1``, ``jnp.sum(x)``) run in C++ after their first call; they are named
as a blind spot.

Example (what a site reads as)::

    SiteReading(kind="eager_op", location="/w/train.py:230", count=1200,
                seconds=0.018, function="main", detail="reshape")
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

import numpy as np

from metrics.engines._patching import Patches
from metrics.engines.jax import indexing
from metrics.engines.jax.context import JaxContext
from metrics.engines.jax.gaps import EAGER_CALL
from metrics.engines.jax.implicit import (  # the walk's frame classes
    _THIRD,
    _USER,
    ImplicitTransfers,
)
from metrics.engines.jax.implicit import MAX_CODES as _MAX_CODES
from metrics.engines.jax.kinds import CALL
from metrics.engines.jax.library_step import loop_frame
from metrics.engines.jax.sites import EAGER_OP, OVERFLOW, known_steps
from metrics.engines.jax.startup import take_out
from metrics.recording.journal import FOLD_AT, Journal
from metrics.recording.recorder import Recorder

if TYPE_CHECKING:
    from jax._src.core import EvalTrace, Primitive

# (code, offset, name, start, end, separators, step, queued, cpu, host) per
# record; queued: for an op that found an input not ready, the step's latest
# call after other work (JaxContext.gap_call), else None; cpu: for an op that
# began while the device was busy (an input not ready, or the device-time
# watcher waiting on a sampled call), this thread's CPU ns over it, else -1;
# host: the bytes of its numpy inputs (the op copies them to the device).
FIELDS = 10
MAX_NAMES = 4  # primitive names kept per site
# Not counted: host->device transfers (the transfer hooks count them) and a
# PRNG key's wrapping and unwrapping (metadata only: no dispatch, no device work).
_NOT_COUNTED = frozenset({"device_put", "stage", "random_wrap", "random_unwrap"})
_JIT = "jit"  # pjit_p's name: decided per call (_jit_name)
# Where JAX's own jit wrapper binds a jitted call itself (not eager work).
_JIT_CALLERS = frozenset({"_run_python_pjit", "_python_pjit_helper", "cache_miss"})
_CORE = ("core.py",)
READY_CHECKED = 4  # inputs of an op checked for readiness (an op has one to three)
# An op whose input was not ready waited for the queue when it was off the CPU
# this long in its call; else it was only queued behind the steps (optax's
# nanolm: its evaluation's split of the step's key took 36 us, and its 19
# queued steps' 10.6 s were said as the evaluation's, its first "wait").
BLOCKED_NS = 1_000_000


class _Local(threading.local):
    busy = False  # inside a counted primitive on this thread: nested ones are its time
    # Inside a timed indexing call (:mod:`.indexing`): the name it is told by,
    # "" until one of its primitives is bound; None outside one.
    span: str | None = None


class EagerOps:
    """Counts eager primitives for one :class:`~metrics.engines.jax.JaxEngine`
    (``engine.eager``) into its implicit-transfer site table (``implicit``)."""

    def __init__(self, recorder: Recorder, implicit: ImplicitTransfers,
                 calls: Journal, explicit: Journal) -> None:
        self.rec = recorder
        self.impl = impl = implicit
        self.journal = recorder.journal(self._fold)
        self.queue = self.journal.queue
        impl.feeders.append(self.journal)
        # What separates two times a line ran (see the module docstring):
        # the journals of counted calls, step marks, syncs and transfers. A
        # record keeps the sum of their positions (items ever appended: each
        # only grows, so the sum is unchanged only where nothing was appended,
        # whether or not a read folded them in between).
        self.separators: tuple[Journal, Journal, Journal, Journal] = (
            calls, recorder._steps, impl.journal, explicit)
        self.last = (0, -1)  # the last record folded: its line key and separators
        self._lines: dict[tuple[int, int], int] = {}  # (id(code), offset) -> line key
        self.names: dict[Primitive, str | None] = {}  # primitive -> its name, None: not counted
        self.installed = False
        self.missing: list[str] = []
        self.record = _recorder(self)
        self.local = _Local()  # this thread's state, shared with the indexing calls' spans

    def install(self, patches: Patches, context: JaxContext) -> None:
        """Wraps ``EvalTrace.process_primitive`` (restored with ``patches``;
        a call that compiles is told by ``context``'s compile count)."""
        try:
            from jax._src import core
        except ImportError as e:
            self.missing.append(f"eager ops are not counted: jax._src.core missing ({e})")
            return
        array: type | None
        try:
            from jax._src.array import ArrayImpl
            array = ArrayImpl
        except ImportError:  # inputs' readiness not read: an op's waits stay its time
            array = None
        self.installed = patches.apply(core.EvalTrace, "process_primitive",
                                       lambda orig: _wrap(orig, self, context, array),
                                       ("self", "primitive", "args", "params"))
        if not self.installed:
            self.missing.append("eager ops are not counted: EvalTrace.process_primitive "
                                "missing or changed")
            return
        self.missing.extend(indexing.install(patches, self, context, array, core))

    def name_of(self, primitive: Primitive) -> str | None:
        """``primitive``'s name as counted (kept), None when not counted."""
        name = getattr(primitive, "name", None)
        if not isinstance(name, str) or name in _NOT_COUNTED:
            name = None
        if len(self.names) < 4096:
            self.names[primitive] = name
        return name

    # Fold (the hot path: _recorder and _wrap, below) -----------------------

    def _fold(self, flat: list[Any]) -> None:
        """Records -> the site table, grouped per (code, offset, name) with
        numpy: no Python loop per record, only per group. A record starts a
        new time of its line unless the one before it came from the same
        line with the same separators (see the module docstring)."""
        w = FIELDS
        n = len(flat) // w
        if not n:
            return
        take_out(flat, w, 3, 4, self.impl.context.startups)  # opening the device: apart
        codes, offsets = flat[0::w], flat[1::w]
        ends = np.fromiter(flat[4::w], np.int64, n)
        ns = ends - np.fromiter(flat[3::w], np.int64, n)
        if any(flat[7::w]):  # ops that waited for queued steps
            self._waits_out(flat, ns)
        cpu = np.fromiter(flat[8::w], np.int64, n)
        busy = cpu >= 0
        if busy.any():  # behind queued work: at most the thread's own time (module docstring)
            ns[busy] = np.minimum(ns[busy], cpu[busy])
        keys = np.empty((n, 3), np.int64)
        keys[:, 0] = np.fromiter(map(id, codes), np.int64, n)
        keys[:, 1] = np.fromiter(offsets, np.int64, n)
        keys[:, 2] = np.fromiter(map(id, flat[2::w]), np.int64, n)
        _, first, inv = np.unique(keys.view(np.dtype((np.void, 24))).ravel(),
                                  return_index=True, return_inverse=True)
        inv = inv.ravel()
        # Each record's line (an int per distinct code object and line) and separators.
        lines = np.array([self._line_key(codes[j], offsets[j]) for j in first.tolist()],
                         np.int64)[inv]
        sigs = np.fromiter(flat[5::w], np.int64, n)
        new = np.empty(n, np.int64)
        new[0] = (int(lines[0]), int(sigs[0])) != self.last
        new[1:] = (lines[1:] != lines[:-1]) | (sigs[1:] != sigs[:-1])
        self.last = (int(lines[-1]), int(sigs[-1]))
        m = first.size
        times = np.bincount(inv, weights=new, minlength=m).tolist()
        spent = np.bincount(inv, weights=ns, minlength=m).tolist()
        latest = np.zeros(m, np.int64)
        np.maximum.at(latest, inv, ends)
        host = np.bincount(inv, weights=np.fromiter(flat[9::w], np.int64, n),
                           minlength=m).tolist()
        earliest = np.full(m, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(earliest, inv, ends)
        # The steps each instruction ran in (its occurrences: an evaluation's
        # ops every 47 steps, 47 apart), where the step function was known (-1:
        # not yet); per instruction, as the site table keeps them, not per op.
        step_of = np.fromiter(flat[6::w], np.int64, n)
        _, at, by_site = np.unique(keys[:, :2].copy().view(np.dtype((np.void, 16))).ravel(),
                                   return_index=True, return_inverse=True)
        by_site = by_site.ravel()
        steps = known_steps(step_of, by_site, at.size)
        told: set[int] = set()  # the instructions whose steps this batch has told
        impl = self.impl
        with impl._lock:
            for i in np.argsort(first, kind="stable").tolist():  # names in the order seen
                j = int(first[i])
                name = flat[w * j + 2]
                k = int(by_site[j])
                tell = k not in told and steps[k] is not None
                told.add(k)
                site = impl._add_site(EAGER_OP, codes[j], offsets[j], name, int(times[i]),
                                      int(host[i]), int(spent[i]), int(latest[i]), int(earliest[i]),
                                      steps[k] if tell else None)
                names = site.detail.split(", ") if site.detail else []
                if site.detail != OVERFLOW and name not in names and len(names) < MAX_NAMES:
                    site.detail = ", ".join([*names, name])

    def _waits_out(self, flat: list[Any], ns: np.ndarray) -> None:
        """The ops that found an input not ready waited for queued device
        work: each is charged only its time past the queue's end, in ``ns``
        (in place). The queue ends no sooner than the step's latest call
        after other work (a read, an evaluation: ``JaxContext.gap_call``,
        kept with the op) plus the steps from it on times the step's measured
        device time per execution: what :mod:`~metrics.engines.jax.drains`
        charges a read, ``h + w - max(h, d)``, that is ``end - max(start,
        queue's end)``, between 0 and the op's time. Without a measured
        device time or such a call the op keeps its whole time."""
        w = FIELDS
        dev = self.impl.drains.current().device_ns
        if dev is None:
            return
        for i, ref in enumerate(flat[7::w]):
            if ref:
                start, end, step = flat[w * i + 3], flat[w * i + 4], flat[w * i + 6]
                at, first, _ = ref
                if first <= step and at <= start:
                    done = at + (step - first + 1) * dev  # the queue ends no sooner
                    ns[i] = end - max(start, min(done, end))

    def _line_key(self, code: CodeType | None, offset: int) -> int:
        """A number for ``code``'s line at ``offset`` (fold time; kept per
        instruction): equal for two instructions of one line."""
        key = (id(code), offset)
        line = self._lines.get(key)
        if line is None:
            line = hash((id(code), _line(code, offset)))
            if len(self._lines) < _MAX_CODES:
                self._lines[key] = line
        return line

    def blind_spots(self) -> list[str]:
        """What this hook cannot see, one sentence each."""
        out = list(self.missing)
        if self.installed:
            out.append("eager calls of functions JAX jits itself (jnp.sin(x), x + 1, "
                       "jnp.sum(x)) run in C++ after their first call and are not counted "
                       "as eager ops; primitives bound from Python are (jnp.reshape, x[i], "
                       "iterating an array, random.split, an eager vmap or grad)")
        return out


def _recorder(ops: EagerOps) -> Callable[..., None]:
    """``record(name, frame, start, end, waited, cpu, host=0)``: one eager
    primitive seen at
    ``frame``, walked out to the user's frame (its code object and
    instruction offset kept; the line found when read) and appended with the
    separators' state. What it reads is bound once (hot path)."""
    impl = ops.impl
    context = impl.context  # its step_owner: which step the op ran in
    get, classify, vias, user, third = impl._codes.get, impl._classify, impl._via, _USER, _THIRD
    j1, j2, j3, j4 = ops.separators
    q1, q2, q3, q4 = (j.queue for j in ops.separators)
    queue, flush, fold_at = ops.queue, ops.journal.flush, FOLD_AT * FIELDS
    extend = queue.extend
    waited_at: dict[tuple[int, int], int] = {}  # a line's waits: (id(code), offset) -> step

    def record(name: str, frame: FrameType | None, start: int, end: int,
               waited: bool, cpu: int, host: int = 0, pending: Any = None) -> None:
        via = inner = None
        code: CodeType | None  # (an annotation: no work on the hot path)
        f = frame
        while f is not None:  # one dict lookup per frame, as the transfer hook's walk
            code = f.f_code
            c = get(id(code))
            if c is None:
                c = classify(code)
            if c == user:
                break
            if c == third:  # another library (flax): its outermost frame is the via
                via, inner = code, inner or f
            f = f.f_back
        else:  # no user frame: the innermost library frame, as the user's (if any)
            f, code, via = inner, inner.f_code if inner is not None else None, None
        offset = f.f_lasti if f is not None else 0
        if via is not None and len(vias) < _MAX_CODES:
            vias.setdefault((id(code), offset), via)
        step = context.step_owner
        queued = None
        at = -1 if step is None else step.calls
        if at != context.eager_step:
            context.eager_prev, context.eager_step = context.eager_step, at
        if waited:  # an input not ready: the queue it waited for began no sooner than this
            call = context.gap_call
            if call is not None and call[2] is step:
                queued = call
            if step is not None and context.gap_owner is step and (
                    context.step_thread in (0, threading.get_ident())) and (
                    at - context.eager_prev > 1 or _new_wait(waited_at, f, offset, at)):
                # The first eager op after steps that ran none, or the first
                # at a line that waited in no step before this one, waiting
                # for them: device work sent in the loop's gap (an un-jitted
                # evaluation), noted as the gap's call at the loop's line
                # (gaps.py). Eager ops every step (indexing a batch, a
                # one_hot of the labels) are none.
                context.gap_owner = None
                blocked = cpu < 0 or end - start - cpu > BLOCKED_NS
                impl.record(CALL, loop_frame(frame, getattr(step, "caller_code", None) or None)
                            or frame, start, end if blocked else start,  # its end: the queue's
                            0, EAGER_CALL)
                times = impl.drains.times
                if not blocked and times is not None:  # the queue's end, measured off-thread
                    impl.gaps.expect(start, times.probe((pending,)))
        extend((code, offset, name, start, end,
                len(q1) + j1.folded + len(q2) + j2.folded + len(q3) + j3.folded
                + len(q4) + j4.folded,
                at, queued, cpu, host))
        if len(queue) >= fold_at:
            flush()

    return record


def _new_wait(waited_at: dict[tuple[int, int], int], frame: FrameType | None, offset: int,
              at: int) -> bool:
    """Whether an op that waited for the steps, at ``frame``'s ``offset``
    after step ``at``, is a new wait at its line: none there before, or none
    in the step just before (True: an evaluation's first op, even where other
    eager ops run every step, as the JAX docs' data-loading notebook's
    ``one_hot``; False: a per-step op on the step's output). Notes this wait."""
    if frame is None:
        return False
    key = (id(frame.f_code), offset)
    seen = waited_at.get(key)
    if seen is not None or len(waited_at) < _MAX_CODES:
        waited_at[key] = at
    return at >= 2 and (seen is None or seen < at - 1)


def _line(code: CodeType | None, offset: int) -> int:
    """``code``'s line number at instruction ``offset`` (0 when not known)."""
    if code is None:
        return 0
    for start, end, line in code.co_lines():
        if start <= offset < end:
            return line or 0
    return 0


def _jit_name(params: dict[str, object], frame: FrameType | None) -> str | None:
    """A ``jit`` bound eagerly: the jitted function's name when an eager
    transformation (vmap, grad) bound it, None when JAX's own jit wrapper
    called it (a jitted call: counted as an execution, not eager work)."""
    f = frame
    while f is not None and f.f_code.co_filename.endswith(_CORE):
        f = f.f_back
    if f is not None and f.f_code.co_name in _JIT_CALLERS:
        return None
    name = params.get("name")
    return name if isinstance(name, str) else _JIT


def _wrap(original: Callable[..., Any], ops: EagerOps, context: JaxContext,
          array: type | None) -> Callable[..., Any]:
    """``process_primitive`` timed and recorded; ``array``: jax's array class
    (its inputs' ``is_ready()`` is read before the op; None: not read)."""
    clock, getframe, seq = time.monotonic_ns, sys._getframe, context.compile_seq
    thread_clock, drains = time.thread_time_ns, ops.impl.drains  # drains.times: the watcher
    is_ready = getattr(array, "is_ready", None)
    ndarray = np.ndarray  # a numpy input (JAX's TypedNdArray is one): copied by the op
    names, name_of, record, local = ops.names, ops.name_of, ops.record, ops.local
    unseen, indexes = object(), indexing.NAMES

    def process_primitive(self: EvalTrace, primitive: Primitive, args: Sequence[object],
                          params: dict[str, object], /) -> Any:
        name = names.get(primitive, unseen)
        if name is None or local.busy:
            if name is not None and local.span is not None:  # in a timed indexing call
                known = name_of(primitive) if name is unseen else name
                if isinstance(known, str) and known != _JIT and (not local.span
                                                                 or known in indexes):
                    local.span = known  # the call's name: its gather or scatter, else its first
            return original(self, primitive, args, params)
        if name is unseen:
            name = name_of(primitive)
            if name is None:
                return original(self, primitive, args, params)
        if name == _JIT:
            name = _jit_name(params, getframe(1))
            if name is None:
                return original(self, primitive, args, params)
        local.busy = True
        waited, host, pending = False, 0, None
        try:  # non-blocking: an input not ready means the op may wait for queued work
            for a in args[:READY_CHECKED]:
                if type(a) is array:
                    if not waited and is_ready is not None and not is_ready(a):
                        waited, pending = True, a
                elif isinstance(a, ndarray) and a.ndim:  # host data (not a constant 2.0)
                    host += a.nbytes
        except Exception:  # noqa: BLE001 - a deleted array: the op itself says so
            waited = False
        times = drains.times
        # The device busy with earlier work (the watcher waits on a sampled
        # call): the op may wait behind it with its inputs ready (a slot on
        # CPU JAX); its own time is this thread's CPU time (~1 us to read).
        cpu0 = (thread_clock() if waited or times is not None and (times.held or times.pending)
                else -1)
        compiles = seq[0]
        start = clock()
        try:
            return original(self, primitive, args, params)
        finally:
            end = clock()
            cpu = thread_clock() - cpu0 if cpu0 >= 0 else -1
            local.busy = False
            try:
                record(name, getframe(1),  # type: ignore[arg-type]  # a str by now
                       end if seq[0] != compiles else start, end, waited, cpu, host, pending)
            except Exception as e:  # noqa: BLE001 - a hook never raises into the program
                ops.rec.hook_failed("jax.eager", e)

    process_primitive.__wrapped__ = original  # type: ignore[attr-defined]
    return process_primitive
