"""Numpy arguments of jitted calls: the host->device copies JAX makes in C++.

On one device JAX moves a numpy argument of a jitted call in C++, where no
hook sees it; the ``jax.jit`` wrapper (:mod:`metrics.engines.jax.calls`)
hands such calls' arguments to :class:`JitArguments`, which writes one
untimed implicit transfer per numpy leaf (top-level, or nested in tuples,
NamedTuples, lists and dicts: one per leaf, as JAX's transfer guard logs
them) into the transfer hook's journal
(:class:`~metrics.engines.jax.implicit.ImplicitTransfers`), at the user's
line. A host-bound loop (``step(params, data[i:i + B], 0.01)``) runs this on
every step, so the usual call is counted in place on the function's run
(:mod:`metrics.engines.jax.numpy_runs`: consecutive calls from one line with
the same leaves); only a call from a library's frame walks.

What the copy costs is measured, never assumed, on the path the program
uses (JAX's C++ dispatch copies a numpy argument inside the call): the
wrapper's timed calls with numpy arguments alternate between calls JAX
copies for (timed whole) and samples whose arguments the wrapper put on the
device first (timed on device arrays: its first ``COPIES_FIRST`` such
samples, then at most one every ``COPY_SPACING_NS``). The difference of the
two medians is what the copies add to a call (:func:`copy_ns`); each sample's
numpy leaves are records at the user's line timed at that (shared by bytes,
:meth:`JitArguments.timed`); the rest stay untimed, and the site says how
many of its records were timed (``SiteReading.timed``). A put on JAX's
Python path, timed alone, measured 5-8x the copy's cost on the CPU: not used.

Example:
    >>> import jax, numpy as np, metrics                     # doctest: +SKIP
    >>> metrics.install()                                    # doctest: +SKIP
    >>> f = jax.jit(lambda x: x + 1)                         # doctest: +SKIP
    >>> f(np.ones(4))          # an implicit transfer of 32 bytes at this line  # doctest: +SKIP
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Hashable, Sequence
from types import CodeType
from typing import TYPE_CHECKING, Any

from numpy import ndarray as _NDARRAY

from metrics.engines.jax import numpy_runs
from metrics.engines.jax.calls import _CALL_CODES, _JIT_CODE, Path

if TYPE_CHECKING:
    from metrics.engines.jax.calls import Owner
    from metrics.engines.jax.implicit import ImplicitTransfers

Report = numpy_runs.Report
# The transfer hook's record kinds of an implicit host->device copy, timed and not.
IMPLICIT_H2D, UNTIMED_H2D = 1, 4

NESTED_DEPTH = 4  # container levels searched for numpy leaves when a call compiles
NESTED_LEAVES = 64  # numpy leaf paths kept per function


def numpy_paths(args: tuple[object, ...]) -> tuple[Path, ...]:
    """Index paths of numpy arrays nested in tuple/list/dict arguments
    (NamedTuples and dict subclasses too: pytrees JAX flattens; not top-level
    ones, which each call checks itself); run when a call compiled."""
    found: list[Path] = []

    def walk(x: Any, path: Path) -> None:  # any pytree the user passes
        if len(found) >= NESTED_LEAVES or len(path) > NESTED_DEPTH:
            return
        if type(x) is _NDARRAY:
            if len(path) > 1:
                found.append(path)
        elif isinstance(x, (tuple, list)):  # a NamedTuple batch is a tuple
            for i, v in enumerate(x):
                walk(v, (*path, i))
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, (*path, k))

    for i, a in enumerate(args):
        walk(a, (i,))
    return tuple(found)


def nested_numpy_bytes(args: tuple[object, ...], paths: tuple[Path, ...]) -> list[int]:
    """Bytes of each numpy leaf at ``paths`` in this call's arguments (one
    entry per leaf found: each is its own transfer)."""
    found = [x.nbytes for x in leaves_at(args, paths) if type(x) is _NDARRAY]
    return found


class JitArguments:
    """The one owner of "a numpy argument of a jitted call" (one per
    :class:`~metrics.engines.jax.implicit.ImplicitTransfers`).

    On one device JAX moves a numpy argument of a jitted call in C++, where
    no hook sees it, so the ``jax.jit`` wrapper hands each call's arguments
    here (:attr:`report`: top-level numpy ones, nested ones at the paths
    learnt when a call compiled), on every call of a function known to take
    numpy (``Owner.numpy_args``). It learns that (the usual call checks one
    attribute, not its arguments) on a timed call, which checks the
    arguments' types, or when the numpy shard handler runs under the
    wrapper: the first numpy argument of a function misses JAX's C++ cache
    and goes through it, and the frame walk counts that call and sets the
    flag. A compiling call, or one on several devices, also passes numpy
    arguments through the handler; the frame walk drops those records when
    the function's flag is set (:meth:`reported_under`), since
    :attr:`report` counted them.

    Attributes:
        report: ``report(owner, args, depth)``: one call's numpy arguments,
            each an untimed implicit transfer at the line that called the
            wrapper (``depth`` frames above ``report``'s). It runs on every
            call of a function that takes numpy, so when that frame is the
            user's (decided once per code object) it counts the call on the
            function's run (:func:`~metrics.engines.jax.numpy_runs.writer`),
            no walk, no record; else :meth:`report_walked`.
    """

    def __init__(self, transfers: ImplicitTransfers, user_class: int, kind: int) -> None:
        # (the transfer hook's class of a user's frame and its record kind for
        # an untimed host->device transfer: it owns both)
        self._transfers = transfers
        self.runs: list[numpy_runs.Run] = []  # open runs, folded with the journal
        self.report: Report = numpy_runs.writer(transfers, self.runs, self.report_walked,
                                                user_class, nested_numpy_bytes)
        transfers.journal.before = lambda: numpy_runs.fold_runs(transfers, self.runs, kind)

    def forget(self) -> None:
        """The runs' calls so far dropped (the site table was cleared)."""
        numpy_runs.forget_runs(self.runs, self._transfers.context.step_owner)

    @staticmethod
    def reported_under(code: CodeType) -> bool:
        """Whether a frame of ``code`` is a jax.jit wrapper's call (whose
        numpy arguments :attr:`report` counted)."""
        return code is _CALL_CODES[0] or code is _CALL_CODES[1]

    @staticmethod
    def jit_hooked() -> bool:
        """Whether ``jax.jit`` is the hook's wrapper now."""
        import jax

        return getattr(jax.jit, "__code__", None) is _JIT_CODE

    @staticmethod
    def counted_in_handler(owner: Owner) -> bool:
        """Whether the numpy shard handler, running under ``owner``'s wrapper,
        counts this call's numpy arguments: yes when the wrapper did not know
        the function takes them (its first numpy call, a C++ cache miss:
        each of its numpy leaves passes here); then it knows."""
        if owner.numpy_args is _BY_HANDLER:  # the same call's next leaf
            return True
        if owner.numpy_args:
            return False
        owner.numpy_args = _BY_HANDLER
        return True

    def report_walked(self, owner: Owner, args: tuple[Any, ...]) -> None:
        """:attr:`report` where the wrapper's caller is not known to be the
        user's frame (a library's, or one not classified yet): each record
        walks out to the user's line."""
        owner.numpy_args = True
        label = owner.numpy_label
        host = self._transfers.host_arguments
        for a in args:
            if type(a) is _NDARRAY:
                host(a.nbytes, label)
        if owner.nested_numpy:
            for n in nested_numpy_bytes(args, owner.nested_numpy):
                host(n, label)

    def timed(self, owner: Owner, args: tuple[Any, ...], depth: int) -> tuple[Any, ...]:
        """A sampled call's numpy arguments put on the device here, so the
        wrapper times the call on device arrays (``Owner.copy_stats``); returns
        the arguments with the device arrays in their place (the call does
        not copy them again). Each numpy leaf is a record at the caller's line
        (``depth`` frames above this one; top-level, or nested at the places
        known) timed at what the copies cost the call on JAX's own path: the
        median host time of the function's calls whose numpy arguments JAX
        copied less that of its calls on put arrays (medians: :func:`copy_ns`),
        shared by bytes; untimed until each stands on MIN_COPY_CALLS calls."""
        put = _put()
        owner.numpy_args = True  # (the stage hook drops its record of these under the wrapper)
        try:
            frame = sys._getframe(depth)
        except ValueError:  # fewer frames above (called from C): no user line
            frame = None
        out, sizes, puts = list(args), [], []
        began = time.monotonic_ns()
        for i, a in enumerate(args):
            if type(a) is _NDARRAY:
                out[i] = put_a = put(a)
                puts.append(put_a)
                sizes.append(a.nbytes)
        if owner.nested_numpy:  # each leaf its own record, as the transfer guard logs them
            for path in owner.nested_numpy:
                x: Any = args
                try:
                    for k in path:
                        x = x[k]
                except (IndexError, KeyError, TypeError):
                    continue
                if type(x) is _NDARRAY:
                    y = put(x)
                    puts.append(y)
                    out[path[0]] = _replaced(out[path[0]], path[1:], y)
                    sizes.append(x.nbytes)
        if _PUT_WAITS[0]:  # the call then runs on arrays at rest, as a program's own puts are
            for y in puts:
                y.block_until_ready()
        end = time.monotonic_ns()  # one end for the call's records: one step occurrence
        # The label from what this call sends (a first call's numpy parameters,
        # float64, are on the device after it: the batches decide from then on).
        owner.numpy_label = label_of(owner.name, float64_sent(args, owner.nested_numpy))
        ns = copy_ns(owner.copy_stats)
        if ns is not None:  # at most what the same copies took put on their own here
            ns = min(ns, end - began)
        total = sum(sizes) or 1
        for nbytes in sizes:
            if ns is None:
                self._transfers.record(UNTIMED_H2D, frame, end, end, nbytes, owner.numpy_label)
            else:
                share = ns * nbytes // total
                self._transfers.record(IMPLICIT_H2D, frame, end - share, end, nbytes,
                                       owner.numpy_label)
        return tuple(out)

    def learn_nested(self, owner: Owner, args: tuple[Any, ...]) -> None:
        """After a call that compiled: where its nested numpy leaves are, and
        those at new places counted for this call (unless the numpy shard
        handler counted the whole call); whether one is float64 that JAX
        turns into float32 (its records then say so). Once per compile, so
        the tree walk stays off the hot path."""
        was, owner.nested_numpy = owner.nested_numpy, numpy_paths(args)
        # Decided again at each compile: a first call's float64 parameters do
        # not make the later float32 batches float64.
        owner.numpy_label = label_of(owner.name, float64_sent(args, owner.nested_numpy))
        by_handler = owner.numpy_args is _BY_HANDLER
        if owner.nested_numpy or by_handler:
            owner.numpy_args = True
        if by_handler:
            return
        new = tuple(p for p in owner.nested_numpy if p not in was)
        for n in nested_numpy_bytes(args, new) if new else ():
            self._transfers.host_arguments(n, owner.numpy_label)


MIN_COPY_CALLS = 4  # timed calls each way before a copy's cost is said
FLOAT64_WORD = "float64"  # in a record's detail: the views' advice reads it


def label_of(name: str, float64: bool) -> str:
    """A numpy argument's record label: with the dtype where it is float64."""
    return f"numpy {FLOAT64_WORD} argument of {name}" if float64 else f"numpy argument of {name}"


def relabelled(old: str, new: str) -> str:
    """A site's label once newer records say ``new``: the dtype they name
    where only that differs (a float64 first call, float32 batches after)."""
    return new if undtyped(new) == undtyped(old) else old


def undtyped(detail: str) -> str:
    """A numpy argument's label without its dtype (a site keeps the latest)."""
    return detail.replace(FLOAT64_WORD + " ", "", 1)


def float64_sent(args: tuple[Any, ...], nested: tuple[Path, ...]) -> bool:
    """Whether a numpy leaf of ``args`` (top-level, or at ``nested``) is
    float64 while JAX runs in float32 (x64 off: it converts on every call)."""
    import jax

    if jax.config.read("jax_enable_x64"):
        return False
    leaves = [*args, *leaves_at(args, nested)]
    return any(type(x) is _NDARRAY and x.dtype.char == "d" for x in leaves)


def leaves_at(args: tuple[Any, ...], paths: tuple[Path, ...]) -> list[Any]:
    """What sits at each of ``paths`` in ``args`` (a path that no longer
    leads anywhere is skipped)."""
    out = []
    for path in paths:
        x: Any = args
        try:
            for k in path:
                x = x[k]
        except (IndexError, KeyError, TypeError):
            continue
        out.append(x)
    return out


def copy_ns(stats: tuple[Sequence[int], Sequence[int], Any]) -> int | None:
    """What one call's numpy copies cost on JAX's path, in ns: the median host
    time of the latest calls whose numpy arguments JAX copied less that of
    calls on arrays put first (``Owner.copy_stats``: medians, since a call's
    first run on a new kind of argument is slow); None on fewer calls either way."""
    jax_copied, put_first = stats[0], stats[1]
    if len(jax_copied) < MIN_COPY_CALLS or len(put_first) < MIN_COPY_CALLS:
        return None
    return max(0, _median(jax_copied) - _median(put_first))


def _median(values: Sequence[int]) -> int:
    s = sorted(values)
    return s[len(s) // 2]


_PUT: list[Callable[[Any], Any]] = []
# Whether a sample waits for its puts before the call (decided with _PUT).
# Not on the CPU backend, which runs a transfer behind the queued executions:
# a wait there is a drain of the device's work. On a TPU v5e a call made
# right after its arguments' puts, not waited for, ran as slow as the call
# that copied them (an nnx.jit step 1,542 against 1,428 us, where the same
# step on device batches takes 1,038: the copies' host work is still going);
# the A/B's other arm has its batches on the device long before.
_PUT_WAITS = [False]


def _put() -> Callable[[Any], Any]:
    """A numpy array onto the default device as the jitted call's own copy is
    made: a host->device transfer alone (JAX's ``batched_device_put_impl``,
    copying the host buffer before it returns as the call's C++ dispatch does,
    no executable queued, not marked an explicit ``device_put``); else
    ``jnp.asarray``. Waited for (:data:`_PUT_WAITS`) except on the CPU
    backend, where a wait would hold the device's queued work too."""
    if not _PUT:
        import jax

        _PUT_WAITS[0] = jax.default_backend() != "cpu"
        put: Callable[[Any], Any]
        try:
            from jax._src import dispatch

            impl, copy = dispatch.batched_device_put_impl, (
                dispatch.ArrayCopySemantics.ALWAYS_COPY,)

            def batched(x: Any) -> Any:
                return impl(x, devices=(None,), srcs=(None,), copy_semantics=copy)[0]

            put = batched
        except (ImportError, AttributeError):
            import jax.numpy as jnp

            put = jnp.asarray
        _PUT.append(put)
    return _PUT[0]


def _replaced(tree: Any, path: tuple[Hashable, ...], value: object) -> Any:
    """``tree`` with the leaf at ``path`` (through tuples, lists, dicts) set
    to ``value``; the containers on the way are copies of their own type (a
    NamedTuple stays one: the function reads its fields by name)."""
    if not path:
        return value
    k, rest = path[0], path[1:]
    if isinstance(tree, dict):
        out = dict(tree)
        out[k] = _replaced(tree[k], rest, value)
        return out if type(tree) is dict else type(tree)(out)
    if not isinstance(k, int):  # a sequence's index (the walk found an int here)
        raise TypeError(f"index {k!r} into {type(tree).__name__}")
    items = list(tree)
    items[k] = _replaced(items[k], rest, value)
    if isinstance(tree, list):
        return items if type(tree) is list else type(tree)(items)
    return type(tree)._make(items) if hasattr(tree, "_make") else type(tree)(items)


# Owner.numpy_args while the numpy shard handler has counted the call it
# learnt of them in (truthy: later calls are checked); the next report() or
# learn_nested() sets it to True.
_BY_HANDLER = "first numpy arguments counted by the numpy shard handler"


