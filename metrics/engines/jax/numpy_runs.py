"""A jitted function's numpy arguments, counted in place while nothing changes.

A host-bound loop (``step(params, data[i:i + B], 0.01)``) hands the
``jax.jit`` wrapper numpy arguments on every step. Writing a record per
numpy leaf per call (two 8-field tuples a step) measured +6 to +9 us a step on
a TPU v5e host (a 0.56 ms step: 1-1.6 %), where the same writes cost 0.8 us
alone: after each dispatch the host's caches are the runtime's, and every
object touched is a miss (``bench/RESULTS-TPU.md``, issue 40). So consecutive
calls of one function from one line with the same numpy leaves (as many, the
same bytes) are one :class:`Run`, counted in place (a few integer stores on
one object, no allocation but the clock's); the run goes into the transfer
hook's site table, counters and byte distribution when a reader folds the
journal (:func:`fold_runs`, the journal's ``before``), or when the function
is called from another line or with other leaves. A run's calls share its
last call's time (``last_ns``) in the byte distribution's recent window.

Even that check, at every call, measured about 1 % of the TPU host's
0.56 ms step (``bench/tpu_hook_parts.py --off numpy``: 0.971 -> 0.982). So a
run that went on unchanged for :data:`STEADY` calls in a row is *steady*
(``Owner.numpy_steady``): the wrapper's untimed calls (15 in 16) skip the
check, and the next checked call (a timed one) first adds the calls since
the last check to the run (:func:`catch_up`: the owner's call count tells
how many), then checks its own. Any change seen at a check ends the steady
state, and the calls before it go to the run that was going on: at most 15
calls of a change (a loop over another line, or device arrays in place of
numpy) are counted as the run's, and a reader's fold sees up to 15 of the
latest calls late.

Example:
    >>> import jax, numpy as np, metrics                     # doctest: +SKIP
    >>> metrics.install()                                    # doctest: +SKIP
    >>> f = jax.jit(lambda x: x + 1)                         # doctest: +SKIP
    >>> for i in range(100): f(np.ones(4))   # one run: 100 transfers of 32 B  # doctest: +SKIP
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from numpy import ndarray as _NDARRAY

from metrics.engines.jax.sites import Steps

if TYPE_CHECKING:
    from types import CodeType

    from metrics.engines.jax.calls import Owner
    from metrics.engines.jax.implicit import ImplicitTransfers

Report = Callable[["Owner", tuple[Any, ...], int], None]
MAX_OPEN = 1024  # runs waiting for a fold before the training thread folds them
STEADY = 64  # checks in a row of one run before its untimed calls go unchecked


class Run:
    """One owner's consecutive calls from one line with the same numpy leaves."""

    __slots__ = ("owner", "home", "code", "lasti", "leaves", "per_call", "sizes",
                 "calls", "steps", "first_at", "last_at", "first_ns", "last_ns",
                 "done_calls", "done_steps", "done_ns", "checked", "streak")

    def __init__(self, owner: Owner, home: list[Run], code: CodeType, lasti: int,
                 sizes: list[int], step: Any, now: int) -> None:
        # ``home``: the open runs of the hook that made it (a function jitted
        # before an uninstall and called after a new install starts a new run)
        self.owner, self.home, self.code, self.lasti = owner, home, code, lasti
        self.sizes, self.leaves, self.per_call = sizes, len(sizes), sum(sizes)
        # Its calls and the steps they ran in (a step counts each time the
        # index changes: the step function's calls, or with none known the
        # call's time, so each call is its own, as a record's step field);
        # the step of the first call since the last fold (``last_at`` None
        # after a fold: that call counts as a change).
        self.calls = self.steps = 1
        self.first_at: int = step.calls if step is not None else now
        self.last_at: int | None = self.first_at
        self.first_ns = self.last_ns = now
        self.done_calls = self.done_steps = self.done_ns = 0  # what folds took so far
        self.checked = owner.calls  # the owner's call count at its latest check
        self.streak = 0  # checks in a row that found it going on (STEADY: steady)


def writer(transfers: ImplicitTransfers, runs: list[Run],
           walked: Callable[[Owner, tuple[Any, ...]], None], user_class: int,
           nested_bytes: Callable[[tuple[Any, ...], Any], list[int]]) -> Report:
    """``write(owner, args, depth)``: one call's numpy arguments at the
    wrapper's caller, ``depth`` frames above ``write``'s. The usual call
    (the owner's run goes on) reads the frame, sums the leaves' bytes and
    bumps the run; a new line or other leaves start a run (the caller's code
    classified as the user's, decided once per code object: else
    ``walked``, the frame walk's records). What it reads is bound once."""
    get, getframe, clock, context = transfers._codes.get, sys._getframe, time.monotonic_ns, \
        transfers.context
    ndarray = _NDARRAY

    def write(owner: Owner, args: tuple[Any, ...], depth: int) -> None:
        try:
            f = getframe(depth)
        except ValueError:  # fewer frames above than the wrapper's usual caller (from C)
            return walked(owner, args)
        if owner.numpy_steady:  # the calls since the latest check first: the run's
            catch_up(owner, context.step_owner)
        k = total = 0
        for a in args:
            if type(a) is ndarray:  # (not a subclass: as the walked path)
                k += 1
                total += a.nbytes
        nested = owner.nested_numpy
        if nested:  # one transfer per leaf, as the transfer guard logs them
            for n in nested_bytes(args, nested):
                k += 1
                total += n
        if not k:
            owner.numpy_steady = False
            return None
        run, step = owner.numpy_run, context.step_owner
        if (run is not None and run.code is f.f_code and run.lasti == f.f_lasti
                and run.per_call == total and run.leaves == k and run.home is runs):
            run.calls += 1
            run.checked = owner.calls
            run.streak += 1
            # Steady only where its calls are its steps (the step function, or
            # none known): another function's unchecked calls could not be
            # put in the steps they ran in (an evaluation's batches, 30 steps
            # apart, would read as 30 steps each).
            if run.streak >= STEADY and (step is owner or step is None):
                owner.numpy_steady = True
            now = run.last_ns = clock()
            at = step.calls if step is not None else now
            if at != run.last_at:  # another step (or the first call since a fold)
                if run.last_at is None:
                    run.first_at = at
                run.steps += 1
                run.last_at = at
            return None
        owner.numpy_steady = False
        code = f.f_code
        if get(id(code)) != user_class:
            return walked(owner, args)
        owner.numpy_args = True  # (from _BY_HANDLER too: each later call is counted)
        sizes = [a.nbytes for a in args if type(a) is ndarray]
        if nested:
            sizes += nested_bytes(args, nested)
        owner.numpy_run = new = Run(owner, runs, code, f.f_lasti, sizes, step, clock())
        runs.append(new)
        if len(runs) >= MAX_OPEN:
            transfers.journal.flush()
        return None

    return write


