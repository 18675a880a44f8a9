"""Counts every call of functions jitted after install, without wiring.

At install ``jax.jit`` (the attribute users call) is replaced by a function
that calls the original and wraps what it returns: each call of the jitted
function then goes to the engine's calls journal, exactly as a
``metrics.track`` call does (the graph it ran, host time from the call to its
return: dispatch is asynchronous, so device time after the return is not in
it). That fills in executions per graph, ``ExecuteTime``, the inferred step
(:mod:`metrics.recording.callstats`) and busy %. A numpy argument is a
host->device transfer nobody asked for;
:class:`~metrics.engines.jax.jit_numpy.JitArguments` counts it:
top-level ones on every call, and ones nested in containers (an
``(images, labels)`` batch) at the places a compiling call had them (the
tree is walked only when a call compiles).

The wrapper keeps what user code reaches for on a jitted function
(``lower``, ``trace``, ``eval_shape``, ``clear_cache``, ``_cache_size``,
``__wrapped__``, ``__name__``, ``__doc__`` ...). ``jax.pmap`` is wrapped the
same way (:func:`hook_pmap`); calls of AOT-compiled functions are counted by
:mod:`metrics.engines.jax.aot`. Not seen: functions jitted before install,
``jax.jit`` reached through a name bound before install (``from jax import
jit`` above ``metrics.install()``, ``jax._src.api.jit``); :func:`blind_spots`
says so, naming the user's own such names with the line that bound them
(:mod:`metrics.engines.jax.bound`).

Example:
    >>> import jax, metrics                                  # doctest: +SKIP
    >>> metrics.install()                                    # doctest: +SKIP
    >>> step = jax.jit(lambda x: x + 1)     # counted from here  # doctest: +SKIP
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from metrics.engines.jax.context import CALL_FIELDS, JaxContext
from metrics.engines.jax.gaps import at_call
from metrics.engines.jax.library_step import first_call, library_function, static_arguments
from metrics.recording.callstats import evaluation
from metrics.recording.journal import FOLD_AT
from metrics.recording.sampling import TIME_EVERY, TIME_FIRST
from metrics.recording.thread_busy import WAIT_AFTER, usage

if TYPE_CHECKING:
    from metrics.engines.jax.engine import JaxEngine

try:
    from numpy import ndarray as _NDARRAY
except ImportError:  # no numpy, so no jax: metrics.track() of a plain function still counts
    class _NDARRAY:  # type: ignore[no-redef]  # nothing is of this type
        pass

# What user code and libraries read on a jitted function, besides its __dict__.
# What picks a function's graph once it has several: (shape, dtype) per
# top-level argument; and where a numpy leaf sits in a call's arguments.
CallKey = tuple[tuple[object, object], ...]
Path = tuple[int, *tuple[Hashable, ...]]  # the argument's index, then the keys within it

_KEPT = ("__module__", "__name__", "__qualname__", "__doc__", "__annotations__",
         "__wrapped__", "lower", "trace", "eval_shape", "clear_cache", "_cache_size",
         "_cache_miss", "_clear_cache", "_fun")


FEEDBACK_CHECKS = 8  # a function's first calls checked for feeding back its output
# What a numpy argument's copy costs the call is measured on the path the
# program uses (JAX's C++ dispatch copies it): a function's timed calls with
# numpy arguments alternate between that path (the call timed whole) and a
# sample whose arguments the hook put on the device first (the call timed on
# device arrays); the copies' host time is the difference of their medians
# over the latest COPY_KEEP each way (jit_numpy.copy_ns). Samples: on its
# first COPIES_FIRST such calls, then at most one every COPY_SPACING_NS
# (spread over the run, and each pre-put, on JAX's Python path, costs a
# bounded share of wall time: on a TPU v5e host a sample's put took 0.55 ms
# where the host-bound step took 0.56; at one every 50 ms the samples took
# 9 us a step, 1.6 %; at one a second the loop read 0.979-0.986 of unhooked
# against 0.972-0.974, bench/RESULTS-TPU.md).
COPIES_FIRST = 24  # 20 timed (what a cost or a percentile stands on) after 4 each way
COPY_SPACING_NS = 1_000_000_000
COPY_KEEP = 32  # host times kept each way (their medians: a slow first call is no mean's)


def note_feedback(owner: Owner, args: tuple[Any, ...], out: Any,
                  checking: set[Owner] | None = None) -> None:
    """One of ``owner``'s first calls (:attr:`Owner.fed_back`): off the usual
    path (FEEDBACK_CHECKS calls per function, never after). ``checking``:
    the functions in their first calls (their last output kept): one whose
    output is an argument here feeds ``owner`` (:attr:`Owner.feeds`)."""
    import jax

    owner.checks -= 1
    array = jax.Array
    leaves = [x for x in jax.tree_util.tree_leaves(args) if isinstance(x, array)]
    previous = {id(x) for x in owner.last_out}
    fed = [x for x in leaves if id(x) in previous] if previous else []
    if fed:
        owner.fed_back += 1
        # The state it carries from call to call (parameters, optimizer
        # state): what a checkpoint copies (gaps.py tells one by it).
        owner.state_bytes = max(owner.state_bytes, sum(x.nbytes for x in fed))
    if checking is not None:
        given = {id(x) for x in leaves}
        for other in list(checking):
            if other is not owner and any(id(x) in given for x in other.last_out):
                other.feeds.add(owner)  # (its last output, held: the ids are its)
    owner.last_out = ([x for x in jax.tree_util.tree_leaves(out) if isinstance(x, array)]
                      if owner.checks else [])
    if checking is not None:
        if owner.checks:
            checking.add(owner)
        else:
            checking.discard(owner)


class Owner:
    """One counted function: its name in the ledger and the graphs its calls ran."""

    __slots__ = ("name", "graphs", "last_hash", "compiles", "nested_numpy", "usual_ns",
                 "numpy_args", "calls", "evaluation", "numpy_label", "copies_seen", "next_copy",
                 "copy_stats", "fed_back", "checks", "last_out", "library", "called_at",
                 "numpy_run", "numpy_steady", "caller_code", "state_bytes", "feeds", "statics",
                 "returned", "step_calls_seen")
    explicit = False  # a function the user wrapped in metrics.track is explicit

    def __init__(self, name: str) -> None:
        self.name = name
        # Calls so far, counted on every call: when this function is the step,
        # a device->host read's step index (JaxContext.step_owner).
        self.calls = 0
        self.evaluation = evaluation(name)  # its name says it evaluates: never the step
        self.graphs: dict[CallKey, str] = {}
        self.last_hash: str | None = None
        self.compiles = 0  # seen during its calls; from two on, calls carry a key
        # Where numpy leaves sat inside container arguments (a (images, labels)
        # batch) when a call compiled: looked up on each call, no tree walk.
        self.nested_numpy: tuple[Path, ...] = ()
        # Mean host ns of its timed calls that did not compile: what its
        # untimed ones are taken at in a batch without a timed one.
        self.usual_ns = 0
        # Whether numpy arguments were seen (each call is then checked):
        # JitArguments says how it learns (_BY_HANDLER: truthy, not yet True).
        self.numpy_args: bool | str = False
        self.numpy_label = f"numpy argument of {name}"  # its records' detail: made once
        self.numpy_run: Any = None  # its calls' numpy arguments, counted (numpy_runs.Run)
        # Its run has gone on unchanged long enough that its untimed calls are
        # not checked, only counted at the next check (numpy_runs.STEADY)
        self.numpy_steady = False
        self.copies_seen = 0  # pre-put samples of its numpy arguments so far
        self.next_copy = 0  # the clock (ns) from which its next pre-put sample may come
        # Host ns of its latest timed calls that did not compile, with numpy
        # arguments copied by JAX and on pre-put arrays; whether the next timed
        # call with numpy arguments is JAX's turn (jit_numpy.copy_ns).
        self.copy_stats: tuple[deque[int], deque[int], list[int]] = (
            deque(maxlen=COPY_KEEP), deque(maxlen=COPY_KEEP), [0])
        # Whether its output feeds its next call (``w, loss = step(w, x)``: a
        # training step carries its state; an evaluation's metrics never come
        # back): calls of its first FEEDBACK_CHECKS (all timed, one after the
        # other) in which an input array was the previous call's output.
        self.fed_back = 0
        self.state_bytes = 0  # bytes of its output its next call took back in (fed back)
        # The functions its output was an argument of, in their first calls
        # and its own: a step's input made by another jitted function
        # (``augment(batch)`` before ``train_step``), not work between steps.
        self.feeds: set[Owner] = set()
        self.checks = FEEDBACK_CHECKS
        self.last_out: list[Any] = []  # the previous checked call's output arrays
        # Whether the function is a library's (optax's helpers, not the user's
        # train step: never taken for the step while a user's function is;
        # _frames.py decides), and then the user's line that called it, found
        # on a timed call: (code, offset); () where none was on the stack.
        self.library = False
        self.called_at: tuple[Any, int] | tuple[()] | None = None
        # A library function's static arguments (positions, names): where the
        # user's function is looked for first (library_step.users_function).
        self.statics: tuple[tuple[int, ...], tuple[str, ...]] = ((), ())
        # The user's code that calls it (the loop's, for the step), found at
        # its first call after other work (gaps.at_call); False: none.
        self.caller_code: Any = None
        # 0, or where a library's wrapper calls it (wrappers.py): the clock as
        # its latest timed call returned, the hook's own work after it done.
        self.returned = 0
        self.step_calls_seen = -1  # the step's calls at its last timed call (succeed())


def counting(fn: Callable[..., Any], owner: Owner, context: JaxContext,
             time_every: int = TIME_EVERY, time_first: int = TIME_FIRST) -> Callable[..., Any]:
    """``fn`` wrapped so each call counts as an execution of the graph it ran.

    Every call is counted (one journal write); the first ``time_first`` and
    then one in ``time_every`` also read the clock around it
    (:mod:`metrics.recording.sampling`).
    While the function has one graph, calls are attributed to it; once it
    has compiled twice, each call also records the shapes and dtypes of its
    top-level arguments, which pick the graph (a call that compiled teaches
    the mapping).
    """
    return _python_calls(fn, owner, context, time_every, time_first)[0]


def _python_calls(fn: Callable[..., Any], owner: Owner, context: JaxContext, time_every: int,
                  time_first: int) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(every call, the timed call it makes on its sampled calls) of ``fn``:
    the first is the wrapper."""
    # Every call runs this: names bound once, one attribute read of the
    # engine's state, no call but the journal's (and the clock's on a timed
    # call); the rest is off the usual path (a call with numpy arguments, or
    # one that compiled).
    clock, seqs, ndarray, state = time.monotonic_ns, context.compile_seq, _NDARRAY, context
    fold_at = FOLD_AT * CALL_FIELDS
    usual = (owner, None, 0, 0, None)  # an untimed call's record (end 0), made once
    untimed = 0  # calls left to count untimed before the next timed one
    first = time_first  # timed calls left before sampling starts

    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal untimed, first
        owner.calls += 1  # (a race between threads loses a count: a step index, not a total)
        if state.gap_owner is not owner:  # after other work: a gap's end or its work (gaps.py)
            try:
                if (at_call(state, owner, sys._getframe(), args) is not False and untimed
                        and (eng := state.active) is not None and eng.device_times.due(owner)):
                    untimed = 0  # a gap's read drained the queue: a device-time sample here
            except Exception as e:  # noqa: BLE001 - a hook never raises into the program
                state.hook_failed("jax.gaps", e)
        if untimed:
            eng = state.active
            if eng is None:
                return fn(*args, **kwargs)
            # Counted, not timed. (A race between threads on this countdown
            # only moves which call is timed.)
            untimed -= 1
            if owner.numpy_args and not owner.numpy_steady:  # it takes numpy (JitArguments):
                try:  # each call's counted (a try costs nothing until it catches, in 3.11+)
                    eng.numpy_arguments(owner, args, 2)  # 2: this call's caller
                except Exception as e:  # noqa: BLE001 - a hook never raises into the program
                    eng.rec.hook_failed("jax.implicit", e)
            seq = seqs[0]
            out = fn(*args, **kwargs) if kwargs else fn(*args)
            try:
                if seqs[0] == seq and owner.compiles < 2:
                    eng.calls_queue.extend(usual)  # end 0: untimed
                else:
                    _keyed_call(eng, owner, args, seq, 0, 0)
            except Exception as e:  # noqa: BLE001 - a hook never raises into the program
                eng.rec.hook_failed("jax.jit", e)
            return out
        if first:
            first -= 1
        else:
            untimed = time_every - 1
        return timed_call(*args, **kwargs)

    def next_timed() -> bool:  # a library's wrapper around the call times its own then
        return not untimed

    call._tpu_info_next_timed = next_timed  # type: ignore[attr-defined]  # (wrappers.py)

    def timed_call(*args: Any, **kwargs: Any) -> Any:
        eng = state.active
        if eng is None:
            return fn(*args, **kwargs)
        given = args
        copies = 0  # numpy arguments: 1 copied by JAX in the call, 2 put here first
        try:  # nested numpy: the paths learnt at a compile
            if owner.numpy_args or owner.nested_numpy or ndarray in map(type, args):
                now, turn = clock(), owner.copy_stats[2]
                if now >= owner.next_copy and not turn[0]:  # a sample: put here first
                    if owner.numpy_steady:  # the untimed calls before it, to its run
                        from metrics.engines.jax.numpy_runs import catch_up  # (numpy's)
                        catch_up(owner, state.step_owner)
                    n = owner.copies_seen = owner.copies_seen + 1
                    if n >= COPIES_FIRST:
                        owner.next_copy = now + COPY_SPACING_NS
                    given = eng.implicit.jit_arguments.timed(owner, args, 3)
                    copies, turn[0] = 2, 1
                else:
                    eng.numpy_arguments(owner, args, 3)  # 3: call()'s caller
                    copies, turn[0] = 1, 0
        except Exception as e:  # noqa: BLE001 - a hook never raises into the program
            eng.rec.hook_failed("jax.implicit", e)
        behind = eng.device_times.before(owner, given)  # (its inputs before any is donated)
        seq = seqs[0]
        start = clock()
        # The step's call on a sample (5 a second): the thread's CPU time
        # and switches too, so its wait in dispatch is known (thread_busy.py).
        began = (usage() if owner is state.step_owner and start >= eng.thread_busy.wait_due_ns
                 and owner.calls > WAIT_AFTER else None)
        out = fn(*given, **kwargs) if kwargs else fn(*given)  # no dict copy in the usual call
        end = clock()
        try:
            if copies and seqs[0] == seq:  # (a call that compiled is no sample)
                owner.copy_stats[copies - 1].append(end - start)
            if seqs[0] == seq and owner.compiles < 2:
                # The usual call: nothing compiled, one graph: no key.
                q = eng.calls_queue
                q.extend((owner, None, start, end, None))  # fields: see CALL_FIELDS
                if len(q) >= fold_at:  # checked on timed calls: at most time_every - 1 over
                    eng.calls.flush()
            else:
                _keyed_call(eng, owner, args, seq, start, end)
            if owner.library and owner.called_at is None:  # (once: its first timed call)
                first_call(eng.implicit._frames, owner, args, kwargs, sys._getframe(1))
            if owner.checks:  # its first calls: does its output feed the next?
                note_feedback(owner, args, out, state.checking)
            if owner is not state.step_owner:
                state.succeed(owner)  # (a second loop's step of the same name)
                if not state.step_named and owner is not state.step_owner:
                    state.step_candidate(owner)  # (timed calls only: the step's guess)
            else:
                # (thread CPU-time reads once a second; a call that compiled
                # waited for no queue)
                eng.thread_busy.tick(end, start, began if seqs[0] == seq else None)
            eng.device_times.offer(owner, start, given, out, end, behind)  # timed off this thread
            if owner.returned:  # a library's wrapper takes this call's span from its own
                owner.returned = clock()  # (and times the host work after its call)
            elif owner is state.step_owner:  # the user's host work to the next step
                eng.host_lines.after_step(end, owner.calls)  # (a clock compare)
        except Exception as e:  # noqa: BLE001 - a hook never raises into the program
            eng.rec.hook_failed("jax.jit", e)
        return out

    return call, timed_call


