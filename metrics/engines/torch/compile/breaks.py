"""torch.compile graph breaks: what they are called, what they said, and
what they cost.

* Names: after a break Dynamo compiles the rest of a function as a *resume
  function* with the original's file and a name that says where it resumes
  (``Net.torch_dynamo_resume_in_forward_at_56``); its graphs are named
  ``compile(Net.forward@56)``, the rest of ``Net.forward`` from line 56, so
  readers can tell the parts of one function apart and put them together.
* A break Dynamo resumes from: the Python run between two compiled graphs
  of one function (the end of one graph's call to the start of the next
  part's call, paired when the calls are folded: nothing on the hot path)
  is measured per break line (:class:`BreakGaps`), reported as ``graph_break``
  sites.
* A break Dynamo cannot resume from: either it gives up on the whole frame
  ("falling back to eager"), or it compiles the frame up to that line and
  runs the rest of it in Python ("cannot resume from ..., skipping the rest
  of the function": :data:`UNRESUMABLE_REST`). The calls of what
  ``torch.compile`` returned (the innermost such call on the stack when
  Dynamo gave up: a module, or a function that calls it) are timed from then
  on, and the part of each call outside compiled graphs goes to
  ``EagerFallbackTime`` (:func:`time_compiled`): from the end of the frame's
  compiled part to the next compiled graph or the call's end, or, with no
  compiled part, the call's time less the compiled graphs run inside it. The
  event keeps Dynamo's hints after the marker.

Private names used (each read with ``getattr``; a missing one loses the
break's line or its measured time, never the program): the graph-break
exception's ``real_stack`` (else ``torch._guards.TracingContext``), the
translator's ``output.root_tx`` with its ``f_code``, ``lineno`` and
``closure``, and Dynamo's resume-function naming
(``torch_dynamo_resume_in_<fn>_at_<line>``, torch 2.x).

Example:
    >>> display_name("Net.torch_dynamo_resume_in_forward_at_56")
    'compile(Net.forward@56)'
    >>> resumed("Net.torch_dynamo_resume_in_forward_at_56")
    ('Net.forward', 56)
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
import re
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from metrics.engines._frames import user_location
from tpu_info.contract.model import UNRESUMABLE, UNRESUMABLE_REST, SiteKind, SiteReading

# UNRESUMABLE, UNRESUMABLE_REST (the contract's): the markers of an unresumable
# break in its graph_break event's detail, which the findings read.
_RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<fn>.+)_at_(?P<line>\d+)$")
_EXPLANATION = re.compile(r"Explanation:\s*(?P<text>.+)")
_HINT = re.compile(r"^\s*Hint:\s*(?P<text>.+)$", re.MULTILINE)
_FALLS_BACK = "falling back to eager"  # Dynamo's words when it gives up on the whole frame
_CANNOT_RESUME = "cannot resume from"  # ... when it compiles up to the break, skips the rest
_KEEP_COMPILES = 256  # recent compile times kept to tell a compile from a gap
_BREAK_KEY = operator.attrgetter("break_key")
GAP_DETAIL = "Python between compiled graphs (a graph break Dynamo resumes from)"

# A function's identity across its parts: (file, the user's qualname).
Function = tuple[str, str]


def resumed(qualname: str) -> tuple[str, int] | None:
    """A resume function's qualname -> (the function it resumes, the line it
    resumes at); None for any other code."""
    head, _, last = qualname.rpartition(".")
    m = _RESUME.match(last)
    if m is None:
        return None
    fn = m.group("fn")
    return (f"{head}.{fn}" if head else fn), int(m.group("line"))


def display_name(qualname: str) -> str:
    """``compile(Net.forward)``; Dynamo's resume functions after a graph
    break become ``compile(Net.forward@56)`` (the rest of it from line 56)."""
    r = resumed(qualname)
    return f"compile({r[0]}@{r[1]})" if r else f"compile({qualname})"


def function_of(code: Any) -> tuple[Function, int | None]:
    """The user's function a code object compiles part of, and the line it
    resumes at (None: the function's own start)."""
    qualname = getattr(code, "co_qualname", code.co_name)
    r = resumed(qualname)
    if r is None:
        return (code.co_filename, qualname), None
    return (code.co_filename, r[0]), r[1]


def break_detail(reason: Any, exc: Any) -> tuple[str, str]:
    """A break's detail (``Tensor.item() ...: explanation``) and, when Dynamo
    cannot resume from it, its marker (:data:`UNRESUMABLE`: the whole frame
    runs eagerly; :data:`UNRESUMABLE_REST`: the frame after the break), else
    ""; an unresumable break's detail carries Dynamo's hints."""
    text = str(exc) if exc is not None else str(reason)
    kind = getattr(exc, "gb_type", None)
    expl = _EXPLANATION.search(text)
    if kind and expl:
        detail = f"{kind}: {expl.group('text').strip()}"
    else:
        detail = kind or next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    said = str(reason)
    if _FALLS_BACK in said:
        marker = UNRESUMABLE
    elif _CANNOT_RESUME in said:
        marker = UNRESUMABLE_REST
    else:
        return detail, ""
    hints = [h.strip() for h in _HINT.findall(text) if "report an issue" not in h]
    return " ".join([detail, marker, *(f"Hint: {h}" for h in hints)]), marker



def call_site(function: Function, resume_line: int | None,
              skip: tuple[str, ...]) -> str | None:
    """The user's line that called the frame Dynamo is compiling (called
    from the compile hook: three frames below Dynamo). A resume function
    (the rest of ``function`` after a graph break, ``resume_line`` set) is
    called from ``function`` itself: its call site is that function's
    caller, the line that passed the arguments whose guards failed."""
    if resume_line is None:
        return user_location(skip, 4)
    name = function[1].rsplit(".", 1)[-1]
    try:
        f: Any = sys._getframe(3)
    except ValueError:
        return None
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(skip) and not fn.startswith("<") and not (
                f.f_code.co_name == name or resumed(f.f_code.co_name)):
            return f"{fn}:{f.f_lineno}"
        f = f.f_back
    return None

def break_location(exc: Any, skip: tuple[str, ...]) -> str | None:
    """The user's line of a break: the innermost frame of the user's own code
    in Dynamo's stack (a compiled torch.nn module breaks inside torch: its
    user line is where it is called)."""
    stack = getattr(exc, "real_stack", None)
    if not stack:
        stack = torch._guards.TracingContext.extract_stack()
    frame = next((f for f in reversed(stack or []) if not str(f.filename).startswith(skip)),
                 None)
    if frame is not None:
        return f"{frame.filename}:{frame.lineno}"
    # The whole compiled frame is torch's: the user's line calls it.
    return user_location(skip, 3) or (f"{stack[-1].filename}:{stack[-1].lineno}"
                                      if stack else None)


def break_name(tx: Any, skip: tuple[str, ...]) -> str:
    """The graph name of the frame that broke; a module compiled through
    torch's ``wrap_inline`` frame is named by its class (``LSTM.forward``)."""
    code = getattr(tx, "f_code", None)
    qualname = getattr(code, "co_qualname", getattr(code, "co_name", "?"))
    modules = wrapped_modules(tx)
    if modules and str(getattr(code, "co_filename", "")).startswith(skip):
        qualname = f"{type(modules[0]).__name__}.forward"
    return display_name(qualname)


class BreakGaps:
    """Python time across resumable breaks: a call of a resume part that
    directly follows a call of another part of the same function (nothing
    compiled ran in between) is a crossing of the break before that part,
    and the gap between the two calls its time. A gap in which Dynamo
    compiled (the first call, a recompile) is counted but not timed: the
    break's time is its untimed crossings at the mean of the timed ones.
    Graphs need ``function`` (:data:`Function`) and ``break_key``
    (``(function, resume line)`` for a resume part, else None)."""

    def __init__(self) -> None:
        self._last: tuple[Any, int] = (None, 0)  # the previous batch's last call
        self._gaps: dict[tuple[Function, int], list[int]] = {}  # -> [count, timed, ns]
        self._compiles: list[int] = []  # when Dynamo finished compiling (monotonic ns)
        self._seen: dict[tuple[Function, int], float] = {}  # -> last seen (unix)
        self._where: dict[tuple[Function, int], tuple[str, str]] = {}  # -> (location, name)

    def located(self, function: Function, line: int, location: str | None, name: str) -> None:
        """Where the break before ``function``'s part at ``line`` is in the
        user's code (the graph_break event's line)."""
        self._where[(function, line)] = (location or f"{function[0]}:{line}", name)

    def compiled(self, now_ns: int) -> None:
        """Dynamo finished a compile at ``now_ns`` (``time.monotonic_ns``)."""
        times = self._compiles
        times.append(now_ns)
        if len(times) > 2 * _KEEP_COMPILES:
            del times[:-_KEEP_COMPILES]

    def fold(self, graphs: list[Any], starts: list[int], ends: list[int]) -> None:
        """Calls in the order they ended (``graph``, ``start``, ``end`` in ns)."""
        last, last_end = self._last
        self._last = (graphs[-1], ends[-1]) if graphs else self._last
        keys = list(map(_BREAK_KEY, graphs))  # in C: only resume parts are looked at
        gaps, compiles = self._gaps, self._compiles
        crossed = False
        for i in itertools.compress(range(len(keys)), keys):
            prev, prev_end = (graphs[i - 1], ends[i - 1]) if i else (last, last_end)
            key = keys[i]
            if prev is None or prev.function != key[0]:
                continue  # another function's graph ran in between
            acc = gaps.get(key)
            if acc is None:
                acc = gaps[key] = [0, 0, 0]
            acc[0] += 1
            crossed = True
            start = starts[i]
            if compiles and compiles[-1] > prev_end:  # a compile since: in this gap?
                j = bisect.bisect_right(compiles, prev_end)
                if compiles[j] < start:
                    continue
            acc[1] += 1
            acc[2] += max(0, start - prev_end)
        if crossed:
            now = time.time()
            for key in gaps:
                self._seen[key] = now

    def sites(self) -> list[SiteReading]:
        out = []
        for key, (count, timed, ns) in list(self._gaps.items()):
            if not timed:
                continue
            (file, qualname), line = key
            location, name = self._where.get(key, (f"{file}:{line}", f"compile({qualname})"))
            out.append(SiteReading(kind=SiteKind.GRAPH_BREAK.value, location=location,
                                   count=count, seconds=ns / 1e9 / timed * count, function=name,
                                   detail=GAP_DETAIL, last_seen_unix=self._seen.get(key, 0.0)))
        return out

    def clear(self) -> None:
        self._last = (None, 0)
        self._gaps.clear()
        self._seen.clear()
        self._compiles.clear()


# Eager fallback: what torch.compile returned, timed once Dynamo gave up on
# its frame. Module state, set by the active engine (watch / unwatch).
_eager_codes: set[Any] = set()  # keys of timed calls (code objects) to time from now on
_partial_codes: set[Any] = set()  # frames compiled up to a break, the rest run eagerly
_eager_time: Any = None  # the engine's EagerFallbackTime distribution while installed
_calls: list[Any] = []  # the engine's calls queue: (graph, start, end) per compiled call
_failed: Callable[[str, BaseException], None] | None = None


def watch(eager_time: Any, failed: Callable[[str, BaseException], None],
          calls: list[Any] | None = None) -> None:
    """Timed calls go to ``eager_time``, less the compiled graphs' calls
    appended to ``calls`` (the engine's calls queue) meanwhile; a wrapping
    that fails is ``failed``."""
    global _eager_time, _failed, _calls
    _eager_time, _failed = eager_time, failed
    _calls = calls if calls is not None else []


def unwatch() -> None:
    global _eager_time, _failed, _calls
    _eager_time = _failed = None
    _calls = []


def gave_up_on(root: Any, rest_only: bool = False) -> None:
    """Dynamo runs ``root``'s frame eagerly from now on (``rest_only``: the
    part after the break, the part before is a compiled graph): time the
    calls of the innermost ``torch.compile`` result on the stack (the frame
    may be a module called by a compiled function), else ``root``'s own (and,
    for a module compiled through Dynamo's ``wrap_inline``, the module's)."""
    code = getattr(root, "f_code", None)
    if code is not None:
        _eager_codes.add(code)
        if rest_only:
            _partial_codes.add(code)
    _eager_codes.update(_wrapped_module_codes(root))
    f: Any = sys._getframe(1)
    while f is not None:
        if f.f_code is _TIMED_CODE:  # a timed wrapper: its key is its closure's ``code``
            key = f.f_locals.get("code")
            if key is not None:
                _eager_codes.add(key)
            break
        f = f.f_back


def is_partial(code: Any) -> bool:
    """Dynamo compiled ``code``'s frame up to an unresumable break: its graph
    is the compiled part, the rest runs eagerly after it."""
    return code in _partial_codes


def wrapped_modules(tx: Any) -> list[Any]:
    """The torch.nn modules a frame closes over: a module compiled through
    Dynamo's ``wrap_inline`` frame (``torch.compile(nn.LSTM(...))``)."""
    out = []
    for cell in getattr(tx, "closure", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, torch.nn.Module):
            out.append(value)
    return out


def _wrapped_module_codes(root: Any) -> list[Any]:
    """The ``forward`` code of the modules behind a ``wrap_inline`` frame: the
    frame Dynamo gave up on is that shared wrapper, the calls to time are the
    module's."""
    codes = (getattr(type(m).forward, "__code__", None) for m in wrapped_modules(root))
    return [c for c in codes if c is not None]


def time_decorated(decorate: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile(backend=...)`` used as a decorator factory: what it
    decorates is timed like :func:`time_compiled`."""
    @functools.wraps(decorate)
    def decorator(model: Any) -> Any:
        return time_compiled(model, decorate(model))

    return decorator


def time_compiled(model: Any, compiled: Any) -> Any:
    """``compiled`` with its calls timed once Dynamo gave up on ``model``'s
    frame; untouched when that cannot be done safely."""
    try:
        if getattr(compiled, "__code__", None) is _TIMED_CODE:
            return compiled  # torch.compile(backend=...)(f) calls torch.compile(f) again
        if isinstance(model, torch.nn.Module):
            code = getattr(getattr(type(model), "forward", None), "__code__", None)
            forward = getattr(compiled, "forward", None)
            if code is not None and forward is not None and "forward" in vars(compiled):
                compiled.forward = _timed(forward, code)
            return compiled
        code = getattr(model, "__code__", None)
        return _timed(compiled, code) if code is not None and callable(compiled) else compiled
    except Exception as e:  # noqa: BLE001
        if _failed is not None:
            _failed("torch_compile.time", e)
        return compiled


def _timed(fn: Callable[..., Any], code: Any) -> Callable[..., Any]:
    clock = time.monotonic_ns
    compiling = torch.compiler.is_compiling

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        # Cheapest first: a frame Dynamo compiled (the usual one) is not in
        # _eager_codes, and is_compiling() is a Python call.
        if code not in _eager_codes or _eager_time is None or compiling():
            return fn(*args, **kwargs)
        calls = _calls
        n = len(calls)
        start = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            end = clock()
            dist = _eager_time
            if dist is not None:
                # Folded meanwhile (the queue shrank): the records since then.
                inside = calls[n:] if len(calls) >= n else calls[:]
                dist.observe(outside_graphs(inside, start, end))

    return timed


_TIMED_CODE = _timed(lambda: None, None).__code__  # every timed wrapper's code


def outside_graphs(calls: list[Any], start: int, end: int) -> int:
    """The ns of a timed call (``start``..``end``) run eagerly, given the
    compiled graphs' calls inside it (``(graph, start, end)`` flat): after
    a frame's compiled part (a graph whose code :func:`is_partial`), up to
    the next graph's start or the call's end; with no such part, the
    call's time less the graphs' time."""
    graphs, starts, ends = calls[0::3], calls[1::3], calls[2::3]
    if not graphs:
        return end - start
    rest, partial = 0, False
    for i, g in enumerate(graphs):
        if getattr(g, "partial", False):
            partial = True
            rest += max(0, (starts[i + 1] if i + 1 < len(graphs) else end) - ends[i])
    if partial:
        return rest
    return max(0, end - start - (sum(ends) - sum(starts)))