def catch_up(owner: Owner, step: Any) -> None:
    """A steady owner's untimed calls since its run's latest check, added to
    the run, on the training thread: the owner's call count, this call's
    included, less the count at that check, less this call. ``step``: the
    step function (a run's steps are its call indexes; None: each call is
    its own step, as :func:`writer`'s)."""
    run = owner.numpy_run
    if run is None:
        owner.numpy_steady = False
        return
    skipped = owner.calls - 1 - run.checked
    if skipped <= 0:
        return
    run.calls += skipped
    run.checked += skipped
    if step is None or step is owner:  # each call its own step
        run.steps += skipped
        if step is owner:
            unfolded = run.calls - run.done_calls  # (a reader's fold may have taken them)
            if run.last_at is not None:
                run.last_at = run.checked
            elif unfolded > 0:  # the first call since a fold: counted as a change
                run.first_at, run.last_at = run.checked - unfolded + 1, run.checked
    elif run.last_at is not None and step.calls != run.last_at:  # (the step named since:
        run.steps += 1  # its calls all taken as in the step now, the fewest)
        run.last_at = step.calls
    owner.numpy_steady = step is None or step is owner


def fold_runs(transfers: ImplicitTransfers, runs: list[Run], kind: int) -> None:
    """Each open run's calls since the last fold into the site table, the
    implicit-transfer counters and the outbound byte distribution (the
    journal's ``before``: under its lock, on whichever thread folds); a run
    its owner left behind is dropped once folded."""
    n = len(runs)
    if not n:
        return
    try:
        batch = runs[:n]
        keep = [r for r in batch if _fold_one(transfers, r, kind)]
        runs[:n] = keep  # (the training thread only appends: past n)
    except Exception as e:  # noqa: BLE001 - a fold runs inside the program
        transfers.rec.hook_failed("jax.numpy_runs", e)


def _fold_one(transfers: ImplicitTransfers, run: Run, kind: int) -> bool:
    """Folds ``run``'s new calls; whether it is still its owner's run."""
    current = run.owner.numpy_run is run
    calls, steps, first_at, last_at, last_ns = _with_unchecked(run, transfers.context.step_owner)
    new = calls - run.done_calls
    if new <= 0 or last_at is None:
        return current
    # The steps its calls since the last fold ran in, as grouped_steps says
    # a batch's (the first call counts; the site takes one off when that
    # step is the one it saw last).
    spans = Steps(steps - run.done_steps, first_at, last_at)
    first_end = run.done_ns if run.done_calls else run.first_ns
    k, sizes = run.leaves, run.sizes
    with transfers._lock:
        transfers._add_site(kind, run.code, run.lasti, run.owner.numpy_label, new * k,
                            new * run.per_call,
                            0, last_ns, first_end, spans)
    transfers._implicit_h2d.inc(new * k)
    transfers._implicit_out.inc(new * run.per_call)
    transfers._outbound.observe_weighted(sizes, [new] * k, [last_ns] * k)
    run.done_calls, run.done_steps, run.done_ns, run.last_at = calls, steps, last_ns, None
    return current


def _with_unchecked(run: Run, step: Any) -> tuple[int, int, int, int | None, int]:
    """``run``'s (calls, steps, first_at, last_at, last_ns) with a steady
    owner's unchecked calls counted as its (when its steps are its calls or
    none is known): a reader's fold is exact; the training thread's next
    check adds them to the run itself (:func:`catch_up`), up to what was
    folded. Their steps otherwise wait for that check."""
    owner = run.owner
    calls, steps, first_at, last_at, last_ns = (run.calls, run.steps, run.first_at,
                                                run.last_at, run.last_ns)
    if owner.numpy_steady and owner.numpy_run is run and (step is None or step is owner):
        pending = owner.calls - run.checked
        if pending > 0:
            calls, steps = calls + pending, steps + pending
            if step is None:
                first_at, last_at = (last_ns if last_at is None else first_at), last_ns
            else:
                first_at = run.checked + 1 if last_at is None else first_at
                last_at = owner.calls
    return calls, steps, first_at, last_at, last_ns


def forget_runs(runs: list[Run], step: Any) -> None:
    """Marks every open run folded (the site table was cleared); ``step``:
    the step function (:func:`_with_unchecked`)."""
    for run in runs[:]:
        run.done_calls, run.done_steps, _, _, run.done_ns = _with_unchecked(run, step)
        run.last_at = None