def _keyed_call(eng: JaxEngine, owner: Owner, args: tuple[Any, ...], seq: int, start: int,
                end: int) -> None:
    """A call that compiled, or of a function with several graphs: recorded
    with the graph it compiled or the key (shapes, dtypes) that picks it."""
    compiled = None
    context = eng.context
    if context.compile_seq[0] != seq:
        compiled = context.compiled_since(seq)
        if compiled is not None:
            owner.compiles += 1
            try:
                eng.implicit.jit_arguments.learn_nested(owner, args)
            except Exception as e:  # noqa: BLE001 - a hook never raises into the program
                eng.rec.hook_failed("jax.implicit", e)
    key = None
    if compiled is not None or owner.compiles > 1:
        key = tuple((getattr(a, "shape", None), getattr(a, "dtype", None)) for a in args)
    q = eng.calls_queue
    q.extend((owner, key, start, end, compiled))
    if len(q) >= FOLD_AT * CALL_FIELDS:
        eng.calls.flush()


# The wrapper's Python frames a numpy shard handler can run under.
_CALL_CODES = tuple(f.__code__
                    for f in _python_calls(lambda: None, Owner(""), JaxContext(), 1, 0))


def wrapper_codes() -> tuple[Any, ...]:
    """The codes of the wrapper's every call (host_lines.py: a counted call
    ends the interval it times) and of its timed call (eager_lines.py)."""
    return _CALL_CODES


