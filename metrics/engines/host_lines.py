"""The training thread's own host work between steps, per user line: the
engine-agnostic part (JAX's :mod:`metrics.engines.jax.host_lines`, torch's
:mod:`metrics.engines.torch.host_lines` make one each).

Work the program does on the host between two calls of its step (a data
loader drawing each batch with ``np.random.choice`` and numpy indexing,
a Python loop over rows, a torch program building each example with
``torch.zeros`` and a loop over its letters) is invisible to every other
part of the hook: the steady step reads "other". Here it is measured and put
at the user's line (the innermost frame outside libraries, as
:mod:`metrics.engines._frames` decides by the import system; with ``loops``,
the line of the loop's own frame that called it: torch's).

How: a thread sampling ``sys._current_frames()`` cannot do it in CPython:
it needs the interpreter lock, which the training thread lets go of in JAX's
C++ dispatch of every step (a generator taking 66% of the host's time read
11%, a Python loop over rows nothing). So the training thread times its own
intervals, a few a second: after a timed call of the step (or of the library
wrapper around it: flax's ``nnx.jit``; torch's optimizer step or
``backward()``), ``sys.setprofile`` (this thread's only; never over a
profiler already set) is on until the loop's next call at the step's line,
then off. At each Python call and return and each C function's return the
time since the previous event goes to the innermost user frame's line, with
the C function or library call it was in; time under the engine's own code
(JAX, jaxlib, this hook; torch's ``work_codes``: a module's forward, a
backward, an optimizer's step, their own parts measure it) and the step's
call's own tail are kept apart. With ``loops`` the time goes on up to the
innermost frame of the step's own stack (held for the interval: the loop's)
and is that line's, the user function or library call it entered named
(``randomTrainingExample()``), and time under a work code anywhere below
that frame (a user ``forward`` inside ``nn.Module.__call__``) is the
engine's. An exception in the profile function ends the interval and is
counted, never raised.

Cost: only the sampled intervals pay it (~1-3 us an event); past the first
:data:`FIRST_INTERVALS` (:data:`SPACING_NS` apart) the next interval waits
:data:`OVERHEAD_RATIO` times the previous one's own cost, so the profile's
share of wall time stays under ``1 / OVERHEAD_RATIO`` (its whole cost, the
bytecode it slows included, 2-3 times that: ``bench/host_lines_cost.py``).
An interval is cut after :data:`MAX_EVENTS` events or :data:`MAX_NS`, and
ends at any counted ``jax.jit`` call (another function's begins a gap, whose
evaluation is its own work: host work after a jitted call before the step,
``augment(x)``, is not seen). Nothing runs in a forked child.

A numpy conversion's C call at a user line (``np.asarray(loss)``) in
``readers`` whose argument is a jax.Array (``resolver``: numpy reads it in
C, past every Python hook: :mod:`metrics.engines.jax.numpy_reads`) is a
read: its time to the C call's return is kept apart (:attr:`reads`). JAX's
time per user line: :attr:`eager` (:mod:`metrics.engines.jax.eager_lines`).

Read out (:func:`metrics.engines.host_sites.work_sites`) as
:class:`~tpu_info.contract.model.SiteReading` of kind ``host_work`` per
line: ``timed`` the sampled intervals, ``seconds`` the median of its time
per interval (the latest :data:`KEEP`; 0 where it had none) times
``timed``, ``count`` the intervals it had time in, ``detail`` the calls its time went into
(``RandomState.choice``), ``in_generator`` whether the line is a
generator's (a data loader).

Example:
    >>> lines = HostLines(LibraryFrames(()), ())             # doctest: +SKIP
    >>> lines.after_step(time.monotonic_ns(), step_calls)    # doctest: +SKIP
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Callable, Container
from types import CodeType, FrameType
from typing import Any

from metrics.engines._frames import LIBRARY, USER, LibraryFrames
from metrics.engines.host_sites import KEEP
from metrics.recording import forksafe

SPACING_NS = 20_000_000  # between the starts of two sampled intervals, at least
FIRST_INTERVALS = 16  # the first ones only that far apart (a figure stands on 8)
OVERHEAD_RATIO = 2000  # the later ones this many times the previous one's own cost
FIRST_CALLS = 32  # the step's calls before the first interval (its warm-up)
MAX_EVENTS = 20_000  # events in one interval: cut there
MAX_NS = 1_000_000_000  # an interval's length: cut there
MAX_LINES = 256  # lines kept (a new one past this is not)
MAX_CALLEES = 8  # calls kept per line
CALIBRATE_CALLS = 1000  # C calls timed bare and under the profile function, once

# What the time at an event was spent in (per code object, decided once).
_USER, _ENGINE, _LIBRARY, _OTHER = 0, 1, 2, 3


class _Line:
    __slots__ = ("code", "line", "ns", "intervals", "recent", "callees")

    def __init__(self, code: CodeType, line: int) -> None:
        self.code, self.line = code, line
        self.ns = 0
        self.intervals = 0  # the intervals it had time in
        self.recent: deque[tuple[int, int]] = deque(maxlen=KEEP)  # (interval, ns)
        # What its time went into: a C function's name, or the library
        # function entered from it (its code object: in words at read time).
        self.callees: dict[str | CodeType, int] = {}


class _Read:  # a line's reads of a jax.Array through numpy (numpy_reads.py)
    __slots__ = ("code", "line", "what", "ns", "reads", "bytes", "intervals", "recent")

    def __init__(self, code: CodeType, line: int, what: str) -> None:
        self.code, self.line, self.what, self.ns, self.reads = code, line, what, 0, 0
        self.bytes = self.intervals = 0
        self.recent: deque[tuple[int, int]] = deque(maxlen=KEEP)  # (interval, ns)


class HostLines:
    """Sampled intervals between the step's calls, per user line. Code
    objects are keyed by ``id`` (a code object's hash reads its contents) and
    held where keyed, so an id is never another's."""

    def __init__(self, frames: LibraryFrames, engine_dirs: tuple[str, ...],
                 call_code: CodeType | None = None,
                 clock: Callable[[], int] = time.monotonic_ns,
                 on_error: Callable[[str, BaseException], None] | None = None,
                 readers: Container[Any] = (), resolver: Any = None,
                 work_codes: tuple[CodeType, ...] = (), loops: bool = False) -> None:
        self.frames = frames
        # Held here: at the interpreter's exit an open interval's events still
        # come while the module's globals are gone (sys is None there).
        self._setprofile = sys.setprofile
        # Code whose time is the engine's wherever it runs (torch: a module's
        # forward, a backward, an optimizer's step), held by id.
        self._work = {id(c): c for c in work_codes}
        # Time goes up to the step's stack's innermost frame (the loop's line).
        self.loops = loops
        self._anchors: tuple[FrameType, ...] = ()  # that stack's user frames, this interval
        # The lines that called a work code (``loss = model(x).pow(2).mean()``):
        # the rest of their time is the model's too (the code held by its id).
        self._model_lines: dict[tuple[int, int], CodeType] = {}
        self.on_error = on_error  # an exception in the profile function: counted
        # The jax.jit wrapper's code: a counted call ends an interval (the
        # step's, or another function's: a gap's evaluation is its own work).
        self.call_code = call_code
        self.engine_dirs = engine_dirs  # JAX's, jaxlib's and this hook's directories
        self.clock = clock
        self.enabled = True
        self.lines: dict[tuple[int, int], _Line] = {}
        # numpy's reads of a jax.Array at a user line (numpy_reads.py): their waits.
        self.reads: dict[tuple[int, int], _Read] = {}
        # The latest intervals' wall time (the profile's own left out): a
        # line's share of each (host_sites.py).
        self.lengths: deque[tuple[int, int]] = deque(maxlen=KEEP)  # (interval, ns)
        self._readers = readers
        self._resolver = resolver
        # The read in progress: (the caller's frame, the C function, its
        # line's key, bytes), its ns so far; and this interval's reads per
        # line key: [ns, reads, bytes, what].
        self._reading: tuple[FrameType, Any, tuple[int, int], int] | None = None
        self._read_ns = 0
        self._iread: dict[tuple[int, int], list[Any]] = {}
        self.intervals = 0  # sampled intervals ended
        self.cut = 0  # of them, cut (MAX_EVENTS, MAX_NS)
        self.interval_ns = 0  # their wall time, less the profile's own
        self.engine_ns = 0  # under the engine's own code
        self.step_ns = self.own_ns = 0  # at the step's line (its call's tail); the profile's
        self.first = self.last = 0  # monotonic ns of the first and latest interval
        self._kinds: dict[int, tuple[CodeType, int]] = {}
        self._next = 0
        self.eager: Any = None  # JAX's EagerLines: its code's time per user line
        # The interval in progress: the step's line (id of its code, line),
        # its start, the previous event's end, events so far, its own ns, ns
        # under the engine and at the step's line, and per (code id, line)
        # and per ((code id, line), callee) its ns; the code objects by id.
        self._at: tuple[int, int] | None = None
        self._start = self._prev = self._events = self._own = 0
        self._engine = self._step = 0
        self._begun = self._own_after = 0  # ns: an interval's start, the previous one's end
        self._acc: dict[Any, int] = {}
        self._codes: dict[int, CodeType] = {}
        # ns an event costs outside the profile function's clock reads (the
        # interpreter's call of it): each event's time less it; -1: not yet
        # measured (before the first interval, once).
        self._leak = -1
        forksafe.in_child(self._in_child)

    @property
    def due_ns(self) -> int:
        """Monotonic ns before which no interval begins (a step's compare)."""
        return self._next

    def _in_child(self) -> None:
        self.enabled = False  # the parent's; a child's interval ends at its first event

    def forget(self) -> None:
        self.lines.clear()
        self.reads.clear()
        self.lengths.clear()
        self.intervals = self.cut = 0
        self.interval_ns = self.engine_ns = self.step_ns = self.own_ns = 0
        self.first = self.last = 0

    # Training thread -----------------------------------------------------------

    def after_step(self, now: int, calls: int) -> None:
        """A timed call of the step (or its library wrapper's) ends at ``now``
        (monotonic ns), its ``calls``-th: when one is due, an interval starts,
        to the loop's next call at the user's line that made this one (the
        caller's stack)."""
        if now < self._next or calls <= FIRST_CALLS or not self.enabled or self._at is not None:
            return
        if sys.getprofile() is not None:  # a profiler (or another interval) is on
            self._next = now + SPACING_NS
            return
        f: FrameType | None = sys._getframe(1)
        kind = self._kind
        while f is not None and kind(f.f_code) != _USER:
            f = f.f_back
        if f is None:
            self._next = self.clock() + SPACING_NS
            return
        if self._leak < 0:
            self._leak = self._call_cost()
        t0 = self.clock()
        self._begin((id(f.f_code), f.f_lineno))
        self._codes[id(f.f_code)] = f.f_code
        if self.loops:  # the step's stack's user frames: where a line's time stops
            up: list[FrameType] = []
            g: FrameType | None = f
            while g is not None and len(up) < 64:
                if kind(g.f_code) == _USER:
                    up.append(g)
                g = g.f_back
            self._anchors = tuple(up)
        if self.eager is not None:
            self.eager.begin(self._at, sys._getframe(1))
        self._begun = self._start - t0
        sys.setprofile(self._event)

    def _begin(self, at: tuple[int, int]) -> None:
        self._at = at
        self._events = self._own = self._engine = self._step = 0
        self._acc, self._codes = {}, {}
        self._reading, self._read_ns, self._iread = None, 0, {}
        self._start = self._prev = self.clock()

    def _event(self, frame: FrameType, event: str, arg: Any) -> None:
        try:
            read = 0
            clock = self.clock
            if event == "c_call":  # its time before goes with the C call's, at the same line
                if (self._reading is not None or arg not in self._readers
                        or self._kind(frame.f_code) != _USER):
                    return
                now = clock()
                read = self._resolver.jax_read(frame, arg)  # a jax.Array's buffer: a read
                if not read:  # (its look the profile's own time, no line's)
                    spent = clock() - now
                    self._prev += spent
                    self._own += spent
                    return
            else:
                now = clock()
            at = self._at
            if at is None or not self.enabled:
                self._setprofile(None)
                self._at = None
                return
            dt = now - self._prev - self._leak
            if dt < 0:
                dt = 0
            self._events += 1
            if self._reading is not None:  # all of it the read's wait, to its C call's return
                self._read_ns += dt
                reading = self._reading
                if event != "call" and event != "return" and arg is reading[1] and (
                        frame is reading[0]):
                    self._reading = None
                    got = self._iread.setdefault(reading[2], [0, 0, 0, reading[1]])
                    got[0], got[1], got[2] = got[0] + self._read_ns, got[1] + 1, got[2] + reading[3]
                if self._events >= MAX_EVENTS or now - self._start >= MAX_NS:
                    self._end(now, 0, cut=True)
                    return
                self._prev = clock()
                self._own += self._prev - now
                return
            kinds = self._kinds
            f: FrameType | None = frame
            if event == "call":
                back = frame.f_back
                if (frame.f_code is self.call_code  # a counted jitted call: a gap's, or the step's
                        or back is not None and id(back.f_code) == at[0]
                        and back.f_lineno == at[1] and self._kind(frame.f_code) != _USER):
                    self._end(now, dt, cut=False)  # the next step's call
                    return
                f = back
                if (self.loops and back is not None and id(frame.f_code) in self._work
                        and len(self._model_lines) < MAX_LINES):  # the line ran the model
                    self._model_lines[(id(back.f_code), back.f_lineno)] = back.f_code
            # ``dt`` ns to where ``f`` (the frame the time ran in) was.
            via: CodeType | None = None
            inner = f
            while f is not None:
                c = f.f_code
                hit = kinds.get(id(c))
                k = hit[1] if hit is not None and hit[0] is c else self._kind(c)
                if k == _USER:
                    break
                if k == _ENGINE:
                    if self.eager is not None:  # (JAX: its time per user line)
                        self.eager.charge(f, dt)
                    f = None
                    break
                if k == _LIBRARY:
                    via = c
                f = f.f_back
            if f is None:  # under the engine's code (or no user frame: not the loop's)
                self._engine += dt
            else:
                code = f.f_code
                key = (id(code), f.f_lineno)
                entered: Any = None  # (loops) what the loop's line called
                if self.loops and key != at:
                    if key in self._model_lines:  # (its loss ops on the output: the model's)
                        f = None
                    elif f not in self._anchors:
                        f, entered = self._loop_frame(f)
                        if f is not None:
                            code = f.f_code
                            key = (id(code), f.f_lineno)
                if f is None:  # under a work code below the loop's frame (a forward)
                    self._engine += dt
                elif key == at or (self.loops and key[0] == at[0] and key[1] > at[1]):
                    # (the step's own function after its call: an update by hand,
                    # charrnn's p.data.add_ after backward(), its logging)
                    self._step += dt
                else:
                    acc = self._acc
                    had = acc.get(key)
                    if had is None:
                        self._codes[key[0]] = code
                        had = 0
                    acc[key] = had + dt
                    callee: Any = entered
                    if entered is not None:
                        if not isinstance(entered, str):
                            self._codes[id(entered)] = entered
                            callee = id(entered)
                    elif event == "c_return" and inner is f:  # a bound method is new each call
                        callee = getattr(arg, "__qualname__", None) or "a C function"
                    elif via is not None:
                        callee = id(via)
                        self._codes[callee] = via
                    if callee is not None:
                        ck = (key, callee)
                        acc[ck] = acc.get(ck, 0) + dt
                    if read:  # the C call's time on is the read's (and the look at its
                        # argument, where that was not ready: the host waited anyway)
                        self._reading = (frame, arg, key, read)
                        self._read_ns = -now if self._resolver.waiting else 0
                        self._codes[key[0]] = code
            if self._events >= MAX_EVENTS or now - self._start >= MAX_NS:
                self._end(now, 0, cut=True)
                return
            self._prev = clock()
            self._own += self._prev - now
            if self._read_ns < 0:  # (the look at the read's argument: the read's)
                self._read_ns += self._prev
        except Exception as e:  # never into the program: the interval ends, counted
            self._setprofile(None)
            self._at = self._reading = None
            self._anchors = ()
            if self.on_error is not None:
                self.on_error("host_lines", e)  # a signal handler's exception: raised again

    def _loop_frame(self, f: FrameType) -> tuple[FrameType | None, Any]:
        """The loop's frame above the user frame ``f`` (the innermost of the
        step's stack, :attr:`_anchors`) and what its line called: a library's
        code, else the function's name (``randomTrainingExample()``);
        ``(None, None)`` where a frame between is the engine's (a work code:
        the model's forward); ``f`` itself where no frame above is the loop's."""
        anchors, kind = self._anchors, self._kind
        child, g = f, f.f_back
        while g is not None:
            if g in anchors:
                c = child.f_code
                if kind(c) == _LIBRARY:
                    return g, c
                return g, getattr(c, "co_qualname", c.co_name) + "()"
            if kind(g.f_code) == _ENGINE:
                return None, None
            child, g = g, g.f_back
        return f, None

    def _end(self, now: int, dt: int, cut: bool) -> None:
        """The interval's end: its lines into :attr:`lines` (once an interval);
        its own time counted as the profile's."""
        self._setprofile(None)
        try:
            self._fold(now, dt, cut)
        finally:
            self._own_after = self.clock() - now

    def _fold(self, now: int, dt: int, cut: bool) -> None:
        self._at = None
        self._anchors = ()  # (frames held for the interval only)
        own = self._own + self._events * self._leak
        acc, codes = self._acc, self._codes
        lines = self.lines
        for key, ns in acc.items():
            if isinstance(key[1], int) and not isinstance(key[0], tuple):  # a line
                row = lines.get(key)
                if row is None:
                    if len(lines) >= MAX_LINES:
                        continue
                    row = lines[key] = _Line(codes[key[0]], key[1])
                row.ns += ns
                row.intervals += 1
                row.recent.append((self.intervals, ns))
        for key, ns in acc.items():
            if isinstance(key[0], tuple):  # (line, callee)
                row = lines.get(key[0])
                callee = codes[key[1]] if isinstance(key[1], int) else key[1]
                if row is not None and (callee in row.callees
                                        or len(row.callees) < MAX_CALLEES):
                    row.callees[callee] = row.callees.get(callee, 0) + ns
        for key, (ns, n, nbytes, fn) in self._iread.items():
            got = self.reads.get(key)
            if got is None:
                if len(self.reads) >= MAX_LINES:
                    continue
                got = self.reads[key] = _Read(codes[key[0]], key[1],
                                              f"np.{getattr(fn, '__name__', 'asarray')}()")
            got.ns, got.reads, got.bytes = got.ns + ns, got.reads + n, got.bytes + nbytes
            got.intervals += 1
            got.recent.append((self.intervals, ns))
        self._reading, self._iread = None, {}
        self.lengths.append((self.intervals, max(1, now - self._start - own)))
        self.engine_ns += self._engine
        if self.eager is not None:
            self.eager.fold(self._start, now)
        self.step_ns += self._step + dt
        self.cut += cut
        self.interval_ns += max(0, now - self._start - own)
        self.own_ns += own + self._begun
        if not self.first:
            self.first = self._start
        self.last = now
        self.intervals += 1  # (last: a reader takes the lines of the intervals counted)
        self._acc, self._codes = {}, {}
        own += self._own_after  # the previous interval's end and this one's start
        self.own_ns += self._own_after
        later = self.intervals > FIRST_INTERVALS
        self._next = now + max(SPACING_NS, OVERHEAD_RATIO * own if later else 0)

    def _call_cost(self) -> int:
        """ns an event costs outside this profile function's clock reads (the
        interpreter's call of it, its frame): :data:`CALIBRATE_CALLS` C calls
        timed bare and under :meth:`_event` (in an interval of no line's),
        less what its clock reads saw of its own time; measured once."""
        clock = self.clock

        def timed() -> int:
            f, n = len, CALIBRATE_CALLS
            t0 = clock()
            for _ in range(n):
                f(())
            return clock() - t0

        bare = min(timed(), timed())
        best = None
        self._leak = 0
        for _ in range(2):
            self._begin((id(_empty.__code__), -1))
            sys.setprofile(self._event)
            try:
                wall = timed()
            finally:
                sys.setprofile(None)
            per = (wall - bare - self._own) // max(1, self._events)
            best = per if best is None else min(best, per)
        self._at = None
        self._acc, self._codes = {}, {}
        return max(0, best or 0)

    def _kind(self, code: CodeType) -> int:
        hit = self._kinds.get(id(code))
        if hit is not None and hit[0] is code:
            return hit[1]
        fn = code.co_filename
        path = fn if fn.startswith("<") or os.path.isabs(fn) else os.path.abspath(fn)
        if id(code) in self._work or path.startswith(self.engine_dirs):
            k = _ENGINE
        else:
            kind = self.frames.kind(fn)
            k = _USER if kind == USER else _LIBRARY if kind == LIBRARY else _OTHER
        if len(self._kinds) < 1 << 16:
            self._kinds[id(code)] = (code, k)
        return k


def _empty() -> None:  # (its code: the line no interval's calibration is at)
    return None
