"""Calls of ahead-of-time compiled functions (``jax.jit(f).lower(x).compile()``,
then the ``Compiled`` called) counted as executions of their graph.

``jax.stages.Compiled.__call__`` (a Python method on every AOT call, per
``engine-hooks.md``) is replaced at install, on the class: every Compiled
object is counted, whenever and by whom its function was jitted, exactly as a
``jax.jit`` wrapper's call (one journal record, host time from the call to
its return). The graph: each compile the engine sees notes its executable's
fingerprint (:func:`remember`); a Compiled object finds its graph by that
fingerprint at its first counted call (``Compiled._executable.xla_executable``;
the fingerprints are the context's ``aot_graphs``,
private: without it, or for an executable compiled before install, calls
are counted with no graph).

Example:
    >>> import jax, jax.numpy as jnp, metrics             # doctest: +SKIP
    >>> metrics.install()                                 # doctest: +SKIP
    >>> run = jax.jit(lambda x: x + 1).lower(jnp.ones(2)).compile()  # doctest: +SKIP
    >>> run(jnp.ones(2))                  # an execution of jit(<lambda>)  # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from metrics.engines._patching import Patches
from metrics.engines.jax.calls import Owner
from metrics.engines.jax.context import CALL_FIELDS, JaxContext
from metrics.recording.journal import FOLD_AT

if TYPE_CHECKING:
    from jax.stages import Compiled

OWNER_ATTR = "_tpu_info_owner"  # set on a Compiled object at its first counted call
UNKNOWN = "aot(compiled before install)"


def install(patches: Patches, context: JaxContext) -> bool:
    """Hooks ``Compiled.__call__``; False (with the reason in the engine's
    degraded list) where JAX has no such Python method."""
    try:
        from jax._src.stages import Compiled
    except ImportError as e:
        patches.degraded.append(f"AOT-compiled calls not counted: jax._src.stages missing ({e})")
        return False
    if not getattr(Compiled, "__dictoffset__", 0):  # the hook keeps its state on the object
        patches.degraded.append("AOT-compiled calls not counted: Compiled objects have no __dict__")
        return False
    return patches.apply(Compiled, "__call__", lambda orig: hook_call(orig, context))


def owner_of(compiled: Compiled, context: JaxContext) -> Owner:
    """The counting state of one Compiled object (made at its first call)."""
    owner: Owner | None = compiled.__dict__.get(OWNER_ATTR)
    if owner is not None:
        return owner
    found = None
    try:
        found = context.aot_graphs.get(
            compiled._executable.xla_executable.fingerprint)  # type: ignore[attr-defined]
    except Exception as e:  # noqa: BLE001 - private names moved: counted, no graph
        context.hook_failed("jax.aot", e)
    owner = Owner(found[1] if found else UNKNOWN)
    owner.last_hash = found[0] if found else None
    compiled.__dict__[OWNER_ATTR] = owner
    return owner


def counts(fn: object) -> bool:
    """``fn`` is an AOT-compiled function whose calls the class hook counts."""
    hook = type(fn).__dict__.get("__call__")
    return getattr(hook, "__code__", None) is _HOOK_CODE and hasattr(fn, "__dict__")


def adopt(compiled: Compiled, owner: Owner, context: JaxContext) -> Compiled:
    """``metrics.track(compiled)``: its calls count under ``owner`` from now
    on (its graph carried over), once, by the class hook; returns it."""
    owner.last_hash = owner_of(compiled, context).last_hash
    compiled.__dict__[OWNER_ATTR] = owner
    return compiled


def hook_call(original: Callable[..., Any], context: JaxContext) -> Callable[..., Any]:
    """``Compiled.__call__`` that counts the call (see the module's docstring)."""
    clock, fold_at = time.monotonic_ns, FOLD_AT * CALL_FIELDS

    def __call__(self: Compiled, *args: Any, **kwargs: Any) -> Any:
        eng = context.active
        if eng is None:
            return original(self, *args, **kwargs)
        owner = self.__dict__.get(OWNER_ATTR) or owner_of(self, context)
        owner.calls += 1  # a read's step index when this is the step (JaxContext.step_owner)
        start = clock()
        out = original(self, *args, **kwargs)
        end = clock()
        q = eng.calls_queue
        q.extend((owner, None, start, end, None))  # fields: see CALL_FIELDS
        if len(q) >= fold_at:
            eng.calls.flush()
        if owner is not context.step_owner and not context.step_named:
            context.step_candidate(owner)
        return out

    __call__.__wrapped__ = original  # type: ignore[attr-defined]
    __call__.__doc__ = original.__doc__
    return __call__


_HOOK_CODE = hook_call(lambda self: None, JaxContext()).__code__  # how counts() knows the hook
