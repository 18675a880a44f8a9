"""torch.compile (Dynamo) engine hook.

``torch.compile(model)`` with any backend; the hook watches Dynamo from outside:

* Each graph Dynamo hands to the backend (``UncachedCompile``, or
  ``CachedCompile`` when the backend answered from its cache), the backend's
  compile time (``CompileTime``) and Dynamo's own tracing time
  (``TraceTime``); per graph in the ledger, the whole frame's compile time.
* The graph hash: sha256 over the backend's name, the FX graph's code and the
  input signature (symbolic sizes included), so it is stable across runs and
  when the source moves. The signature lists the user's inputs
  (``x: f32[s77,3]``); parameters and buffers count in the hash only.
* Recompile causes: Dynamo's guard failures parsed into argument / before /
  after (:mod:`metrics.engines.torch.compile.guards`), with the user's call site.
  Dynamo checks every cached graph and its metrics keep the first failure
  only; the hook sees them all and keeps the first that is not a
  global-state change (after an eval graph under ``no_grad``, a training
  call at a new size is a size change).
* A backend (Inductor FX/AOT) cache hit is still a Dynamo (re)compile: in the
  ledger with its time and cause, and a cache hit (``CachedCompile``).
* The backward compiled at the first ``backward()`` adds to its forward's
  time (:mod:`metrics.engines.torch.compile.backward`).
* Graph breaks (``GraphBreaks``, and a ``graph_break`` event with the reason
  and the user's line); the Python time across a break Dynamo resumes from,
  and the eager time of a frame it gave up on
  (:mod:`metrics.engines.torch.compile.breaks`, :mod:`.eager`).
* Steps: the optimizer's (:mod:`metrics.engines.torch.optim`), else compiled
  calls with gradients on (:mod:`metrics.engines.torch.compile.steps`); the
  steps that held a compile (a recompile in the loop, an evaluation's first
  call) as ``CompileStepTime`` (:mod:`metrics.engines.compile_steps`, as JAX);
  the evaluations (``model.eval()``) and checkpoints (``torch.save``) between
  optimizer steps and their time beyond the usual step
  (:mod:`metrics.engines.torch.gaps`).
* The user's own host work between steps (building each example with
  ``torch.zeros`` and a Python loop), per line of the loop, in sampled
  intervals (:mod:`metrics.engines.torch.host_lines`).
* The batches the main thread draws from a DataLoader, timed at the user's
  ``for`` line (:mod:`metrics.engines.torch.loader`).
* Executions of each compiled graph and their time (``ExecuteComputation``,
  ``ExecuteTime``): the backend's callable is wrapped (forward graphs only;
  backward runs inside autograd).
* Device memory at scrape time from ``torch.cuda`` where CUDA is in use,
  else a CPU record that says why there is none; device traces: torch.profiler.

If ``torch._dynamo`` is not imported yet at install time (importing it costs
about a second), ``torch.compile`` is wrapped and the Dynamo hooks go in on
its first call.

Private APIs used: :mod:`.dynamo` lists them; each is behind a check that
degrades the feature, never crashes (``TorchCompileEngine.degraded`` lists
what was unavailable).
"""

from __future__ import annotations

import dataclasses
import sys

import torch

from metrics.engines import device_profilers, ranks
from metrics.engines._frames import frames_for, skip_prefixes
from metrics.engines.base import EngineBase
from metrics.engines.compile_steps import compile_step_time
from metrics.engines.host_sites import work_sites
from metrics.engines.other_threads import OtherThreads
from metrics.engines.torch import devices
from metrics.engines.torch import syncs as torch_syncs
from metrics.engines.torch.compile import dynamo, record
from metrics.engines.torch.compile.context import ACTIVE, ENGINE, CompileContext
from metrics.engines.torch.host_lines import torch_host_lines
from metrics.engines.torch.loader import LoaderTimes
from metrics.recording.recorder import Recorder
from tpu_info.contract.model import (
    CounterReading,
    DeviceRecord,
    DistributionReading,
    SiteReading,
    StepsReading,
)

__all__ = ["ENGINE", "TorchCompileEngine", "create"]


