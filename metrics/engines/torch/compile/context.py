"""What the parts of the torch.compile adapter share: :class:`CompileContext`
(one per engine: its instruments, the journal of compiled calls, what each
thread's compile is waiting for, the compile records kept), and
:data:`ACTIVE`, the one the process-wide patches report to.

Dynamo's patched functions, the compiled graphs it caches (each wrapped by
this hook) and the timed results of ``torch.compile`` outlive an install:
they look the installed context up in :data:`ACTIVE` at each call and never
keep one, so an uninstall only restores attributes and clears the slot.

Example:
    >>> from metrics.recording.recorder import Recorder
    >>> ctx = CompileContext(Recorder(), lambda ctx, flat: None)
    >>> ctx.engine, ctx.thread.pending, ACTIVE.ctx
    ('torch_compile', [], None)
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from metrics.engines._frames import skip_prefixes
from metrics.engines.compile_steps import CompileTimeline
from metrics.engines.torch.compile.backward import BackwardCompiles
from metrics.engines.torch.compile.breaks import BreakGaps
from metrics.engines.torch.compile.guards import TypesByCompile
from metrics.engines.torch.compile.steps import GradModeSteps
from metrics.engines.torch.context import TorchContext
from metrics.engines.torch.optim import OptimizerSteps
from metrics.recording.journal import Journal
from metrics.recording.recorder import Recorder
from tpu_info.contract import catalog as names

if TYPE_CHECKING:
    from metrics.engines.torch.compile.graphs import Graph

__all__ = ["ENGINE", "CALL_FIELDS", "ACTIVE", "CompileContext", "CompileThread"]

ENGINE = "torch_compile"
CALL_FIELDS = 3  # a compiled graph's call in the journal: (graph, start, end)


class CompileThread(threading.local):
    """What one thread's Dynamo compile is waiting for (Dynamo compiles on
    the calling thread): the graphs the backend compiled, until the frame's
    compilation metrics arrive, and the guard failures that started it."""

    def __init__(self) -> None:
        self.pending: list[Graph] = []
        # Every cached graph's guard failure and the frame's Python values.
        self.reasons: tuple[list[str], dict[str, str]] | None = None


class CompileContext(TorchContext):
    """One torch.compile engine's shared state, handed to its parts."""

    optimizer: OptimizerSteps  # always counted here (the base allows none)

    def __init__(self, recorder: Recorder,
                 fold_calls: Callable[[CompileContext, list[Any]], None]) -> None:
        super().__init__(ENGINE, recorder, skip_prefixes(torch))
        # Calls of compiled graphs (CALL_FIELDS items each, one append per
        # call), folded before reads by ``fold_calls``.
        self.calls: Journal = recorder.journal(functools.partial(fold_calls, self))
        self.calls_queue: list[Any] = self.calls.queue
        dist, counter = recorder.distribution, recorder.counter
        self.compile_time = dist(names.COMPILE_TIME)
        self.trace_time = dist(names.TRACE_TIME)
        self.uncached = counter(names.UNCACHED_COMPILE)
        self.cached = counter(names.CACHED_COMPILE)
        self.exec_count = counter(names.EXECUTE_COUNT)
        self.exec_time = dist(names.EXECUTE_TIME)
        self.graph_breaks = counter(names.GRAPH_BREAKS)
        self.eager_time = dist(names.EAGER_FALLBACK_TIME)
        self.thread = CompileThread()
        self.lock = threading.Lock()  # hooking Dynamo, once
        self.dynamo_hooked = False
        self.types = TypesByCompile()  # input types per compile id: sizes before
        self.call_times = GradModeSteps(to_unix=recorder.mono_to_unix)  # steps from calls
        self.gaps = BreakGaps()  # Python across resumable graph breaks
        self.resumes = False  # a resume function compiled: pair calls at fold time
        self.optimizer = OptimizerSteps(recorder)  # the training step, if any
        self.backward = BackwardCompiles(recorder)  # compiled lazily, at backward()
        # Spans of Dynamo's frame compiles and the backwards': CompileStepTime.
        self.timeline = CompileTimeline()
        self.optimizer.gaps.timeline = self.timeline  # a gap's compiles are compile steps
        recorder.on_reset(self.call_times.clear)
        recorder.on_reset(self.gaps.clear)


class Active:
    """The slot of the installed engine's context (None: none installed)."""

    __slots__ = ("ctx",)

    def __init__(self) -> None:
        self.ctx: CompileContext | None = None


ACTIVE = Active()