def _owner_for(fun: object, jitted: object, options: dict[str, object], kind: str,
               context: JaxContext) -> Owner:
    """The one owner of ``fun`` jitted with ``options`` (``context.owners``)."""
    name = f"{kind}({getattr(jitted, '__name__', None) or getattr(fun, '__name__', 'fn')})"
    owners = context.owners
    try:
        by_options = owners.get(fun)
        if by_options is None:
            by_options = owners[fun] = {}
    except TypeError:  # not weakly referable (a builtin): its own owner
        return Owner(name)
    key = kind + repr(sorted(options.items())) if options else kind
    owner = by_options.get(key)
    if owner is None:
        if len(by_options) >= 64:
            by_options.clear()
        owner = by_options[key] = Owner(name)
        eng = context.active
        if eng is not None:
            owner.library = library_function(eng.implicit._frames, fun)
            if owner.library:
                owner.statics = static_arguments(fun, options)
    return owner


def wrap_jitted(jitted: Any, fun: object, options: dict[str, Any], kind: str,
                context: JaxContext) -> Any:
    """The counted stand-in for what ``jax.jit`` (``kind`` "jit") or
    ``jax.pmap`` ("pmap") returned (that object itself when it is not a
    jitted function)."""
    if not callable(jitted) or not hasattr(jitted, "lower"):
        return jitted
    owner = _owner_for(fun, jitted, options, kind, context)
    wrapper = counting(jitted, owner, context)
    for attr in (*getattr(jitted, "__dict__", {}), *_KEPT):
        try:
            setattr(wrapper, attr, getattr(jitted, attr))
        except (AttributeError, TypeError):
            continue
    wrapper._tpu_info_jitted = jitted  # type: ignore[attr-defined]  # metrics.track unwraps
    wrapper._tpu_info_owner = owner  # type: ignore[attr-defined]  # a library's wrapper pairs
    return wrapper


