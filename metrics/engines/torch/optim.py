"""The training step of a PyTorch program: its optimizer's steps.

An optimizer step is one update of the weights, whatever the program does
around it: gradient accumulation calls the model several times per step
(nanoGPT: ``gradient_accumulation_steps`` forwards and backwards), an eager
program calls no compiled graph at all. The hook is torch's global
``register_optimizer_step_post_hook`` (torch 2.0 on: every optimizer,
whenever it was made): one clock read and one journal append per step,
folded before a read into per-optimizer counts and the step loop's bounds;
and that clock read against a due time: once a second the share of the
time since that the training thread waited for a core
(``TrainingThreadRunQueue``: a loaded machine's slow steps are its own).

When the program marks no step (``metrics.mark_step``, or a lazy-tensor
engine's own ``mark_step``), the intervals between one optimizer's steps are
also its ``StepTime`` samples, so the views' outlier rule sees rare slow
steps (checkpoints, evaluation every N steps); and the first optimizer's
intervals are where :mod:`~metrics.engines.torch.gaps` finds the work between
steps (``model.eval()``, ``torch.save``) and what it took beyond the usual step.

A program that updates its weights by hand (``p.data.add_(p.grad, alpha=-lr)``,
pytorch/examples' word_language_model) steps no optimizer: its steps are then
its ``backward()`` calls (``torch.autograd.backward`` wrapped: one clock read
and one append per call), said so in the basis, and the intervals between
them are where the gaps are found, while no optimizer has stepped (the
first optimizer's step takes them over); an optimizer that steps
:data:`~metrics.recording.callstats.MIN_CALLS` times always wins over them,
and one that stepped fewer times is named in the basis.

A closure optimizer (``LBFGS.step(closure)``: pytorch/examples'
time_sequence_prediction) calls ``backward()`` inside its own step, about
20 times a step: those calls are told apart (the global step pre-hook sets
a flag the post-hook clears: one store each) and are no steps of the loop;
such an optimizer's steps are the loop's at any count (each one computed
gradients: no guess), its closure's calls said in the basis.

After the first optimizer's steps (``backward()``'s while none has stepped),
a sampled interval of the user's host work to the next step begins when one
is due (:mod:`metrics.engines.torch.host_lines`; a clock compare a step).

A step inside a compiled function (``torch.compile(opt.step)``) is not
counted: Dynamo would trace the hook's clock read and break the graph, so
the hook returns at once while compiling, and those steps are told by the
compiled graph's calls instead (:mod:`metrics.engines.torch.compile.steps`).

Example:
    >>> from metrics.recording.recorder import Recorder
    >>> steps, sgd = OptimizerSteps(Recorder()), type("SGD", (), {})()
    >>> for i in range(12):  # what the hook appends: 12 steps, one a second
    ...     steps.queue.extend((sgd, (i + 1) * 10**9))
    >>> s = steps.steps(); s.count, s.seconds_total, s.basis
    (12, 12.0, 'optimizer.step(): 12 calls (SGD)')
"""

from __future__ import annotations

import functools
import itertools
import operator
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from metrics.engines.torch.gaps import StepGaps
from metrics.engines.torch.unused_grads import UnusedGrads
from metrics.recording.callstats import MIN_CALLS
from metrics.recording.journal import FOLD_AT
from metrics.recording.recorder import Recorder
from metrics.recording.thread_busy import ThreadBusy
from tpu_info.contract import catalog as names
from tpu_info.contract.model import STEPS_INFERRED, StepsReading

if TYPE_CHECKING:
    from torch.optim import Optimizer
    from torch.utils.hooks import RemovableHandle

    from metrics.engines.host_lines import HostLines

FIELDS = 2  # a step in the journal: (optimizer, end in monotonic ns)
MAX_OPTIMIZERS = 64  # optimizers kept apart; later ones are not counted
# Engines whose own mark_step marks the steps (their MarkStep counters).
_MARKING_MODULES = ("torch_xla", "torch._lazy.ts_backend")


class _Backward:
    """Stands for ``backward()`` calls in the journal (not an optimizer)."""


class _Closure:
    """Stands for ``backward()`` calls inside an optimizer's step (its closure)."""


class _Ended:
    """Stands for the program's end in the journal (its fold closes the last gap)."""


