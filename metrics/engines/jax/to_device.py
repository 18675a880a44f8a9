"""Host -> device transfers in JAX, explicit and implicit: the hooks.

Two places see host data move to a device (each installed by
:meth:`~metrics.engines.jax.implicit.ImplicitTransfers.install`):

* the implementation of ``lax.stage_p``: ``jnp.asarray``/``jnp.array`` of
  host data (implicit);
* the numpy entries of ``pxla.shard_arg_handlers``: every ``jax.device_put``
  of host data (numpy arrays, Python scalars), which JAX marks with its own
  thread-local ``explicit_device_put`` state, is counted here as explicit,
  into the engine's transfer journal (with its event), so a ``device_put``
  runs one hook, not a wrapper and a handler; anything else the handler
  shards (numpy arguments of a jitted call on several devices, on every
  call; of any jitted call when it compiles) is implicit.

Numpy arguments of single-device jitted calls move in C++, unseen here: the
``jax.jit`` wrapper reports them through
:class:`~metrics.engines.jax.calls.JitArguments`, which owns that seam.

Where JAX's ``explicit_device_put`` state is missing, ``jax.device_put`` is
wrapped instead (:func:`explicit_puts_marked` is False) and the handler's
frame walk tells its puts apart.
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from metrics.engines._patching import Patches
from metrics.engines.jax.context import TRANSFER_FIELDS
from metrics.recording.journal import FOLD_AT
from metrics.recording.sampling import TIME_EVERY, TIME_FIRST

if TYPE_CHECKING:
    from metrics.engines.jax.explicit import ExplicitTransfers
    from metrics.engines.jax.implicit import ImplicitTransfers


class _ThreadState(Protocol):
    explicit_device_put: bool


TransferState = Callable[[], _ThreadState]  # JAX's guard_lib.thread_local_state

IMPLICIT_H2D = 1  # jax_transfers' record kind (kept equal there)


def nbytes_of(x: object) -> int:
    n = getattr(x, "nbytes", None)
    if n is not None:
        return int(n)
    dtype = getattr(x, "dtype", None)
    return int(dtype.itemsize) if dtype is not None else 8


def _guard_state() -> TransferState | None:
    """JAX's per-thread transfer state (``explicit_device_put`` is True
    inside ``jax.device_put``/``device_put_sharded``/``_replicated``), or None."""
    try:
        from jax._src.lib import guard_lib

        state = guard_lib.thread_local_state
        if isinstance(state().explicit_device_put, bool):
            return state
    except (ImportError, AttributeError, TypeError):
        pass
    return None


def explicit_puts_marked() -> bool:
    """Whether the numpy shard handler can tell a ``jax.device_put`` apart
    (else the engine wraps ``jax.device_put``)."""
    return _guard_state() is not None


def patch_stage(impl: ImplicitTransfers, patches: Patches, counted: int) -> None:
    """``stage_p.impl``: ``jnp.asarray``/``jnp.array`` of host data."""
    what = "jnp.asarray/jnp.array of host data"
    try:
        from jax._src.core import stage_p
    except ImportError as e:
        return impl.not_counted(what, f"jax._src.core.stage_p missing ({e})")
    if not callable(getattr(stage_p, "impl", None)):
        return impl.not_counted(what, "stage_p has no impl")
    if not patches.apply(stage_p, "impl", lambda orig: _stage_impl(orig, impl)):
        impl.missing.append(f"{what} are not counted: stage_p.impl missing")
        return
    impl.hold(stage_p.impl.__code__, counted)  # its first call shards numpy


def patch_shard_handlers(impl: ImplicitTransfers, explicit: ExplicitTransfers) -> bool:
    """The numpy entries of ``pxla.shard_arg_handlers``; True where explicit
    ``jax.device_put``s of host data are counted there (JAX's transfer state
    says which puts are explicit)."""
    try:
        from jax._src.interpreters import pxla

        handlers = pxla.shard_arg_handlers
        numpy_handler = pxla._shard_np_array
    except (ImportError, AttributeError) as e:
        impl.not_counted("numpy arguments of jitted calls on several devices",
                         f"pxla.shard_arg_handlers/_shard_np_array missing ({e})")
        return False
    state = _guard_state()
    wrapped = _shard_handler(numpy_handler, impl, explicit, state)
    for key, handler in list(handlers.items()):
        if handler is numpy_handler:
            handlers[key] = wrapped
            impl.dict_patches.append((handlers, key, handler))
    return state is not None and wrapped in handlers.values()


# The hooks (each runs inside the user's program: guarded) -------------------

def _stage_impl(original: Callable[..., Any], impl: ImplicitTransfers) -> Callable[..., Any]:
    clock, getframe = time.monotonic_ns, sys._getframe

    def stage_impl(*args: Any, **params: Any) -> Any:
        start = clock()
        out = original(*args, **params)
        end = clock()
        try:
            if args and out is not args[0]:  # a jax.Array is returned as it is
                impl.record(IMPLICIT_H2D, getframe(1), start, end, nbytes_of(args[0]))
        except Exception as e:  # noqa: BLE001
            impl.rec.hook_failed("jax.stage", e)
        return out

    stage_impl.__wrapped__ = original  # type: ignore[attr-defined]
    return stage_impl


def _shard_handler(original: Callable[..., Any], impl: ImplicitTransfers,
                   explicit: ExplicitTransfers,
                   state: TransferState | None) -> Callable[..., Any]:
    """The numpy handler counted. Runs on every device_put of a batch, so the
    usual call is decided once here, not per call: JAX's own four-argument
    call (no ``*args`` tuple built and unpacked), JAX's transfer state there
    (no None check), the explicit put inline (JAX's state's and the
    journal's calls only, and the clock's on the first ``TIME_FIRST`` puts
    and then one in ``TIME_EVERY``:
    :mod:`metrics.recording.sampling`); anything else goes to
    :func:`_shard_other`, timed."""
    clock, every = time.monotonic_ns, TIME_EVERY
    queue, flush = explicit.queue, explicit.journal.flush
    extend, fold_at = queue.extend, FOLD_AT * TRANSFER_FIELDS

    if state is None or not _takes_four(original):
        def shard_np_array_any(xs: Sequence[np.ndarray], *args: Any) -> Any:
            start = clock()
            out = original(xs, *args)
            end = clock()
            _shard_other(impl, explicit, state, xs, start, end)
            return out

        shard_np_array_any.__wrapped__ = original  # type: ignore[attr-defined]
        return shard_np_array_any

    counter = _Countdown()

    def timed_put(xs: Sequence[np.ndarray], shardings: object, layouts: object,
                  copy_semantics: object) -> Any:
        """A handler call timed: an explicit put (the first ``TIME_FIRST``,
        then one in ``TIME_EVERY``), or anything else the handler shards."""
        start = clock()
        out = original(xs, shardings, layouts, copy_semantics)
        end = clock()
        try:
            if state().explicit_device_put:
                if counter.first:
                    counter.first -= 1
                else:
                    counter.untimed = every - 1
                extend((True, start, end,
                        xs[0].nbytes if len(xs) == 1 else sum(map(nbytes_of, xs))))
                if len(queue) >= fold_at:  # checked on timed puts: at most every - 1 over
                    flush()
            else:
                _shard_other(impl, explicit, None, xs, start, end)
        except Exception as e:  # noqa: BLE001
            impl.rec.hook_failed("jax.shard_arg", e)
        return out

    def shard_np_array(xs: Sequence[np.ndarray], shardings: object, layouts: object,
                       copy_semantics: object) -> Any:
        if counter.untimed:
            try:
                explicit = state().explicit_device_put  # set before device_put shards
            except Exception:  # noqa: BLE001 - the timed path below counts the failure
                explicit = False
            if explicit:
                # Counted with its bytes, not timed (metrics.recording.sampling).
                counter.untimed -= 1
                out = original(xs, shardings, layouts, copy_semantics)
                try:
                    extend((True, 0, 0,
                            xs[0].nbytes if len(xs) == 1 else sum(map(nbytes_of, xs))))
                except Exception as e:  # noqa: BLE001
                    impl.rec.hook_failed("jax.shard_arg", e)
                return out
        return timed_put(xs, shardings, layouts, copy_semantics)

    shard_np_array.__wrapped__ = original  # type: ignore[attr-defined]
    return shard_np_array


class _Countdown:
    """The sampling countdown of a numpy shard handler."""

    __slots__ = ("untimed", "first")

    def __init__(self) -> None:
        self.untimed = 0  # explicit puts left to count untimed before the next timed one
        self.first = TIME_FIRST  # timed puts left before sampling starts


def _takes_four(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is JAX's handler shape ``(xs, shardings, layouts,
    copy_semantics)``: four positional parameters, nothing else."""
    code = getattr(fn, "__code__", None)
    return (code is not None and code.co_argcount == 4 and not code.co_kwonlyargcount
            and not code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
            and not getattr(fn, "__defaults__", None))


def _shard_other(impl: ImplicitTransfers, explicit: ExplicitTransfers,
                 state: TransferState | None, xs: Sequence[object], start: int,
                 end: int) -> None:
    """A handler call off the usual path: an explicit put where JAX's
    transfer state is read per call (``state``: the generic wrapper), else an
    implicit transfer (a numpy argument sharded by a jitted call)."""
    try:
        if state is not None and state().explicit_device_put:
            q = explicit.queue
            q.extend((True, start, end, sum(map(nbytes_of, xs))))
            if len(q) >= FOLD_AT * TRANSFER_FIELDS:
                explicit.journal.flush()
        # 0-d values are the library's own constants (jnp.ones' fill
        # value on its first call), not the user's data.
        elif any(getattr(x, "ndim", 1) for x in xs):
            impl.record(IMPLICIT_H2D, sys._getframe(2), start, end, sum(map(nbytes_of, xs)))
    except Exception as e:  # noqa: BLE001
        impl.rec.hook_failed("jax.shard_arg", e)
