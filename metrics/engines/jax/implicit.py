"""Transfers nobody asked for, in JAX, both ways, each with the user's line.

Device -> host syncs: ``jax._src.array.ArrayImpl._value`` (a property) is
what ``float(x)``, ``int(x)``, ``bool(x)`` (``if x > 0:``), ``x.tolist()``,
``print(x)``/``str``/``repr``/``format`` and ``jax.device_get`` read; it is
replaced by one that, when no host copy is cached yet (``_npy_value`` is
None), times the read and notes the caller. Host -> device: the hooks of
:mod:`metrics.engines.jax.to_device` (``jnp.asarray`` of host data, the
numpy shard handlers) and the ``jax.jit`` wrapper's report of numpy
arguments (:class:`~metrics.engines.jax.jit_numpy.JitArguments`) record here.

The hot path walks out of library frames (:mod:`metrics.engines._frames`),
deciding "library or not" once per code object, and appends the user's code
object and offset with the clock readings, bytes and step (the step's calls:
a site's ``occurrences``; a record on another thread than the step's has
none) to a journal: one ``list.extend``. A walk through another library
(flax, optax) notes its outermost frame for the line (``via``).

Nothing is counted twice: a read under ``jax.device_get`` or a transfer under
``jax.device_put`` is explicit, and when the hook's own wrapper of either is on
the stack that wrapper counts it; a numpy argument of a call of the ``jax.jit``
wrapper is its report's (:class:`JitArguments` says which frames those are); the
first call of the jitted ``stage`` under ``jnp.asarray`` is the ``stage`` hook's.
"""

from __future__ import annotations

import itertools
import operator
import os
import sys
import time
from collections.abc import Callable
from threading import Lock, get_ident
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

import numpy as np

from metrics.engines._frames import ENGINE, LIBRARY, LibraryFrames, skip_prefixes, via_words
from metrics.engines._patching import Patches
from metrics.engines.jax import drains, gaps, to_device
from metrics.engines.jax import sites as jax_sites
from metrics.engines.jax.jit_numpy import JitArguments, relabelled
from metrics.engines.jax.kinds import EXPLICIT_D2H, EXPLICIT_H2D, UNTIMED_H2D
from metrics.engines.jax.sites import (
    EAGER_OP,
    IMPLICIT_H2D,
    OVERFLOW,
    SITE_KINDS,
    SYNC,
    Steps,
    SyncLine,
    grouped_steps,
)
from metrics.recording import forksafe
from metrics.recording.journal import FOLD_AT, Journal
from metrics.recording.recorder import Recorder
from tpu_info.contract import catalog as names
from tpu_info.contract.model import SiteReading

if TYPE_CHECKING:
    from jax._src.array import ArrayImpl

    from metrics.engines.jax.context import JaxContext
    from metrics.engines.jax.explicit import ExplicitTransfers

# The journal's record kinds: kinds.py (SYNC, IMPLICIT_H2D: those a site is kept under).
assert to_device.IMPLICIT_H2D == IMPLICIT_H2D
_SITE_KIND = {SYNC: SYNC, IMPLICIT_H2D: IMPLICIT_H2D, UNTIMED_H2D: IMPLICIT_H2D,
              EAGER_OP: EAGER_OP, gaps.CALL: gaps.CALL, gaps.GET: gaps.GET}  # gaps': no transfer


def _kinds(*kinds: int) -> np.ndarray:  # a lookup table: record kind -> in ``kinds``
    return np.isin(np.arange(gaps.GAP_END + 1), kinds)


_H2D_TIMED = _kinds(IMPLICIT_H2D, EXPLICIT_H2D)
_H2D_ALL = _kinds(IMPLICIT_H2D, EXPLICIT_H2D, UNTIMED_H2D)
_D2H_ALL = _kinds(SYNC, EXPLICIT_D2H)
_H2D_IMPLICIT = _kinds(IMPLICIT_H2D, UNTIMED_H2D)
_D2H_IMPLICIT = _kinds(SYNC)
_SITE_MASK = _kinds(SYNC, IMPLICIT_H2D, UNTIMED_H2D, gaps.CALL, gaps.GET)
# (kind, code, offset, detail, start, end, bytes, step) per record; step: the
# step function's calls so far (JaxContext.step_owner), else the end (its own).
FIELDS = 8
MAX_SITES_PER_KIND = 256
MAX_CODES = 1 << 16  # code objects classified and kept; beyond, classified each time

