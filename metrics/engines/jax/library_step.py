"""A train step that is not jitted, around a library's jitted functions.

A program whose train step is a plain Python function calling optax (or
another library) whose helpers are jitted has no jitted function of its own
to be the step: the counted function with the most time is a library's. It
is never presented as the user's step: a jitted function defined in an
installed library or the engine (:mod:`metrics.engines._frames` decides; its
``__wrapped__`` chain followed, so flax's ``nnx.jit`` of the user's function
is the user's; and where the first function among its first call's
arguments is the user's, it is the user's too: equinox's ``filter_jit`` jits
its own dispatcher, handed the user's function as a static argument) ranks
below every function of the user's
(:meth:`~metrics.engines.jax.context.JaxContext.step_candidate`,
:meth:`~metrics.recording.callstats.CallTimes.dominant`); where one is
still the step, its calls are the steps of the user's line that called it
(found once, on a timed call), said so in the basis and as
``StepsReading.step_line``, and with no such line the step is not
identified.

Example:
    >>> eng.steps.steps().basis                               # doctest: +SKIP
    "train_step() in train.py (line 41): not jitted; the user's line that calls ..."
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from itertools import islice
from types import CodeType, FrameType, FunctionType
from typing import TYPE_CHECKING, Any

from metrics.engines._frames import USER
from tpu_info.contract.model import StepsReading

if TYPE_CHECKING:
    from metrics.engines._frames import LibraryFrames

_UNWRAP = 16  # __wrapped__ / partial links followed (a cycle ends there)


_LOOK = 256  # objects looked at, at most, among a library function's first call's arguments
MAX_LOOP_DEPTH = 64  # frames walked out from a gap's call to find the step loop's


def _unwrapped(fun: object) -> object:
    f = fun
    for _ in range(_UNWRAP):
        inner = getattr(f, "__wrapped__", None) or getattr(f, "func", None)
        if inner is None or inner is f:
            break
        f = inner
    return f


def library_function(frames: LibraryFrames, fun: object) -> bool:
    """Whether ``fun`` (what ``jax.jit`` was given, unwrapped through
    ``__wrapped__`` and partials) is defined in an installed library
    (optax's helpers) or the engine's own code; at ``jax.jit`` time."""
    code = getattr(_unwrapped(fun), "__code__", None)
    return isinstance(code, CodeType) and frames.kind(code.co_filename) != USER


def static_arguments(fun: object,
                     options: dict[str, Any]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Where a library function's static arguments are (positions, names),
    from ``jax.jit``'s ``static_argnums`` / ``static_argnames``; at
    ``jax.jit`` time, for a library's function only."""
    nums, names = options.get("static_argnums") or (), options.get("static_argnames") or ()
    nums = (nums,) if isinstance(nums, int) else tuple(n for n in nums if isinstance(n, int))
    names = (names,) if isinstance(names, str) else tuple(names)
    if names and callable(fun):  # a static name passed by position
        try:
            params = list(inspect.signature(fun).parameters)
            nums += tuple(params.index(n) for n in names if n in params)
        except (TypeError, ValueError):
            pass
    return nums, names


def _call_of(cls: object) -> object:
    """The ``__call__`` a class defines or inherits (None: its instances are
    not callable; a metaclass's is not looked at)."""
    for k in getattr(cls, "__mro__", ()):
        f = k.__dict__.get("__call__")
        if f is not None:
            return f
    return None


def users_function(frames: LibraryFrames, args: tuple[Any, ...], kwargs: dict[str, Any],
                   statics: tuple[tuple[int, ...], tuple[str, ...]]) -> bool:
    """Whether the first function among a library function's call's
    arguments (its static ones first: a function can only be static or the
    auxiliary data of a pytree node; depth first through tuples, lists,
    dicts and pytree definitions, :data:`_LOOK` objects at most) is defined
    in the user's code: equinox's ``filter_jit`` jits its own dispatcher and
    passes it the user's function (``((make_step,), treedef)``, a bound
    method in a node's data, a Module whose ``__call__`` is the user's).
    Once per library function, on its first timed call."""
    nums, names = statics
    n = len(args)
    todo = [*(kwargs[k] for k in reversed(kwargs)), *reversed(args),
            *(kwargs[k] for k in reversed(names) if k in kwargs),
            *(args[i] for i in reversed(nums) if -n <= i < n)]  # popped from the end
    for _ in range(_LOOK):
        if not todo:
            return False
        x = todo.pop()
        if isinstance(x, (tuple, list)):
            todo.extend(reversed(x[:_LOOK]))
        elif isinstance(x, dict):
            todo.extend(reversed(list(islice(x.values(), _LOOK))))
        elif type(x).__name__ == "PyTreeDef":  # a node's data, its children, then its class's call
            node = x.node_data()
            if node is not None:
                call = _call_of(node[0])
                todo.extend((*([call] if isinstance(call, FunctionType) else []),
                             *reversed(x.children()), node[1]))
        elif callable(x) and not isinstance(x, type):  # (a class: a dtype, not a function)
            f = _unwrapped(x)
            f = getattr(f, "__func__", f)  # a bound method
            code = getattr(f, "__code__", None)
            if code is None:  # a callable object: its class's __call__
                code = getattr(_call_of(type(f)), "__code__", None)
            if isinstance(code, CodeType):
                return frames.kind(code.co_filename) == USER
    return False


def first_call(frames: LibraryFrames, owner: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               frame: FrameType | None) -> None:
    """A library function's first timed call (before it is a step
    candidate): the user's own where its first function argument is
    (:func:`users_function`), else the user's line that called it."""
    if users_function(frames, args, kwargs, owner.statics):
        owner.library = False
    else:
        owner.called_at = user_frame(frames, frame)


def user_frame(frames: LibraryFrames, frame: FrameType | None
               ) -> tuple[CodeType, int] | tuple[()]:
    """The user's frame at or out from ``frame``: (code, offset); () where
    there is none. Once per library function (its first timed call)."""
    f = frame
    while f is not None:
        if frames.kind(f.f_code.co_filename) == USER:
            return f.f_code, f.f_lasti
        f = f.f_back
    return ()


def users_line(found: StepsReading, owner: Any) -> StepsReading | None:
    """Steps inferred from ``owner``'s calls: as they are when it is the
    user's function; when it is a library's, the calls of the user's line
    that called it (``step_line``), said so in the basis; None where no
    user's line called it (the step is not identified)."""
    if not getattr(owner, "library", False):
        return found
    at = getattr(owner, "called_at", None)
    if not at:
        return None
    from metrics.engines.jax.sites import where  # read time: sites imports numpy, calls may not

    location, function = where(*at)
    path, line = location.rsplit(":", 1)
    return dataclasses.replace(
        found, step_line=location,
        basis=f"{function.rsplit('.', 1)[-1]}() in {os.path.basename(path)} (line {line}): not "
              f"jitted; the user's line that calls {getattr(owner, 'name', 'a jitted function')} "
              f"each step, a library's jitted function ({found.count:,} calls; the most time)")


def loop_frame(frame: FrameType | None, code: CodeType | None) -> FrameType | None:
    """The innermost frame out from ``frame`` running ``code`` (the step
    loop's: the line there led to this call, say ``callback(params, t)``
    whose plotting calls a jitted function); None when none within
    :data:`MAX_LOOP_DEPTH` frames (an evaluation called from elsewhere)."""
    if code is None:
        return None
    f = frame
    for _ in range(MAX_LOOP_DEPTH):
        if f is None:
            return None
        if f.f_code is code:
            return f
        f = f.f_back
    return None
