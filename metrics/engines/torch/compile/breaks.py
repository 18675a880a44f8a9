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
  of the function": :data:`UNRESUMABLE_REST`); the event keeps Dynamo's
  hints after the marker, and the time the program then runs in Python is
  :mod:`metrics.engines.torch.compile.eager`'s.

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
import itertools
import operator
import re
import sys
import time
from collections.abc import Sequence
from types import CodeType, FrameType
from typing import Protocol

import torch

from metrics.engines._frames import user_location
from tpu_info.contract.diagnosis import PeriodicWork
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


class Part(Protocol):
    """A compiled graph as the break measures see it
    (:class:`metrics.engines.torch.compile.graphs.Graph`)."""

    # The user's function it compiles part of.
    function: Function
    # (function, resume line) for the part after a break, None for the start.
    break_key: tuple[Function, int] | None
    # Compiled for calls with gradients on (training) or off (evaluation).
    grad: bool


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


def function_of(code: CodeType) -> tuple[Function, int | None]:
    """The user's function a code object compiles part of, and the line it
    resumes at (None: the function's own start)."""
    qualname = getattr(code, "co_qualname", code.co_name)
    r = resumed(qualname)
    if r is None:
        return (code.co_filename, qualname), None
    return (code.co_filename, r[0]), r[1]


def break_detail(reason: object, exc: BaseException | None) -> tuple[str, str]:
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
        f: FrameType | None = sys._getframe(3)
    except ValueError:
        return None
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(skip) and not fn.startswith("<") and not (
                f.f_code.co_name == name or resumed(f.f_code.co_name)):
            return f"{fn}:{f.f_lineno}"
        f = f.f_back
    return None

def break_location(exc: BaseException | None, skip: tuple[str, ...]) -> str | None:
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


def library_break(exc: BaseException | None, skip: tuple[str, ...]) -> str:
    """``file:line`` of the break itself where it lies in torch's (or another
    skipped library's) own code under a user's frame (torch's deliberate
    ``graph_break()`` in ``Optimizer.step``'s wrapper), else ``""``: the
    user's line cannot be rewritten to remove it."""
    stack = getattr(exc, "real_stack", None)
    if not stack:
        stack = torch._guards.TracingContext.extract_stack()
    if not stack or not str(stack[-1].filename).startswith(skip):
        return ""
    if not any(not str(f.filename).startswith(skip) for f in stack):
        return ""
    return f"{stack[-1].filename}:{stack[-1].lineno}"


def break_name(tx: object, skip: tuple[str, ...]) -> str:
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
    compiled ran in between; not the same part again, whose previous call
    was a whole call earlier) is a crossing of the break before that part,
    and the gap between the two calls its time. A gap in which Dynamo
    compiled (the first call, a recompile) is counted but not timed: the
    break's time is its untimed crossings at the mean of the timed ones.
    Crossings are counted apart by the part's grad mode: in a program that
    trains, the crossings with gradients off are its evaluation's, never the
    steps'. Graphs need ``function`` (:data:`Function`), ``break_key``
    (``(function, resume line)`` for a resume part, else None) and ``grad``."""

    def __init__(self) -> None:
        self._last: tuple[Part | None, int] = (None, 0)  # the previous batch's last call
        # (break, grad mode) -> [count, timed, ns]
        self._gaps: dict[tuple[tuple[Function, int], bool], list[int]] = {}
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

    def fold(self, graphs: Sequence[Part], starts: list[int], ends: list[int]) -> None:
        """Calls in the order they ended (``graph``, ``start``, ``end`` in ns)."""
        last, last_end = self._last
        self._last = (graphs[-1], ends[-1]) if graphs else self._last
        keys = list(map(_BREAK_KEY, graphs))  # in C: only resume parts are looked at
        gaps, compiles = self._gaps, self._compiles
        crossed = False
        for i in itertools.compress(range(len(keys)), keys):
            prev, prev_end = (graphs[i - 1], ends[i - 1]) if i else (last, last_end)
            key = keys[i]
            if prev is None or prev.function != key[0] or prev.break_key == key:
                continue  # another function's graph, or this part's own last call
            phase_key = (key, graphs[i].grad)
            acc = gaps.get(phase_key)
            if acc is None:
                acc = gaps[phase_key] = [0, 0, 0]
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
            for key, _ in gaps:
                self._seen[key] = now

    def sites(self, training: bool) -> list[SiteReading]:
        """One ``graph_break`` site per break and grad mode crossed; where the
        program ``training`` (steps with gradients on), the crossings with
        gradients off are its evaluation's (``work`` evaluation)."""
        out = []
        for (key, grad), (count, timed, ns) in list(self._gaps.items()):
            if not timed:
                continue
            (file, qualname), line = key
            location, name = self._where.get(key, (f"{file}:{line}", f"compile({qualname})"))
            work = PeriodicWork.EVALUATION.value if training and not grad else ""
            out.append(SiteReading(kind=SiteKind.GRAPH_BREAK.value, location=location,
                                   count=count, seconds=ns / 1e9 / timed * count, function=name,
                                   detail=GAP_DETAIL, last_seen_unix=self._seen.get(key, 0.0),
                                   work=work))
        return out

    def clear(self) -> None:
        self._last = (None, 0)
        self._gaps.clear()
        self._seen.clear()
        self._compiles.clear()


def wrapped_modules(tx: object) -> list[torch.nn.Module]:
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
