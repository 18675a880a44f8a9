"""A train step that is not jitted, around a library's jitted functions.

A program whose train step is a plain Python function calling optax (or
another library) whose helpers are jitted has no jitted function of its own
to be the step: the counted function with the most time is a library's. It
is never presented as the user's step: a jitted function defined in an
installed library or the engine (:mod:`metrics.engines._frames` decides; its
``__wrapped__`` chain followed, so flax's ``nnx.jit`` of the user's function
is the user's) ranks below every function of the user's
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
import os
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

from metrics.engines._frames import USER
from tpu_info.contract.model import StepsReading

if TYPE_CHECKING:
    from metrics.engines._frames import LibraryFrames

_UNWRAP = 16  # __wrapped__ / partial links followed (a cycle ends there)


def library_function(frames: LibraryFrames, fun: object) -> bool:
    """Whether ``fun`` (what ``jax.jit`` was given, unwrapped through
    ``__wrapped__`` and partials) is defined in an installed library
    (optax's helpers) or the engine's own code; at ``jax.jit`` time."""
    f = fun
    for _ in range(_UNWRAP):
        inner = getattr(f, "__wrapped__", None) or getattr(f, "func", None)
        if inner is None or inner is f:
            break
        f = inner
    code = getattr(f, "__code__", None)
    return isinstance(code, CodeType) and frames.kind(code.co_filename) != USER


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
