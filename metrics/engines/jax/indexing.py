"""Eager indexing timed whole: ``x[idx]`` and ``x.at[idx].set(y)`` on concrete arrays.

Indexing a jax.Array from Python (``ArrayImpl.__getitem__``, ``x.at[idx].get()``:
``jax._src.numpy.indexing.rewriting_take``; ``x.at[idx].set/add/multiply/...``:
``jax._src.ops.scatter._scatter_update``) does most of its work in Python
around the primitives it binds: it normalises the index, converts a numpy
index and builds the gather's dimension numbers. The primitives' own time
(what :mod:`.eager` times per bind) was 210-240 us of the 690-770 us that
equinox's train_rnn loader spends per batch on its two gathers
(``array[batch_perm]`` with a numpy permutation), and the loader cost 0.91 ms
a step by A/B. So both functions are wrapped where JAX looks them up (module
attributes, read at each call): a call made on the evaluation trace (no
``jit``, ``vmap`` or ``grad`` tracing: ``trace_ctx.trace`` is an
``EvalTrace``; under tracing the wrapper only reads that and passes through)
is one eager-op record, timed from entry to return and charged to the
user's line as :mod:`.eager`'s records are (the same recorder, the same
waits and CPU cap). The primitives it binds are its time, not records of
their own (the thread's ``busy`` flag, as for primitives nested in another
one); they name it: its gather, slice or scatter (:data:`NAMES`), else the
first one bound (``"getitem"`` or ``"index_update"`` when none was). A
call that compiled keeps its count but not its time. A host->device
transfer timed inside it (``x.at[i].set(0.0)`` converts its value with
``jnp.asarray``) is its own site's time (the implicit-transfer journal's
records appended during the call), taken out of the call's.

Cost on the hot path: one trace read and a type check per call under tracing;
per eager call two clock reads, an ``is_ready()`` of the indexed array, two
reads of the transfer journal's length and one record, while its primitives
skip theirs: a numpy-indexed gather costs 0.91x what the per-primitive hook
alone cost, 1.005x unhooked (load 8; ``bench/eager_ops.py``).
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from metrics.engines._patching import Patches
from metrics.engines.jax.context import JaxContext
from metrics.engines.jax.implicit import FIELDS as TRANSFER_FIELDS
from tpu_info.contract.model import INDEXING_OPS

if TYPE_CHECKING:
    from metrics.engines.jax.eager import EagerOps

# The primitives that name an indexing call (over any other it binds first).
NAMES = INDEXING_OPS | frozenset({
    "dynamic_update_slice", "scatter", "scatter-add", "scatter-sub", "scatter-mul",
    "scatter-min", "scatter-max"})
# (module, function, its first parameters, the name of a call that bound no primitive)
_WRAPPED = (("jax._src.numpy.indexing", "rewriting_take", ("arr", "idx"), "getitem"),
            ("jax._src.ops.scatter", "_scatter_update", ("x", "idx", "y"), "index_update"))


def install(patches: Patches, ops: EagerOps, context: JaxContext, array: type | None,
            core: ModuleType) -> list[str]:
    """Wraps the indexing functions (restored with ``patches``); what could
    not be wrapped, one sentence each (their primitives stay counted one by one)."""
    missing: list[str] = []
    trace_ctx, eval_trace = getattr(core, "trace_ctx", None), getattr(core, "EvalTrace", None)
    if trace_ctx is None or eval_trace is None:
        return ["eager indexing is timed by its primitives only: jax._src.core.trace_ctx "
                "missing"]
    for module_name, attr, params, fallback in _WRAPPED:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            missing.append(f"eager indexing is timed by its primitives only: {module_name} "
                           f"missing ({e})")
            continue

        def make(orig: Callable[..., Any], fb: str = fallback) -> Callable[..., Any]:
            return _span(orig, ops, context, array, fb, trace_ctx, eval_trace)

        if not patches.apply(module, attr, make, params):
            missing.append(f"eager indexing is timed by its primitives only: {module_name}."
                           f"{attr} missing or changed")
    return missing


def _span(original: Callable[..., Any], ops: EagerOps, context: JaxContext,
          array: type | None, fallback: str, trace_ctx: Any,
          eval_trace: type) -> Callable[..., Any]:
    """``original`` timed whole when called on the evaluation trace, as one
    record of ``ops`` named by the primitives it binds (module docstring)."""
    clock, getframe, seq = time.monotonic_ns, sys._getframe, context.compile_seq
    thread_clock, drains = time.thread_time_ns, ops.impl.drains  # drains.times: the watcher
    is_ready = getattr(array, "is_ready", None)
    record, local = ops.record, ops.local
    transfers = ops.impl.journal  # transfers timed inside a call: their own sites' time
    moved = transfers.queue

    def span(arr: Any, *args: Any, **kwargs: Any) -> Any:
        if local.busy or type(trace_ctx.trace) is not eval_trace:  # tracing, or nested
            return original(arr, *args, **kwargs)
        local.busy, local.span = True, ""
        waited = False
        if is_ready is not None and type(arr) is array:
            try:  # non-blocking: the array not ready means the call may wait for queued work
                waited = not is_ready(arr)
            except Exception:  # noqa: BLE001 - a deleted array: the call itself says so
                waited = False
        times = drains.times
        cpu0 = (thread_clock() if waited or times is not None and (times.held or times.pending)
                else -1)
        compiles, seen = seq[0], transfers.folded + len(moved)
        start = clock()
        try:
            return original(arr, *args, **kwargs)
        finally:
            end = clock()
            cpu = thread_clock() - cpu0 if cpu0 >= 0 else -1
            name = local.span or fallback
            local.busy, local.span = False, None
            try:
                if transfers.folded + len(moved) != seen:  # (a value converted: jnp.asarray)
                    inside = _timed(moved, seen - transfers.folded)
                    start = min(start + inside, end)
                    cpu = max(cpu - inside, 0) if cpu >= 0 else -1
                record(name, getframe(1), end if seq[0] != compiles else start, end, waited,
                       cpu)
            except Exception as e:  # noqa: BLE001 - a hook never raises into the program
                ops.rec.hook_failed("jax.eager", e)

    return span


def _timed(moved: list[Any], first: int) -> int:
    """The ns of the transfers recorded in ``moved`` (the implicit-transfer
    journal's queue, ``TRANSFER_FIELDS`` a record) from item ``first`` on
    (those folded already are left in)."""
    w = TRANSFER_FIELDS
    return sum(moved[k + 5] - moved[k + 4] for k in range(max(first, 0), len(moved) - w + 1, w))