BACKWARD = _Backward()
CLOSURE = _Closure()
ENDED = _Ended()
_NOT_OPTIMIZERS = (id(BACKWARD), id(CLOSURE))
TAKEOVER = 3  # a new optimizer's steps, none of the primary's between, before it takes over


class _Optimizer:
    """Steps of one optimizer: count, the first and latest step's end
    (monotonic ns)."""

    __slots__ = ("name", "calls", "first", "last")

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0
        self.first: int | None = None
        self.last = 0


class OptimizerSteps:
    """Every optimizer step of the process while installed (one per engine)."""

    def __init__(self, recorder: Recorder) -> None:
        self.rec = recorder
        self.by_id: dict[int, _Optimizer] = {}
        self.primary: int | None = None  # the first optimizer that stepped: StepTime's
        # Whose intervals the gaps are taken from: the primary optimizer's, else
        # (none stepped yet) backward()'s; None before either.
        self.gaps_of: int | None = None
        self.step_base = 0  # steps of the optimizers the gaps were taken from before
        self.step_time_fed = 0  # intervals given to StepTime
        self.folded = 0  # steps (and backward() calls) folded: read per tensor read
        self._step_time = recorder.distribution(names.STEP_TIME)  # kept across resets
        self.gaps = StepGaps()  # the work between the primary optimizer's steps
        # The user's host work between the steps (host_lines.py), where the
        # engine samples it; the first optimizer that stepped (its steps are
        # the intervals' ends; backward()'s while none has).
        self.host_lines: HostLines | None = None
        self.first_stepped: list[object] = [None]
        # Parameters backward() gives gradients no optimizer steps (one check).
        self.unused = UnusedGrads()
        self.gaps.to_unix = recorder.mono_to_unix
        self._handle: RemovableHandle | None = None
        self._pre_handle: RemovableHandle | None = None
        # The optimizer whose step is running (its pre-hook ran, its post-hook
        # not yet): a backward() meanwhile is its closure's. One slot.
        self.inside: list[object] = [None]
        # torch.autograd.backward as it was, while wrapped.
        self._backward: Callable[..., None] | None = None
        self.journal = recorder.journal(self._fold)
        self.queue = self.journal.queue
        self.gaps.flush = self.journal.flush  # notes fold the steps, not drop unfolded
        # Whether the machine's other work holds the training thread off the
        # cores: ticked at the steps (a clock compare a step; a second apart,
        # a schedstat read), what slow_steps reads a loaded machine from.
        self.busy = ThreadBusy(None, loaded=lambda percent, at: recorder.distribution(
            names.TRAINING_THREAD_RUN_QUEUE).observe_at(percent, at))
        recorder.on_reset(self.clear)

    # Install ---------------------------------------------------------------

    def install(self, degraded: list[str]) -> None:
        """Registers the global post-step hook (idempotent); the reason goes
        to ``degraded`` when torch has none."""
        if self._handle is not None:
            return
        try:
            import torch
            from torch.optim.optimizer import (
                register_optimizer_step_post_hook,
                register_optimizer_step_pre_hook,
            )
        except ImportError as e:
            degraded.append(f"torch.optim has no global step hook ({e}): steps come from "
                            "compiled graphs only")
            return
        compiling = torch.compiler.is_compiling
        self._pre_handle = register_optimizer_step_pre_hook(_pre_hook(self, compiling))
        self._handle = register_optimizer_step_post_hook(_hook(self, compiling))
        original = torch.autograd.backward
        torch.autograd.backward = _backward_hook(self, original, torch.compiler.is_compiling)
        self._backward = original

    def uninstall(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.remove()
        pre, self._pre_handle = self._pre_handle, None
        if pre is not None:
            pre.remove()
        self.inside[0] = None
        original = self._backward
        self._backward = None
        if original is not None:
            import torch

            wrapped_now = getattr(torch.autograd.backward, "__wrapped__", None) is original
            if wrapped_now:  # not wrapped again by someone since
                torch.autograd.backward = original

    @property
    def installed(self) -> bool:
        return self._handle is not None

    # Fold ------------------------------------------------------------------

    def _fold(self, flat: list[Any]) -> None:
        optimizers, ends = flat[0::FIELDS], flat[1::FIELDS]
        ended = ENDED in optimizers
        if ended:
            keep = [o is not ENDED for o in optimizers]
            optimizers = list(itertools.compress(optimizers, keep))
            ends = list(itertools.compress(ends, keep))
        self.folded += len(ends)
        if ends:
            self._fold_steps(optimizers, ends)
        if ended:  # after the steps noted before it, under the journal's lock
            entry = self.by_id.get(self.gaps_of) if self.gaps_of is not None else None
            if entry is not None and entry.first is not None:
                self.gaps.close_open(entry.last, entry.calls)

    def _fold_steps(self, optimizers: list[Any], ends: list[int]) -> None:
        uniq = set(map(id, optimizers))
        if len(uniq) == 1:
            groups = [(optimizers[0], ends)]
        else:
            ids = list(map(id, optimizers))
            groups = []
            for key in uniq:
                mask = list(map(operator.eq, ids, itertools.repeat(key)))
                groups.append((next(itertools.compress(optimizers, mask)),
                               list(itertools.compress(ends, mask))))
        # Optimizers first: one that steps in this batch takes the gaps over
        # from backward() before backward()'s calls are folded.
        # (then in the order they began: the first to step is the primary)
        groups.sort(key=lambda g: (id(g[0]) in _NOT_OPTIMIZERS, g[1][0]))
        last = {id(o): t[-1] for o, t in groups}
        for opt, times in groups:
            key = id(opt)
            entry = self.by_id.get(key)
            if entry is None:
                if len(self.by_id) >= MAX_OPTIMIZERS:
                    continue
                entry = self.by_id[key] = _Optimizer(type(opt).__name__)
                if self.primary is None and key not in _NOT_OPTIMIZERS:
                    self.primary = key
            primary = self.primary
            old = self.by_id.get(primary) if primary is not None else None
            if (old is not None and primary is not None and key != primary
                    and key not in _NOT_OPTIMIZERS
                    and (entry.first or times[0]) > max(old.last, last.get(primary, 0))
                    and entry.calls + len(times) >= TAKEOVER):
                self._succeed(key)
            if self.primary is not None and self.gaps_of != self.primary:
                if self.gaps_of is not None:  # backward()'s until now: set-up for the optimizer
                    self.gaps.restart()
                self.gaps_of = self.primary
            elif self.gaps_of is None and opt is BACKWARD:
                self.gaps_of = key  # no optimizer stepped: backward()'s intervals
            if key == self.primary or key == self.gaps_of:
                prev = [entry.last] if entry.first is not None else []
                marks = prev + times
                if key == self.primary and self._feeds_step_time():
                    self._step_time.observe_many(
                        list(map(operator.sub, marks[1:], marks[:-1])), marks[1:])
                    self.step_time_fed += len(marks) - 1
                if key == self.gaps_of:  # evaluation, checkpoints
                    self.gaps.intervals(marks, self.step_base + max(1, entry.calls))
            if entry.first is None:
                entry.first = times[0]
            entry.calls += len(times)
            entry.last = max(entry.last, times[-1])

    def _succeed(self, key: int) -> None:
        """A new optimizer that has stepped TAKEOVER times, all after the
        primary's last step (a program that builds a new model and optimizer
        for each run: pyg's GAT benchmark, two runs; the transfer learning
        tutorial, two models): its steps are the loop's now, numbered on from
        the old one's. The work between (the old run's end, the new one's
        set-up) is in no gap: the old one's last gap held all of the second
        run before (27 s said as per-step evaluation, truth 3 s)."""
        gone = self.by_id.get(self.gaps_of) if self.gaps_of is not None else None
        self.step_base += gone.calls if gone is not None else 0
        self.primary = self.gaps_of = key

    def close_if_ended(self) -> None:
        """When the program has ended (its main thread is done: the read is
        the saved run's or the summary's), the work after its last step is
        a last gap, closed at its last noted call
        (:meth:`~metrics.engines.torch.gaps.StepGaps.close_open`). While it
        runs, nothing: that work may still be going on."""
        if threading.main_thread().is_alive():
            return
        self.queue.extend((ENDED, 0))
        self.journal.flush()

    def steps_so_far(self) -> int:
        """Optimizer steps (and backward() calls) so far, folded or not: which
        step a tensor read belongs to (:mod:`~metrics.engines.torch.syncs`)."""
        return self.folded + len(self.queue) // FIELDS  # two reads: this runs per tensor read

    def _feeds_step_time(self) -> bool:
        """No step is marked, nor queued to be: StepTime is ours to fill."""
        rec = self.rec
        # The recorder's queue of marks not yet folded (folded after ours on
        # the hot path), read, never changed.
        marks_waiting = getattr(rec, "_steps_queue", None)
        return (rec.first_step_ns is None and not marks_waiting
                and not any(m in sys.modules for m in _MARKING_MODULES))

    # Read ------------------------------------------------------------------

    def steps(self) -> StepsReading | None:
        """Steps from the optimizer stepped most (None below
        :data:`~metrics.recording.callstats.MIN_CALLS` steps): the loop from
        the first step's start (its end less the usual step, else the mean
        one) to the latest step's end."""
        self.journal.flush()
        backward = self.by_id.get(id(BACKWARD))
        closure = self.by_id.get(id(CLOSURE))
        ranked = sorted(((k, o) for k, o in self.by_id.items() if k not in _NOT_OPTIMIZERS),
                        key=lambda kv: -kv[1].calls)
        best, names_, chain = _stepped([o for _, o in ranked])
        outside = backward.calls if backward is not None else 0
        # backward() inside optimizer steps: their closures' (LBFGS), no steps.
        inner = (f"; backward() ran {closure.calls:,} times inside its steps (the closure "
                 "it evaluates): not steps") if closure is not None else ""
        if best is not None and (best.calls >= MIN_CALLS or (
                inner and outside < MIN_CALLS)):
            top = best
            basis = f"optimizer.step(): {top.calls:,} calls ({names_}{inner})"
        elif backward is not None and outside >= MIN_CALLS:
            top = backward
            why = ("no torch.optim optimizer stepped: the weights are updated by hand"
                   if best is None else
                   f"{best.name} stepped {best.calls:,} time{'s' if best.calls != 1 else ''}, "
                   f"fewer than the {MIN_CALLS} a step loop is inferred from")
            basis = f"backward(): {top.calls:,} calls ({why}{inner})"
        else:
            return None
        first, last = top.first or 0, top.last
        mean = (last - first) / (top.calls - 1) if top.calls > 1 else 0.0
        # The first step began a usual step before it ended: the mean of a loop
        # that evaluates every N steps would reach back into its compiles.
        gaps_of = self.by_id.get(self.gaps_of or 0)
        usual = self.gaps.usual_ns() if gaps_of is top or gaps_of in chain else None
        before = mean if usual is None else min(mean, usual)
        seconds = (last - first + before) / 1e9 if last > first else None
        to_unix = self.rec.mono_to_unix
        return StepsReading(count=top.calls, source=STEPS_INFERRED, basis=basis,
                            seconds_total=seconds, first_unix=(first - before) / 1e9 + to_unix,
                            last_unix=last / 1e9 + to_unix)

    @property
    def step_time_note(self) -> str:
        """What the basis says when StepTime holds this hook's intervals."""
        if not self.step_time_fed:
            return ""
        return "the time between steps is StepTime (the program marks no step)"

    def clear(self) -> None:
        self.journal.clear()
        self.by_id.clear()
        self.primary = None
        self.gaps_of = None
        self.step_base = 0
        self.inside[0] = None
        self.first_stepped[0] = None
        self.step_time_fed = 0
        self.folded = 0
        self.gaps.clear()


def _stepped(ranked: list[_Optimizer]) -> tuple[_Optimizer | None, str, list[_Optimizer]]:
    """Whose steps are the loop's, from the optimizers most stepped first:
    the most stepped one (its name, and how many stepped), or, where each
    stepped alone, one after another (pytorch/examples' mnist_forward_forward
    trains each layer with its own Adam, layer 1's steps all done before layer
    2's), all of them as one (and those, in the order they stepped). Two that
    stepped in the same span (a GAN's, alternating) are not one after another."""
    if not ranked:
        return None, "", []
    ran = sorted((o for o in ranked if o.first is not None), key=lambda o: o.first or 0)
    if len(ran) < 2 or any((b.first or 0) <= a.last for a, b in zip(ran, ran[1:])):
        best = ranked[0]
        more = f", the most stepped of {len(ranked)} optimizers" if len(ranked) > 1 else ""
        return best, f"{best.name}{more}", []
    names_ = ", ".join(o.name for o in ran[:3]) + (f" and {len(ran) - 3} more" if len(ran) > 3
                                                   else "")
    whole = _Optimizer(names_)
    whole.calls, whole.first, whole.last = sum(o.calls for o in ran), ran[0].first, ran[-1].last
    return whole, f"{names_}: {len(ran)} optimizers, one after another", ran


def _noter(steps: OptimizerSteps,
           compiling: Callable[[], bool] | None) -> Callable[[object], int | None]:
    """What both hooks do: a clock read and an append of ``(owner, now)``
    (``compiling``: Dynamo reads it as True while tracing, so a compiled step
    traces none of the rest; None: the caller tested it, and gets ``now``)."""
    q, flush, clock, limit = steps.queue, steps.journal.flush, time.monotonic_ns, FOLD_AT * FIELDS

    def note(owner: object) -> int:
        now = clock()
        q.extend((owner, now))
        if len(q) >= limit:
            flush()
        return now

    if compiling is None:
        return note

    def note_unless_compiling(owner: object) -> int | None:
        if compiling():
            return None
        now = clock()
        q.extend((owner, now))
        if len(q) >= limit:
            flush()
        return now

    return note_unless_compiling


def _after_step(steps: OptimizerSteps, host: HostLines, now: int, q: list[Any]) -> None:
    """The step ended at ``now``: the user's host work to the next one, when
    an interval is due (:mod:`metrics.engines.torch.host_lines`)."""
    if now < host.due_ns:
        return
    try:
        host.after_step(now, steps.folded + len(q) // FIELDS)
    except Exception as e:  # noqa: BLE001 - a hook never raises into the program
        steps.rec.hook_failed("torch.host_lines", e)


def _backward_hook(steps: OptimizerSteps, original: Callable[..., Any],
                   compiling: Callable[[], bool]) -> Callable[..., Any]:
    """``torch.autograd.backward`` noting its call after it (``Tensor.backward``
    calls it by that name)."""
    note = _noter(steps, compiling)
    inside, first, q, unused = steps.inside, steps.first_stepped, steps.queue, steps.unused

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if inside[0] is not None:
            note(CLOSURE)
            return out
        now = note(BACKWARD)
        if unused.left and first[0] is not None:  # (a countdown, then never again)
            unused.left -= 1
            if not unused.left and not compiling():
                try:
                    unused.check(args, kwargs, time.time())
                except Exception as e:  # noqa: BLE001 - a hook never raises into the program
                    steps.rec.hook_failed("torch.unused_grads", e)
        host = steps.host_lines
        if host is not None and now is not None and first[0] is None:  # backward() is the step
            _after_step(steps, host, now, q)  # (a clock compare)
        return out

    return backward


def _pre_hook(steps: OptimizerSteps, compiling: Callable[[], bool]) -> Callable[..., None]:
    """The pre-step hook: an optimizer's step begins (a backward() until its
    end is its closure's). A step that raises leaves the flag set until the
    next step's end: backward() calls meanwhile count as a closure's."""
    inside = steps.inside

    def optimizer_stepping(optimizer: Optimizer, args: object, kwargs: object) -> None:
        if not compiling():
            inside[0] = optimizer

    return optimizer_stepping


def _hook(steps: OptimizerSteps, compiling: Callable[[], bool]) -> Callable[..., None]:
    """The post-step hook: notes the optimizer's step."""
    note = _noter(steps, None)  # compiling() is read below, once
    inside, busy, first, q = steps.inside, steps.busy, steps.first_stepped, steps.queue

    def optimizer_stepped(optimizer: Optimizer, args: object, kwargs: object) -> None:
        if compiling():  # traced by Dynamo: nothing (see _noter)
            return
        inside[0] = None
        now = note(optimizer)  # (the step's clock read)
        if steps.unused.left:  # (until the one check: the optimizers' parameters)
            steps.unused.optimizers.add(optimizer)
        if first[0] is None:
            first[0] = optimizer
        host = steps.host_lines
        if host is not None and now is not None and first[0] is optimizer:  # the user's
            _after_step(steps, host, now, q)  # host work to the next step
        if now is not None and now >= busy.due_ns:  # a second apart: the run queue's share
            try:
                busy.tick(now)
            except Exception as e:  # noqa: BLE001 - a hook never raises into the program
                steps.rec.hook_failed("torch.optim", e)

    return optimizer_stepped
