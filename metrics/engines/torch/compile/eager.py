"""The eager fallback: the time a ``torch.compile`` result runs in Python
after Dynamo gave up on its frame (a graph break it cannot resume from).

Either Dynamo gives up on the whole frame ("falling back to eager"), or it
compiles the frame up to the break and runs the rest in Python ("cannot
resume from ..., skipping the rest of the function"). From then on the calls
of what ``torch.compile`` returned (the innermost such call on the stack when
Dynamo gave up: a module, or a function that calls it) are timed, and the
part of each call outside compiled graphs goes to ``EagerFallbackTime``
(:func:`time_compiled`): from the end of the frame's compiled part to the
next compiled graph or the call's end, or, with no compiled part, the call's
time less the compiled graphs run inside it.

The frames Dynamo gave up on are process-wide, as Dynamo's own decision
is: kept here across installs (:data:`GAVE_UP`). The time goes to the
installed engine's context (:data:`~metrics.engines.torch.compile.context.ACTIVE`),
looked up at each timed call.

Example:
    >>> g = type("Graph", (), {"partial": False})()
    >>> outside_graphs([g, 100, 300], 0, 1000)  # a call of 1000 ns, 200 in a graph
    800
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

import torch

from metrics.engines.torch.compile.breaks import wrapped_modules
from metrics.engines.torch.compile.context import ACTIVE

__all__ = ["GAVE_UP", "GaveUp", "gave_up_on", "is_partial", "time_compiled", "time_decorated",
           "outside_graphs"]


class GaveUp:
    """The code objects Dynamo gave up on: timed calls' keys (``codes``), and
    frames compiled up to a break whose rest runs eagerly (``partial``)."""

    def __init__(self) -> None:
        self.codes: set[CodeType] = set()
        self.partial: set[CodeType] = set()


GAVE_UP = GaveUp()


def gave_up_on(root: object, rest_only: bool = False) -> None:
    """Dynamo runs ``root``'s frame (a Dynamo instruction translator) eagerly
    from now on (``rest_only``: the part after the break, the part before is
    a compiled graph): time the calls of the innermost ``torch.compile``
    result on the stack (the frame may be a module called by a compiled
    function), else ``root``'s own (and, for a module compiled through
    Dynamo's ``wrap_inline``, the module's)."""
    code: CodeType | None = getattr(root, "f_code", None)
    if code is not None:
        GAVE_UP.codes.add(code)
        if rest_only:
            GAVE_UP.partial.add(code)
    GAVE_UP.codes.update(_wrapped_module_codes(root))
    f: FrameType | None = sys._getframe(1)
    while f is not None:
        if f.f_code is _TIMED_CODE:  # a timed wrapper: its key is its closure's ``code``
            key = f.f_locals.get("code")
            if key is not None:
                GAVE_UP.codes.add(key)
            break
        f = f.f_back


def is_partial(code: CodeType) -> bool:
    """Dynamo compiled ``code``'s frame up to an unresumable break: its graph
    is the compiled part, the rest runs eagerly after it."""
    return code in GAVE_UP.partial


def _wrapped_module_codes(root: object) -> list[CodeType]:
    """The ``forward`` code of the modules behind a ``wrap_inline`` frame: the
    frame Dynamo gave up on is that shared wrapper, the calls to time are the
    module's."""
    codes = (getattr(type(m).forward, "__code__", None) for m in wrapped_modules(root))
    return [c for c in codes if c is not None]


def time_decorated(decorate: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile(backend=...)`` used as a decorator factory: what it
    decorates is timed like :func:`time_compiled`."""
    @functools.wraps(decorate)
    def decorator(model: Callable[..., Any]) -> Any:
        return time_compiled(model, decorate(model))

    return decorator


def time_compiled(model: object, compiled: Any) -> Any:
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
        ctx = ACTIVE.ctx
        if ctx is not None:
            ctx.failed("torch_compile.time", e)
        return compiled


def _timed(fn: Callable[..., Any], code: CodeType | None) -> Callable[..., Any]:
    clock = time.monotonic_ns
    compiling = torch.compiler.is_compiling
    eager = GAVE_UP.codes

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        # Cheapest first: a frame Dynamo compiled (the usual one) is not in
        # the eager codes, and is_compiling() is a Python call.
        ctx = ACTIVE.ctx
        if code not in eager or ctx is None or compiling():
            return fn(*args, **kwargs)
        calls = ctx.calls_queue
        n = len(calls)
        start = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            end = clock()
            now = ACTIVE.ctx
            if now is not None:
                # Folded meanwhile (the queue shrank): the records since then.
                inside = calls[n:] if len(calls) >= n else calls[:]
                now.eager_time.observe(outside_graphs(inside, start, end))

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