class TorchCompileEngine(EngineBase):
    """Installs and removes the Dynamo hooks; one active per process. Its
    parts share :attr:`ctx` (:class:`~.context.CompileContext`)."""

    name = ENGINE
    device_trace_kind = device_profilers.TorchTrace

    def __init__(self, recorder: Recorder, explain_cache_misses: bool = True) -> None:
        self.ctx = CompileContext(recorder, record.fold_calls)
        self.rec = recorder
        self.degraded = self.ctx.degraded
        self.loader = LoaderTimes(recorder)  # the main thread's DataLoader batches
        # The process's other Python threads' CPU, on the steps' busy samples.
        self.other_threads = OtherThreads(
            frames_for(skip_prefixes()),
            lambda name, percent, at: recorder.distribution(name).observe_at(percent, at))
        recorder.on_reset(self.other_threads.forget)

    # Install / uninstall ---------------------------------------------------

    def install(self) -> None:
        ctx = self.ctx
        ACTIVE.ctx = ctx
        ctx.syncs = torch_syncs.attach(ctx)
        ctx.optimizer.install(ctx.degraded)
        ctx.optimizer.gaps.install(ctx.patches, ctx)  # model.eval(), torch.save
        if ctx.optimizer.host_lines is None:  # the user's host work between steps
            ctx.optimizer.host_lines = host_lines = torch_host_lines(ctx.failed)
            self.rec.on_reset(host_lines.forget)
        ctx.optimizer.host_lines.enabled = True
        ctx.optimizer.busy.window = self.other_threads.sample
        self.loader.install(ctx.patches, ctx)  # DataLoader batches
        if "torch._dynamo" in sys.modules:
            dynamo.hook_dynamo(ctx)
        # Hooks Dynamo on first use, and times what it returns once Dynamo
        # gives up on that frame (an unresumable graph break).
        ctx.patches.apply(torch, "compile", dynamo.wrap_torch_compile)

    def uninstall(self) -> None:
        ctx = self.ctx
        if ACTIVE.ctx is ctx:
            ACTIVE.ctx = None
        torch_syncs.detach(ctx)
        ctx.syncs = None
        ctx.optimizer.uninstall()
        if ctx.optimizer.host_lines is not None:
            ctx.optimizer.host_lines.enabled = False
        ctx.optimizer.busy.window = None
        ctx.patches.restore()
        ctx.dynamo_hooked = False

    def hook_dynamo(self) -> None:
        """Puts the Dynamo hooks in (idempotent); imports ``torch._dynamo``."""
        dynamo.hook_dynamo(self.ctx)

    # Scrape time -----------------------------------------------------------

    def steps(self) -> StepsReading | None:
        """Optimizer steps, else compiled graph calls (:mod:`.steps`)."""
        ctx = self.ctx
        ctx.calls.flush()
        optimizer = ctx.optimizer
        return ctx.call_times.beside(optimizer.steps(), optimizer.step_time_note)

    keeps_readings = True  # extra_readings: the step loop's compile steps

    def extra_readings(self) -> tuple[list[CounterReading], list[DistributionReading]]:
        """``CompileStepTime``: the compile work in the steps that held any
        (Dynamo's frames and the backwards, clipped to the step loop)."""
        return [], compile_step_time(self.ctx.timeline, self.rec, self.steps)

    def sites(self) -> list[SiteReading]:
        """Resumable graph breaks with the Python time across them (measured),
        the program's reads of tensor values (:mod:`~metrics.engines.torch.syncs`)
        and the evaluations and checkpoints between optimizer steps
        (:mod:`~metrics.engines.torch.gaps`) and the DataLoader batches
        (:mod:`~metrics.engines.torch.loader`)."""
        ctx = self.ctx
        ctx.calls.flush()
        ctx.optimizer.close_if_ended()  # the work after the last step, once the program ended
        syncs = ctx.syncs
        training = ctx.optimizer.steps_so_far() > 0 or any(
            f.calls for f in ctx.call_times.train.by_key.values())
        gaps = ctx.optimizer.gaps
        steps = self.steps()
        between = gaps.sites(steps)  # evaluation, checkpoints
        reads = syncs.sites(ctx) if syncs is not None else []
        reads += self.loader.sites(steps)
        # An evaluation's reads (and its loader's batches) are its own: their
        # time is in its gaps.
        reads = [x if x.within or not (lead := gaps.lead_around(
            x.first_seen_unix, x.last_seen_unix)) else dataclasses.replace(x, within=lead)
            for x in reads]
        host = ctx.optimizer.host_lines
        work = work_sites(host, self.rec.mono_to_unix) if host is not None else []
        return (ctx.gaps.sites(training) + reads + between + work
                + self.other_threads.sites(self.rec.mono_to_unix)
                + ctx.optimizer.unused.sites())

    def blind_spots(self) -> list[str]:
        """The tensor reads the sync hook does not count (:mod:`~metrics.engines.torch.syncs`)."""
        syncs = self.ctx.syncs
        return syncs.blind_spots(self.ctx) if syncs is not None else []

    def devices(self) -> list[DeviceRecord]:
        """CUDA devices, or a CPU record with the reason (none when torch_xla
        is loaded: its adapter lists the devices the program uses)."""
        if "torch_xla" in sys.modules and not torch.cuda.is_available():
            return []
        return devices.torch_devices(torch)

    def rank(self) -> ranks.Rank | None:
        return ranks.from_torch_distributed()

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__}


def create(recorder: Recorder, explain_cache_misses: bool = True,
           **_: object) -> TorchCompileEngine:
    """The adapter ``metrics.install()`` uses; other engines' options are ignored."""
    return TorchCompileEngine(recorder, explain_cache_misses=explain_cache_misses)
