"""JAX's eager work between steps, per user line: the time the sampled
intervals of :mod:`metrics.engines.host_lines` spent under JAX's own code,
charged to the user's line that entered it.

A training step that is not one jitted function (``jax.value_and_grad`` of
a jitted loss taken outside jit, an optax update or ``nnx.Optimizer.update``
run eagerly, ``jax.random.split`` per step) spends its time in JAX's Python
(transforms, per-op dispatch, the backward pass it runs graph by graph) and
in many small unfused graphs: none of it is the user's host code, none of it
is the step's jitted call. The host-work intervals already time it as the
engine's; here each such stretch goes to the innermost user frame above the
JAX frame it ran in (the line that called ``value_and_grad``, ``update`` or
``split``), with the function that line entered (``jax value_and_grad``,
``optax update``): frames walked once and cached for the interval, so an
event costs a dictionary look-up or two.

Not charged: reads, waits and copies (a line that entered ``__float__``,
``__array__``, ``device_get``, ``block_until_ready``, ``jnp.asarray``...: the
sync and transfer sites measure them), the hook's own work (any stretch
under the counted jit wrapper's frames: the step's call's tail that began
the interval), and time
at the step's own line when the step was called from that line directly
(its call's tail); where JAX itself called the step (``value_and_grad`` of a
jitted loss: :attr:`EagerLines.transform`), the rest of that transform (the
backward pass) is the line's eager work.

Read out as ``eager_work`` readings (:meth:`EagerLines.sites`): ``seconds``
a line's median per interval times the intervals, ``timed`` the intervals,
``count`` those it had time in, ``detail`` the functions it entered.

Example:
    >>> e = EagerLines(lambda code: 0, ())
    >>> e.sites(0.0)
    []
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from types import CodeType, FrameType

from metrics.engines._frames import via_words
from metrics.engines.host_sites import KEEP, median_ns, where
from tpu_info.contract.model import Phase, SiteKind, SiteReading

MAX_LINES = 128  # lines kept (a new one past this is not)
MAX_DEPTH = 256  # frames walked up from a JAX frame to its user frame
MAX_ENTERED = 8  # functions kept per line
_USER = 0  # host_lines' kind of a user's code object
_WRAPPERS = frozenset({"reraise_with_filtered_traceback"})  # jax's api_boundary's
# What a line entered that reads a value to the host, waits for the device or
# copies host data to it: their time is those sites' (sync, transfers), not
# eager work (``float(loss)`` enters ``ArrayImpl.__float__``).
_READS = frozenset({
    "__float__", "__int__", "__index__", "__complex__", "__bool__", "tolist", "item", "_item",
    "__str__", "__repr__", "__format__", "__array__", "__reduce__", "__dlpack__", "device_get",
    "block_until_ready", "copy_to_host_async", "device_put", "asarray", "array"})


_Above = tuple[CodeType, int, "CodeType | None", "CodeType | None"]


class _Line:
    __slots__ = ("code", "line", "ns", "intervals", "recent", "entered")

    def __init__(self, code: CodeType, line: int) -> None:
        self.code, self.line, self.ns, self.intervals = code, line, 0, 0
        self.recent: deque[tuple[int, int]] = deque(maxlen=KEEP)  # (interval, ns)
        self.entered: dict[CodeType, int] = {}  # the functions the line entered: ns


class EagerLines:
    """Per user line, the JAX time of the sampled intervals (training thread
    only: host_lines' profile function calls :meth:`charge`)."""

    def __init__(self, kind: Callable[[CodeType], int], own: tuple[CodeType, ...]) -> None:
        self._kind = kind  # host_lines' HostLines._kind
        self._own = {id(c) for c in own}  # the jit wrapper's codes (held by the module)
        self.lines: dict[tuple[int, int], _Line] = {}
        self.intervals = 0
        self.first = self.last = 0
        self.transform = False  # this interval's step was called by JAX (a transform)
        self._at: tuple[int, int] | None = None
        # This interval: frame id -> (its code, hops to its user frame, the
        # user's code or None, the function entered); per (user code id, line,
        # entered code id) its ns; codes by id.
        self._above: dict[int, _Above] = {}
        self._acc: dict[tuple[int, int, int], int] = {}
        self._codes: dict[int, CodeType] = {}

    def begin(self, at: tuple[int, int], step_frames: FrameType | None) -> None:
        """An interval begins after the step's call at the user line ``at``;
        ``step_frames``: the frame that called the jit wrapper (JAX's, where
        a transform called the step)."""
        self._at = at
        self._above, self._acc, self._codes = {}, {}, {}
        f, transform = step_frames, False
        while f is not None:  # a frame of JAX's between the wrapper and ``at``'s
            if self._kind(f.f_code) == _USER:
                break
            if id(f.f_code) not in self._own and is_jax_file(f.f_code.co_filename):
                transform = True
                break
            f = f.f_back
        self.transform = transform

    def charge(self, frame: FrameType, ns: int) -> None:
        """``ns`` the profile saw under JAX's code at ``frame``."""
        if self._at is None:  # (host_lines' calibration, no interval's)
            return
        hit = self._above.get(id(frame))
        if hit is None or hit[0] is not frame.f_code:
            hit = self._find(frame)
        user = hit[2]
        if user is None:
            return
        u: FrameType | None = frame
        for _ in range(hit[1]):  # (a few hops: no frame is held between events)
            u = u.f_back if u is not None else None
        if u is None or u.f_code is not user:
            hit = self._find(frame, fresh=True)
            user, u = hit[2], frame
            if user is None:
                return
            for _ in range(hit[1]):
                u = u.f_back if u is not None else None
            if u is None:
                return
        at = (id(user), u.f_lineno)
        if at == self._at and not self.transform:
            return
        entered = hit[3]
        key = (at[0], at[1], id(entered) if entered is not None else 0)
        self._acc[key] = self._acc.get(key, 0) + ns

    def _find(self, frame: FrameType, fresh: bool = False) -> _Above:
        """``(code, hops, the user's code, the function it entered)`` of
        ``frame``: how many frames up its user frame is (the user's code None
        where its time is no line's), the frames walked cached for the
        interval by id, checked by their code (no frame is held: a frame
        keeps its locals, a step's arrays among them, alive)."""
        above, kind, own = self._above, self._kind, self._own
        walked: list[FrameType] = []
        f: FrameType | None = frame
        hops, user, entered = 0, None, None
        while f is not None and len(walked) < MAX_DEPTH:
            hit = None if fresh else above.get(id(f))
            if hit is not None and hit[0] is f.f_code:
                hops, user, entered = hit[1], hit[2], hit[3]
                break
            code = f.f_code
            if id(code) in own:  # under the jit wrapper: the hook's own work
                break
            if kind(code) == _USER:
                outer = next((w.f_code for w in reversed(walked)
                              if w.f_code.co_name not in _WRAPPERS), None)
                if outer is not None and outer.co_name in _READS:
                    break  # a read or a copy: its own sites measure it
                user = code
                self._codes[id(code)] = code
                for w in reversed(walked):  # the public function, past wrappers
                    c = w.f_code  # (JAX's traceback filter, a library's decorator)
                    name = c.co_qualname.split(".<locals>", 1)[0].rsplit(".", 1)[-1]
                    if c.co_name not in _WRAPPERS and not name.startswith("_"):
                        entered = c
                        break
                if entered is not None:
                    self._codes[id(entered)] = entered
                break
            walked.append(f)
            f = f.f_back
        n = len(walked)
        for i, w in enumerate(walked):
            above[id(w)] = (w.f_code, n - i + hops, user, entered)
        return (frame.f_code, n + hops, user, entered)

    def fold(self, start: int, now: int) -> None:
        """The interval (``start`` to ``now``, monotonic ns) ended: its lines
        into :attr:`lines`."""
        index = self.intervals
        per_line: dict[tuple[int, int], int] = {}
        for (code_id, line, entered_id), ns in self._acc.items():
            key = (code_id, line)
            row = self.lines.get(key)
            if row is None:
                if len(self.lines) >= MAX_LINES:
                    continue
                row = self.lines[key] = _Line(self._codes[code_id], line)
            per_line[key] = per_line.get(key, 0) + ns
            if entered_id:
                code = self._codes[entered_id]
                if code in row.entered or len(row.entered) < MAX_ENTERED:
                    row.entered[code] = row.entered.get(code, 0) + ns
        for key, ns in per_line.items():
            row = self.lines[key]
            row.ns += ns
            row.intervals += 1
            row.recent.append((index, ns))
        self._above, self._acc, self._codes = {}, {}, {}
        self._at = None
        if not self.first:
            self.first = start
        self.last = now
        self.intervals = index + 1

    def forget(self) -> None:
        self.lines.clear()
        self.intervals = self.first = self.last = 0

    def sites(self, mono_to_unix: float) -> list[SiteReading]:
        """An ``eager_work`` reading per line with JAX time in at least half
        the latest intervals (the module's docstring says what each holds)."""
        n = self.intervals
        rows = [(r.code, r.line, median_ns(list(r.recent), n), r.intervals, dict(r.entered))
                for r in list(self.lines.values())] if n else []
        out = []
        for code, line, median, intervals, entered in rows:
            if median <= 0:
                continue
            path, function = where(code)
            names = [via_words(c) for c, _ in sorted(entered.items(), key=lambda kv: -kv[1])]
            out.append(SiteReading(
                kind=SiteKind.EAGER_WORK.value, location=f"{path.rsplit(':', 1)[0]}:{line}",
                count=intervals, seconds=median * n / 1e9, function=function,
                detail=", ".join(dict.fromkeys(names[:3])),
                first_seen_unix=self.first / 1e9 + mono_to_unix,
                last_seen_unix=self.last / 1e9 + mono_to_unix, phase=Phase.STEP.value,
                occurrences=intervals, timed=n))
        return out


def is_jax_file(path: str) -> bool:
    """Whether ``path`` is in JAX's or jaxlib's package (a transform's frame)."""
    return f"{os.sep}jax{os.sep}" in path or f"{os.sep}jaxlib{os.sep}" in path