# What a frame is, decided once per code object. _THIRD: another installed
# library (flax, optax): walked through like _LIB, named as the line's via.
_USER, _LIB, _EXPLICIT, _COUNTED, _JIT_WRAPPER, _THIRD = range(6)

# Library functions that name how the user got there: the outermost one seen
# on the way out wins (``x.item()`` reaches ``_value`` through ``__array__``).
_DETAILS = {
    "__float__": "float()", "__int__": "int()", "__index__": "int index", "__complex__":
    "complex()", "__bool__": "bool() (if/while on an array)", "tolist": "tolist()",
    "_item": "item()", "__str__": "print()/str()", "__repr__": "repr()", "__format__":
    "format()/f-string", "__array__": "np.asarray()", "__reduce__": "pickle", "__iter__":
    "iteration", "device_get": "jax.device_get", "device_put": "jax.device_put", "asarray":
    "jnp.asarray", "array": "jnp.array", "_pjit_call_impl_python": "host argument of a "
    "jitted call", "cc_shard_arg": "host argument of a jitted call on several devices"}

# metrics/: this hook's own frames (this file is metrics/engines/jax/implicit.py)
_METRICS_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_KIND_CLASS = {ENGINE: _LIB, LIBRARY: _THIRD}


class _Site:
    __slots__ = ("code", "offset", "detail", "count", "bytes", "ns", "first_end", "last_end",
                 "where", "via", "occurrences", "first_step", "last_step", "drain_ns",
                 "timed", "timed_bytes")

    def __init__(self, code: CodeType | None, offset: int, detail: str | None) -> None:
        self.code, self.offset, self.detail = code, offset, detail
        self.count = self.bytes = self.ns = self.occurrences = self.drain_ns = 0  # drains.py
        self.timed = self.timed_bytes = 0  # records with a time, their bytes
        self.first_step = self.last_step = -1  # the step index of the first and latest record
        self.first_end: int | None = None  # monotonic ns: the first record's end
        self.last_end = 0
        self.where: tuple[str, str] | None = None  # (location, function), resolved once read
        self.via: str | None = None  # the library call it went through, resolved once read


