"""Opening the device, and the compiles of the step loop: one-off time, apart.

**Start-up.** The first device operation of a process opens the backend
(``jax._src.xla_bridge.backends()`` initializes every platform: 7-11 s for a
TPU chip, a fraction of a second for the CPU). Whatever op that was (a
``jnp.asarray`` of 4 bytes, a ``device_put``, a read) would otherwise be
charged with it. :func:`patch_backends` wraps ``backends()``: a call that
finds no backend yet is timed, and when it leaves backends behind the
start-up is recorded (``BackendStartTime``, one sample; its monotonic span
kept in ``JaxContext.startups``). :func:`take_out` then removes that span from
any journal record that contains it, at fold time (off the hot path: the
usual call of ``backends()`` reads one module global and returns).

**Compile steps.** The engine's :class:`~metrics.engines.compile_steps.CompileTimeline`
keeps the spans of compile work (tracing, lowering, the backend compile, the
start-up); :mod:`metrics.engines.compile_steps` groups them into the loop's
steps (``CompileStepTime``), as it does for torch.compile.

Example:
    >>> take_out(flat := [0, 1_000], 2, 0, 1, [(100, 600)]); flat   # a record held it
    [500, 1000]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

__all__ = ["patch_backends", "take_out"]

if TYPE_CHECKING:
    from metrics.engines._patching import Patches
    from metrics.engines.jax.context import JaxContext


def take_out(flat: list[Any], fields: int, start_at: int, end_at: int,
             startups: Sequence[tuple[int, int]]) -> None:
    """Journal records (``fields`` values each; a record's start at index
    ``start_at``, its end at ``end_at``) that contain a start-up span lose
    it: their start moves later by its length, in place. A batch that began
    after every start-up (all of them, once it is past) is checked in C."""
    if not startups or min(flat[start_at::fields], default=0) > startups[-1][0]:
        return
    for s0, s1 in startups:
        for i in range(0, len(flat), fields):
            start, end = flat[i + start_at], flat[i + end_at]
            if start <= s0 and end >= s1 and end > start:
                flat[i + start_at] = min(end, start + (s1 - s0))


def patch_backends(patches: Patches, context: JaxContext) -> None:
    """Wraps ``xla_bridge.backends`` so the call that opens the backends is
    timed and handed to the active engine's compiles (``on_startup``)."""
    try:
        from jax._src import xla_bridge
    except ImportError as e:
        patches.degraded.append(f"backend start-up not told apart: {e}")
        return
    if not isinstance(getattr(xla_bridge, "_backends", None), dict):
        patches.degraded.append("backend start-up not told apart: "
                                "jax._src.xla_bridge._backends missing")
        return
    patches.apply(xla_bridge, "backends", lambda orig: _wrap_backends(orig, xla_bridge, context))


def _wrap_backends(original: Callable[[], Any], bridge: Any,
                   context: JaxContext) -> Callable[[], Any]:
    clock = time.monotonic_ns

    def backends() -> Any:
        if bridge._backends:  # the usual call: opened already
            return original()
        start = clock()
        out = original()
        end = clock()
        eng = context.active
        if eng is not None and bridge._backends:
            try:
                eng.compiles.on_startup(start, end, sorted(bridge._backends))
            except Exception as e:  # noqa: BLE001 - a hook never raises into the program
                eng.rec.hook_failed("jax.startup", e)
        return out

    backends.__wrapped__ = original  # type: ignore[attr-defined]
    return backends
