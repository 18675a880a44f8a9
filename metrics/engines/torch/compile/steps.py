"""The step of a torch program that marks none: its optimizer's steps
(:mod:`metrics.engines.torch.optim`) when it took at least ``MIN_CALLS``,
else inferred from its compiled graphs' calls: the graph with the most time
among calls with gradients on (training), the same function's calls with
gradients off (evaluation under ``torch.no_grad()``) counted apart, never as
steps. Dynamo guards each graph on the grad mode it was compiled under, so a
``no_grad`` call runs a graph of its own: a graph's mode says which calls
are which, with no work per call. A model called several times per
optimizer step (gradient accumulation) is said in the basis, never counted
as steps.

Example:
    >>> g = type("Graph", (), {"name": "compile(Net.forward)", "grad": True})()
    >>> s = GradModeSteps()
    >>> s.fold([g] * 12, list(range(12)), list(range(1, 13)))
    >>> s.steps().count
    12
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from collections.abc import Sequence
from typing import Protocol

from metrics.recording.callstats import MIN_CALLS, CallTimes
from tpu_info.contract.model import STEPS_INFERRED, StepsReading

# The compiled model ran this many times per optimizer step or more: several
# micro-batches per step (gradient accumulation).
ACCUMULATING = 1.5


class CompiledCall(Protocol):
    """What a call is folded by: its graph's name and grad mode
    (:class:`metrics.engines.torch.compile.graphs.Graph`)."""

    name: str
    grad: bool


class GradModeSteps:
    """Call times of compiled graphs, split by the grad mode each graph was
    compiled for (graphs have ``name`` and ``grad``)."""

    def __init__(self, to_unix: float | None = None) -> None:
        self.train = CallTimes("compiled graph", to_unix=to_unix)  # the inferred step
        self.evals = CallTimes("compiled graph", to_unix=to_unix)  # calls with gradients off
        self._split = False  # a graph compiled with gradients off: split at fold time

    def compiled(self, grad: bool) -> None:
        """A graph was compiled for calls with gradients on (``grad``) or off."""
        if not grad:
            self._split = True

    def fold(self, graphs: Sequence[CompiledCall], starts: list[int], ends: list[int],
             durations: list[int] | None = None,
             uniq: set[CompiledCall] | None = None) -> None:
        """One batch of calls (in the order they ended)."""
        if durations is None:
            durations = list(map(operator.sub, ends, starts))
        if uniq is None:
            uniq = set(graphs)
        if not self._split or all(g.grad for g in uniq):
            self.train.fold(graphs, starts, ends, durations, uniq)
            return
        for grad, times in ((True, self.train), (False, self.evals)):
            mask = [g.grad is grad for g in graphs]
            if any(mask):
                times.fold(list(itertools.compress(graphs, mask)),
                           list(itertools.compress(starts, mask)),
                           list(itertools.compress(ends, mask)),
                           list(itertools.compress(durations, mask)))

    def beside(self, optimizer: StepsReading | None, note: str = "") -> StepsReading | None:
        """The steps: ``optimizer``'s when there are any (the compiled
        model's calls per step, its evaluation calls and ``note`` said in the
        basis), else :meth:`steps`."""
        if optimizer is None:
            return self.steps()
        dominant = self.train.dominant(False, MIN_CALLS)
        if dominant is None:
            return dataclasses.replace(optimizer, basis="; ".join(filter(None, (
                optimizer.basis, note))))
        name, calls = dominant
        per_step = calls.calls / optimizer.count
        basis = (f"{optimizer.basis}; the compiled model ({name}) ran {calls.calls:,} times, "
                 f"{per_step:.1f} per step")
        if per_step >= ACCUMULATING:
            basis += " (gradient accumulation)"
        evals = self.evals.by_key.get((name, False))
        excluded = evals.calls if evals is not None else 0
        if excluded:
            basis += f"; its {excluded:,} calls with gradients off (evaluation) are not steps"
        if note:
            basis += f"; {note}"
        return dataclasses.replace(optimizer, basis=basis, excluded_calls=excluded)

    def steps(self) -> StepsReading | None:
        """Steps from the calls with gradients on (None with too little
        history); the step graph's calls with gradients off are
        ``excluded_calls``, said in the basis. A program that never computes
        gradients (inference) has its steps from those calls."""
        steps = self.train.steps()
        if steps is None:
            return self.evals.steps()
        dominant = self.train.dominant(False, MIN_CALLS)
        if steps.source != STEPS_INFERRED or dominant is None:
            return steps
        evals = self.evals.by_key.get((dominant[0], False))
        if evals is None or not evals.calls:
            return steps
        return dataclasses.replace(
            steps, excluded_calls=evals.calls,
            basis=f"{steps.basis}; its {evals.calls:,} calls with gradients off "
                  "(evaluation) are not steps")

    def clear(self) -> None:
        self.train.clear()
        self.evals.clear()