class ImplicitTransfers:
    """Counts implicit transfers for one engine (its ``implicit``); folds at read time."""

    def __init__(self, recorder: Recorder, degraded: list[str],
                 explicit: ExplicitTransfers, context: JaxContext) -> None:
        import jax

        self.rec = rec = recorder
        self.context = context  # its step_owner: which step a read belongs to
        self._explicit = explicit  # its journal takes the explicit device_puts
        self.degraded = degraded  # the engine's
        self._frames = LibraryFrames(skip_prefixes(jax, sys.modules.get("jaxlib"), np))
        # id(code) -> its class, or its detail (a library function that names
        # the path). Keyed by id: a code object hashes its whole body (~0.5 us);
        # the codes are kept alive in _held so an id is never reused.
        self._codes: dict[int, int | str] = {}
        self._held: list[CodeType] = []
        # (id(user code), offset) -> the outermost installed-library code a
        # walk from there went through (flax's jit): the line's via.
        self._via: dict[tuple[int, int], CodeType] = {}
        self._sites: dict[tuple[int, int, int], _Site] = {}
        self._per_kind = dict.fromkeys(SITE_KINDS, 0)
        self._other: dict[int, _Site] = {}
        self._lock = Lock()  # the site table: folds vs readers
        # (table, key, original): the numpy shard handlers replaced in JAX's table
        self.dict_patches: list[tuple[dict[type, Callable[..., Any]], type,
                                      Callable[..., Any]]] = []
        self.missing: list[str] = []  # what could not be hooked, in words
        # Its fold, then each read's drain, then the loop's gaps (evaluation, checkpoints).
        self.drains = drains.Drains(self, time.monotonic_ns(), FIELDS)
        self.gaps = gaps.Gaps(self, FIELDS)
        self.journal = rec.journal(self.gaps.after(self.drains.fold))
        self.queue = self.journal.queue
        self.feeders: list[Journal] = []  # other hooks' journals folding into the site table
        dist, counter = rec.distribution, rec.counter
        self._h2d_time, self._d2h_time = (dist(names.TRANSFER_TO_DEVICE_TIME),
                                          dist(names.TRANSFER_FROM_DEVICE_TIME))
        self._outbound, self._inbound = dist(names.OUTBOUND_DATA), dist(names.INBOUND_DATA)
        self._implicit_h2d = counter(names.IMPLICIT_TRANSFER_TO_DEVICE)
        self._implicit_d2h = counter(names.IMPLICIT_TRANSFER_FROM_DEVICE)
        self._implicit_out = counter(names.IMPLICIT_OUTBOUND_BYTES)
        self._implicit_in = counter(names.IMPLICIT_INBOUND_BYTES)
        self.jit_arguments = JitArguments(self, _USER, UNTIMED_H2D)  # jit's numpy args
        self.explicit_puts_counted = False  # by the numpy shard handler (see install)
        forksafe.owned(self)

    def let_go_after_fork(self) -> None:  # noqa: D102
        forksafe.free_locks(self)
    # Install -----------------------------------------------------------------

    def install(self, patches: Patches) -> None:
        """Hooks ``_value``, ``stage_p`` and the numpy shard handlers (which
        count the engine's explicit ``jax.device_put``s of host data where JAX
        marks them: ``explicit_puts_counted``)."""
        self._patch_value(patches)
        to_device.patch_stage(self, patches, _COUNTED)
        self.explicit_puts_counted = to_device.patch_shard_handlers(self, self._explicit)

    def counted_by(self, *wrappers: Callable[..., Any]) -> None:
        """The hook's own wrappers (of ``jax.device_get``, ...): a transfer
        under one of them is that wrapper's to count."""
        for fn in wrappers:
            code = getattr(fn, "__code__", None)
            if code is not None:
                self.hold(code, _COUNTED)

    def uninstall(self) -> None:
        for table, key, original in reversed(self.dict_patches):
            table[key] = original
        self.dict_patches.clear()

    def not_counted(self, what: str, why: str) -> None:
        """``what`` could not be hooked (``why``): said in doctor and the report."""
        self.missing.append(f"{what} are not counted: {why}")
        self.degraded.append(f"{what} not counted: {why}")

    def _patch_value(self, patches: Patches) -> None:
        try:
            from jax._src.array import ArrayImpl
        except ImportError as e:
            return self.not_counted("device->host syncs",
                                    f"jax._src.array.ArrayImpl missing ({e})")
        prop = ArrayImpl.__dict__.get("_value")
        if not isinstance(prop, property) or prop.fget is None:
            return self.not_counted("device->host syncs", "ArrayImpl._value is not a property")
        if not patches.apply(ArrayImpl, "_value", lambda orig: _value_property(orig, self)):
            self.missing.append("device->host syncs are not counted: ArrayImpl._value missing")

    # The frame walk (hot path) -----------------------------------------------

    def _classify(self, code: CodeType) -> int | str:
        fn = code.co_filename
        if fn.startswith(_METRICS_DIR):
            cls = _JIT_WRAPPER if self.jit_arguments.reported_under(code) else _LIB
        elif code.co_name in ("device_get", "device_put") and fn.endswith(
                os.path.join("jax", "_src", "api.py")):
            cls = _EXPLICIT
        else:
            cls = _KIND_CLASS.get(self._frames.kind(fn), _USER)
        if len(self._codes) < MAX_CODES:
            self.hold(code, cls)
            return self._codes[id(code)]
        detail = _DETAILS.get(code.co_name) if cls == _LIB else None
        return cls if detail is None else detail

    def hold(self, code: CodeType, cls: int) -> None:
        """``code``'s class, kept (a library function naming the path: its detail)."""
        detail = _DETAILS.get(code.co_name) if cls == _LIB else None
        self._held.append(code)
        self._codes[id(code)] = cls if detail is None else detail

    def record(self, kind: int, frame: FrameType | None, start: int, end: int, nbytes: int,
               detail: str | None = None) -> None:
        """One transfer seen at ``frame``: walks out to the user's frame (its code
        and offset kept, the line found when read) and appends it; nothing when
        another hook counts it (a numpy argument the ``jax.jit`` wrapper's
        report counted: :class:`JitArguments`)."""
        get = self._codes.get
        under_jit_counted = kind == IMPLICIT_H2D
        context = self.context
        other = context.step_thread and get_ident() != context.step_thread
        if kind == SYNC and not other:  # a read: the step's next call ends a gap (gaps.py)
            context.gap_owner = None
        found = via = inner = None
        code: CodeType | None  # (an annotation: no work on the hot path)
        f = frame
        while f is not None:  # one dict lookup per frame: this is the hot path
            code = f.f_code
            c = get(id(code))
            if c is None:
                c = self._classify(code)
            if c is _LIB:
                f = f.f_back
                continue
            if c == _THIRD:  # another library (flax's jit): its outermost frame is the via
                via, inner = code, inner or f
                f = f.f_back
                continue
            if c.__class__ is str:  # a library function that names the path
                found = c
            elif c == _USER:
                break
            elif c == _COUNTED:
                return
            elif c == _JIT_WRAPPER and under_jit_counted:
                # A numpy argument the wrapper counts, once it knows the
                # function takes them; the first (a C++ cache miss, which
                # runs this handler) it learns of here, counted here.
                owner = f.f_locals.get("owner")
                if owner is None or not self.jit_arguments.counted_in_handler(owner):
                    return
                kind, detail = UNTIMED_H2D, f"numpy argument of {owner.name}"
                start = end
                under_jit_counted = False  # the wrapper's outer frames: already decided
            elif c == _EXPLICIT:
                kind = EXPLICIT_D2H if kind == SYNC else EXPLICIT_H2D
            f = f.f_back
        else:  # no user frame: the innermost library frame, as the user's (if any)
            f, code, via = inner, inner.f_code if inner is not None else None, None
        if via is not None and f is not None and len(self._via) < MAX_CODES:
            self._via.setdefault((id(code), f.f_lasti), via)
        q, step = self.queue, None if other else context.step_owner
        q.extend((kind, code, f.f_lasti if f is not None else 0, detail or found, start, end,
                  nbytes, end if step is None else step.calls))
        if len(q) >= FOLD_AT * FIELDS:
            self.journal.flush()

    def host_arguments(self, nbytes: int, what: str) -> None:
        """Host arguments of ``nbytes`` in a jitted call (``what``: "numpy argument of jit(step)"):
        an untimed implicit host->device transfer at the user's line."""
        try:
            now = time.monotonic_ns()
            self.record(UNTIMED_H2D, sys._getframe(1), now, now, int(nbytes), what)
        except Exception as e:  # noqa: BLE001 - a hook never raises into the program
            self.rec.hook_failed("jax.host_arguments", e)

    # Fold and read -----------------------------------------------------------

    def _fold(self, flat: list[Any]) -> None:
        """Records (``FIELDS`` each) -> times, bytes, the implicit counters and
        the site table, grouped with numpy: no Python loop per record, only
        per distinct site (a tuple per record alone costs more)."""
        if self._fold_one_site(flat):
            return
        w = FIELDS
        n = len(flat) // w
        kinds = np.fromiter(flat[0::w], np.int64, n)
        ends = np.fromiter(flat[5::w], np.int64, n)
        durations = ends - np.fromiter(flat[4::w], np.int64, n)
        sizes = np.fromiter(flat[6::w], np.int64, n)
        for timed, moved, time_d, bytes_d in ((_H2D_TIMED, _H2D_ALL, self._h2d_time,
                                               self._outbound),
                                              (_D2H_ALL, _D2H_ALL, self._d2h_time, self._inbound)):
            for mask, dist in ((timed[kinds], time_d), (moved[kinds], bytes_d)):
                if mask.any():
                    dist.observe_many((durations if dist is time_d else sizes)[mask].tolist(),
                                      ends[mask].tolist())
        for implicit, count, total in ((_H2D_IMPLICIT, self._implicit_h2d, self._implicit_out),
                                       (_D2H_IMPLICIT, self._implicit_d2h, self._implicit_in)):
            mask = implicit[kinds]
            k = int(mask.sum())
            if k:
                count.inc(k)
                total.inc(int(sizes[mask].sum()))
        keep = _SITE_MASK[kinds]
        if not keep.any():
            return
        rows = np.flatnonzero(keep)
        both = np.empty((rows.size, 2), np.int64)  # (id(code), offset * 8 + kind) per record
        both[:, 0] = np.fromiter(map(id, flat[1::w]), np.int64, n)[rows]
        both[:, 1] = np.fromiter(flat[2::w], np.int64, n)[rows] * 8 + kinds[rows]
        first, inv = jax_sites.instruction_groups(both, lambda i: flat[w * int(rows[i]) + 1])
        m = first.size
        counts = np.bincount(inv, minlength=m).tolist()
        nbytes = np.bincount(inv, weights=sizes[rows], minlength=m).tolist()
        ns = np.bincount(inv, weights=durations[rows], minlength=m).tolist()
        last = np.zeros(m, np.int64)
        np.maximum.at(last, inv, ends[rows])
        earliest = np.full(m, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(earliest, inv, ends[rows])
        steps = grouped_steps(np.fromiter(flat[7::w], np.int64, n)[rows], inv, m)
        timed = kinds[rows] != UNTIMED_H2D  # (a site's records with a time, their bytes)
        n_timed = np.bincount(inv, weights=timed, minlength=m).astype(np.int64).tolist()
        t_bytes = np.bincount(inv, weights=sizes[rows] * timed, minlength=m).astype(np.int64)
        with self._lock:
            for i, j in enumerate(rows[first].tolist()):
                self._add_site(flat[w * j], flat[w * j + 1], flat[w * j + 2], flat[w * j + 3],
                               counts[i], int(nbytes[i]), int(ns[i]), int(last[i]),
                               int(earliest[i]), steps[i], (n_timed[i], int(t_bytes[i])))

    def _fold_one_site(self, flat: list[Any]) -> bool:
        """The usual batch (one kind of record, all from one line: a
        ``float(loss)`` per step) folded with list operations in C, no numpy
        grouping; False (nothing done) for any other batch."""
        w = FIELDS
        kinds, codes, offsets = flat[0::w], flat[1::w], flat[2::w]
        kind, code, offset = kinds[0], codes[0], offsets[0]
        n = len(kinds)
        if (kinds.count(kind) != n or offsets.count(offset) != n
                or not all(map(operator.is_, codes, itertools.repeat(code)))):
            return False
        ends, sizes = flat[5::w], flat[6::w]
        durations = list(map(operator.sub, ends, flat[4::w]))
        if _H2D_TIMED[kind]:
            self._h2d_time.observe_many(durations, ends)
        elif _D2H_ALL[kind]:
            self._d2h_time.observe_many(durations, ends)
        if _H2D_ALL[kind]:
            self._outbound.observe_many(sizes, ends)
        elif _D2H_ALL[kind]:
            self._inbound.observe_many(sizes, ends)
        moved = sum(sizes)
        if _H2D_IMPLICIT[kind]:
            self._implicit_h2d.inc(n)
            self._implicit_out.inc(moved)
        elif _D2H_IMPLICIT[kind]:
            self._implicit_d2h.inc(n)
            self._implicit_in.inc(moved)
        if _SITE_MASK[kind]:
            steps = flat[7::w]  # the steps they ran in (in order, so distinct: the runs)
            runs = 1 if steps[0] == steps[-1] else len(set(steps))
            with self._lock:
                self._add_site(kind, code, offset, flat[3], n, moved, sum(durations), max(ends),
                               min(ends), Steps(runs, steps[0], steps[-1]),
                               (0, 0) if kind == UNTIMED_H2D else (n, moved))
        return True

    def _add_site(self, kind: int, code: CodeType | None, offset: int, detail: str | None,
                  count: int, nbytes: int, ns: int, last_end: int, first_end: int,
                  steps: Steps | None = None, timed: tuple[int, int] = (0, 0)) -> _Site:
        """Adds one site's records of a batch (caller holds the lock), with
        the steps they ran in (``steps``: none for eager ops); the site."""
        kind = _SITE_KIND[kind]
        key = (kind, id(code), offset if code is None else jax_sites.call_instruction(code, offset))
        site = self._sites.get(key)
        if site is None:
            if self._per_kind[kind] < MAX_SITES_PER_KIND:
                self._per_kind[kind] += 1
                site = self._sites[key] = _Site(code, key[2], detail)
            else:
                site = self._other.get(kind)
                if site is None:
                    site = self._other[kind] = _Site(None, 0, OVERFLOW)
        if detail and site.detail and detail != site.detail and last_end >= site.last_end:
            site.detail = relabelled(site.detail, detail)  # the latest records' dtype
        site.count += count
        site.bytes += nbytes
        site.timed, site.timed_bytes = site.timed + timed[0], site.timed_bytes + timed[1]
        site.ns += ns
        site.last_end = max(site.last_end, last_end)
        if site.first_end is None or first_end < site.first_end:
            site.first_end = first_end
        if steps is not None:  # a batch that goes on in the site's last step: one less
            site.occurrences += steps.runs - (steps.first == site.last_step)
            if steps.last != last_end:  # step indices (with no step known, times: no span)
                site.first_step = steps.first if site.first_step < 0 else site.first_step
                site.last_step = steps.last
        return site

    # Read (metrics.engines.jax.sites) ---------------------------------------

    def via(self, code: CodeType | None, offset: int) -> str:
        """The library call (``flax nnx.jit``) the line went through, "" none (read time)."""
        lib = jax_sites.noted_at(self._via, code, offset) if code is not None else None
        return via_words(lib) if lib is not None else ""

    def sites(self) -> list[SiteReading]:
        """One reading per line (per kind), resolved now: :func:`~.sites.readings`."""
        return jax_sites.readings(self)

    def sync_lines(self) -> list[SyncLine]:
        """Device->host syncs per line, first and last time: :func:`~.sites.sync_lines`."""
        return jax_sites.sync_lines(self)

    def clear(self) -> None:
        """Forgets every site (the counters are the registry's)."""
        self.journal.clear()
        self.jit_arguments.forget()
        self.gaps.clear()
        for feeder in self.feeders:
            feeder.clear()
        with self._lock:
            self._sites.clear()
            self._other.clear()
            self._per_kind = dict.fromkeys(SITE_KINDS, 0)

    def blind_spots(self) -> list[str]:
        """What this hook cannot see in this process, one sentence each."""
        return jax_sites.blind_spots(self)


# The hooks (each runs inside the user's program: guarded) -------------------

def _value_property(original: property, impl: ImplicitTransfers) -> property:
    # Runs on every float(loss): what it reads is bound once (the code table,
    # the journal's list and its flush are the same objects for the hook's life).
    fget, clock, getframe, record = original.fget, time.monotonic_ns, sys._getframe, impl.record
    assert fget is not None
    get, queue, flush, user_class = impl._codes.get, impl.queue, impl.journal.flush, _USER
    extend, fold_at, context, ident = queue.extend, FOLD_AT * FIELDS, impl.context, get_ident

    def _value(self: ArrayImpl) -> Any:
        if self._npy_value is not None:  # the host copy is cached: nothing moves
            return fget(self)
        start = clock()
        out = fget(self)
        end = clock()
        try:
            # The usual read: float()/int()/bool()/print() (a library frame
            # that names the path) called from the user's line: two lookups,
            # no walk, no call. Anything else walks.
            f = getframe(1)
            detail = get(id(f.f_code))
            if detail.__class__ is str:
                # The step's next call ends a gap (gaps.py); a read on another
                # thread than the step's is in none (its step field: its end).
                step = context.step_owner  # the step function's calls: the read's step
                if (mine := context.step_thread) and ident() != mine:
                    step = None
                else:
                    context.gap_owner = None
                user = f.f_back
                if user is not None and get(id(code := user.f_code)) == user_class:
                    extend((SYNC, code, user.f_lasti, detail, start, end, out.nbytes,
                            end if step is None else step.calls))
                    if len(queue) >= fold_at:
                        flush()
                    return out
            record(SYNC, f, start, end, out.nbytes)
        except Exception as e:  # noqa: BLE001 - a hook never raises into the program
            impl.rec.hook_failed("jax.sync", e)
        return out

    _value.__wrapped__ = fget  # type: ignore[attr-defined]
    return property(_value, original.fset, original.fdel, original.__doc__)