def hook_jit(original: Callable[..., Any], context: JaxContext) -> Callable[..., Any]:
    """The ``jax.jit`` installed in place of ``original``: the same call
    shapes (``jax.jit(f, ...)``, ``@jax.jit``, ``jax.jit(static_argnums=1)``
    as a decorator, ``functools.partial(jax.jit, ...)``)."""
    return _hooked(original, "jit", context)


def hook_pmap(original: Callable[..., Any], context: JaxContext) -> Callable[..., Any]:
    """The ``jax.pmap`` installed in place of ``original``: what it returns
    is counted like a jitted function (``pmap(f)`` in the ledger's calls; in
    JAX 0.10 its graph is a ``jit`` of shard_map)."""
    return _hooked(original, "pmap", context)


def _hooked(original: Callable[..., Any], kind: str, context: JaxContext) -> Callable[..., Any]:
    def transform(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        try:
            if not args:  # options only: JAX returned a decorator
                return _decorator(out, kwargs, kind, context)
            return wrap_jitted(out, args[0], kwargs, kind, context)
        except Exception as e:  # noqa: BLE001 - the user's jit/pmap must work unhooked
            context.hook_failed("jax.jit", e)
            return out

    _like(transform, original)
    return transform


def _decorator(decorate: Callable[..., Any], options: dict[str, Any],
               kind: str, context: JaxContext) -> Callable[..., Any]:
    def decorator(fun: object) -> Any:
        jitted = decorate(fun)
        try:
            return wrap_jitted(jitted, fun, options, kind, context)
        except Exception as e:  # noqa: BLE001
            context.hook_failed("jax.jit", e)
            return jitted

    _like(decorator, decorate)
    return decorator


def _like(wrapper: Callable[..., Any], original: Callable[..., Any]) -> None:
    for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
        try:
            setattr(wrapper, attr, getattr(original, attr))
        except (AttributeError, TypeError):
            continue
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]


_JIT_CODE = hook_jit(lambda: None, JaxContext()).__code__  # the installed jax.jit's


def blind_spots(hooked: dict[str, bool]) -> list[str]:
    """What the executions count misses, one sentence each (``hooked``:
    whether ``"jit"``, ``"pmap"`` and ``"aot"`` (``Compiled.__call__``)
    could be hooked at all)."""
    if not hooked.get("jit"):
        out = ["jax.jit could not be wrapped: calls of jitted functions are not counted "
               "(no executions, no inferred steps); metrics.track(step) counts them"]
    else:
        bound = _bound_before_install(hooked)  # this program's own: first, with the line
        out = [*bound,
               "Calls of functions jitted or pmapped before metrics.install() are not counted "
               "(their graphs show no executions): install first, or wrap them in "
               "metrics.track."]
        if not bound:
            out.append("jax.jit or jax.pmap reached through a name bound before install "
                       "(from jax import jit above metrics.install(), jax._src.api.jit, "
                       "libraries' own aliases) is not counted.")
    if not hooked.get("pmap"):
        out.append("jax.pmap could not be wrapped: calls of pmapped functions are not counted.")
    if not hooked.get("aot"):
        out.append("Calls of ahead-of-time compiled functions (f.lower(x).compile()(x)) are "
                   "not counted: jax.stages.Compiled.__call__ could not be hooked.")
    else:
        out.append("Calls of ahead-of-time compiled functions compiled before "
                   "metrics.install() are counted but not attributed to a graph.")
    return out


def _bound_before_install(hooked: dict[str, bool]) -> list[str]:
    """The user's module-level names still bound to JAX's own ``jit``/``pmap``
    (:mod:`metrics.engines.jax.bound`), one sentence each."""
    jax = sys.modules.get("jax")
    if jax is None:
        return []
    from metrics.engines._frames import frames_for, skip_prefixes
    from metrics.engines.jax import bound as jax_bound

    originals = {what: getattr(getattr(jax, what, None), "__wrapped__", None)
                 for what in ("jit", "pmap") if hooked.get(what)}
    frames = frames_for(skip_prefixes(jax, sys.modules.get("jaxlib")))
    return jax_bound.sentences(originals, frames)
