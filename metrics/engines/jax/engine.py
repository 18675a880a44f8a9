"""JAX / PJRT engine hook.

What it records:

* ``CompileTime`` (backend compile), ``TraceTime``, ``LoweringTime`` from
  ``jax.monitoring`` duration events; ``UncachedCompile`` per real compile and
  ``CachedCompile`` per persistent-cache hit: in the graph ledger a hit is a
  compile whose backend was loaded (it was traced and lowered, and has a
  cause), so a warm cache does not hide a recompile.
* The graph hash: JAX's compilation-cache key (sha256 over the module with
  debug info stripped, plus compile options and platform: stable across
  processes and when the source moves), taken from the key JAX computes
  anyway, or computed with JAX's own function when the cache is off.
* The input signature of each compiled graph (argument names, shapes,
  dtypes, weak types, shardings) from the lowering step.
* Recompile causes: ``jax_explain_cache_misses`` records, captured from JAX's
  logger and parsed (which argument changed, by its parameter name, old and
  new value, the user's call site), and the recompiles JAX does not explain
  (an input moved to another device), from the previous lowering. The
  flag stays as the user left it: with it off, JAX's own explanation runs
  on each tracing-cache miss against the function's previous variant only
  (``LastVariantExplainer``: O(1) per compile, where the flag costs
  O(variants)) and nothing is printed.
* Transfers: ``jax.device_put`` / ``jax.device_get`` calls, bytes and time
  (:mod:`metrics.engines.jax.explicit`); implicit ones both ways
  (``float(x)``, ``print(x)``, ``jnp.asarray(numpy)``, numpy arguments
  sharded per call) with the user's line: see
  :mod:`metrics.engines.jax.implicit` (``sites()``, ``blind_spots()``).
* Calls of functions jitted or pmapped after install (``jax.jit`` and
  ``jax.pmap`` wrapped: :mod:`metrics.engines.jax.calls`) and of AOT-compiled
  ones (:mod:`metrics.engines.jax.aot`): executions per graph and host time
  (:mod:`metrics.engines.jax.executions`); the inferred step and busy % when
  the program never marks steps (:mod:`metrics.engines.jax.steps`).
* Device memory at scrape time (:mod:`metrics.engines.jax.devices`).
* Compiles themselves: :mod:`metrics.engines.jax.compiles`; their causes:
  :mod:`metrics.engines.jax.explain` and :mod:`metrics.engines.jax.causes`.

What the hooks share (the installed engine, the compile count, the
per-thread compile state) is one :class:`~.context.JaxContext`, given to
each part and wrapper: none imports this module.

Private JAX APIs used (each behind a check that degrades the feature, never
crashes; ``JaxEngine.degraded`` lists what was unavailable):

* ``jax._src.compiler.compile_or_get_cached`` (wrapped: one compile request)
* ``jax._src.compiler._cache_read`` (wrapped: reads the cache key JAX made)
* ``jax._src.compilation_cache.get_cache_key`` (fallback hash)
* ``jax._src.interpreters.pxla.lower_sharding_computation`` (wrapped: signature)
* ``jax._src.interpreters.partial_eval.trace_to_jaxpr`` (wrapped: misses, by
  its ``cache_info``), ``.explain`` (called with one key); without them the
  flag is turned on instead (every variant compared: slower compiles)
* the loggers ``jax._src.interpreters.partial_eval`` and ``jax._src.pjit``
  (explain-cache-miss records)
* ``jax._src.stages.Compiled.__call__`` (wrapped on the class: AOT calls) and
  ``Compiled._executable.xla_executable.fingerprint`` (their graph)
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import jax

from metrics.engines import device_profilers, ranks
from metrics.engines._frames import engine_dirs, frames_for, skip_prefixes
from metrics.engines._patching import Patches
from metrics.engines.base import EngineBase
from metrics.engines.jax import aot, calls, monitoring
from metrics.engines.jax.compiles import Compiles
from metrics.engines.jax.context import CONTEXT, ENGINE, JaxContext
from metrics.engines.jax.device_time import DeviceTimes
from metrics.engines.jax.devices import DeviceMemory
from metrics.engines.jax.eager import EagerOps
from metrics.engines.jax.executions import Executions
from metrics.engines.jax.explain import Explanations
from metrics.engines.jax.explicit import ExplicitTransfers
from metrics.engines.jax.host_lines import HostLines
from metrics.engines.jax.implicit import ImplicitTransfers
from metrics.engines.jax.monitoring import MonitoringRecords
from metrics.engines.jax.steps import StepWatch
from metrics.engines.jax.wrappers import LibraryWrappers
from metrics.engines.other_threads import OtherThreads
from metrics.recording.recorder import Recorder
from metrics.recording.thread_busy import ThreadBusy
from tpu_info.contract import catalog as names
from tpu_info.contract.model import (
    CounterReading,
    DeviceRecord,
    DistributionReading,
    SiteReading,
    StepsReading,
)


class JaxEngine(EngineBase):
    """Installs and removes the JAX hooks; one per process at a time.

    Its parts, each given what it reads: ``compiles`` (:mod:`.compiles`),
    ``explicit`` (``device_put``/``device_get``), ``runs`` (counted calls:
    executions per graph), ``implicit`` (syncs and transfers nobody asked
    for), ``eager`` (primitives run outside jit), ``monitoring`` (every
    ``jax.monitoring`` record) and ``step_watch`` (inferred steps, busy %).
    """

    name = ENGINE
    device_trace_kind = device_profilers.JaxTrace

    def __init__(self, recorder: Recorder, explain_cache_misses: bool = True,
                 context: JaxContext = CONTEXT) -> None:
        self.rec = recorder
        self.context = context
        self.degraded: list[str] = []
        self._patches = Patches(self.degraded)
        self._explain = explain_cache_misses
        skip = skip_prefixes(jax, sys.modules.get("jaxlib"))
        self._memory = DeviceMemory(on_error=recorder.hook_failed)  # SDK failures counted
        self.compiles = Compiles(recorder, context, skip)
        self._explanations = Explanations(self.compiles, skip)
        # Hot paths append raw records to these journals, folded before reads.
        self.explicit = ExplicitTransfers(recorder)  # device_put / device_get
        self.runs = Executions(recorder)  # counted calls: executions per graph
        self.calls, self.calls_queue = self.runs.journal, self.runs.queue  # the wrappers write
        self.implicit = ImplicitTransfers(recorder, self.degraded, self.explicit, context)
        # The jit wrapper's numpy arguments, on each call of a function that takes them.
        self.numpy_arguments = self.implicit.jit_arguments.report
        self.eager = EagerOps(recorder, self.implicit,  # into implicit's site table
                              self.calls, self.explicit.journal)
        self.monitoring = MonitoringRecords(recorder)  # every jax.monitoring record, by name
        self.step_watch = StepWatch(self.runs, self.implicit)
        # Device time per graph and the sync latency, off the training thread:
        # what each read is costed with (drains.py), and the ledger's graphs'.
        self.device_times = DeviceTimes(on_graph=recorder.ledger.device_time,
                                        on_error=recorder.hook_failed)
        self.implicit.drains.times = self.device_times
        # The training thread's CPU share of the loop, ticked on the step's
        # timed calls: who set the loop's pace, and the step's call's wait in
        # dispatch (the host's slack: what host work in the step costs reads it).
        self.thread_busy = ThreadBusy(
            lambda percent, at: recorder.distribution(names.TRAINING_THREAD_BUSY).observe_at(
                percent, at),
            lambda ns, at: recorder.distribution(names.DISPATCH_WAIT_TIME).observe_at(ns, at),
            loaded=lambda percent, at: recorder.distribution(
                names.TRAINING_THREAD_RUN_QUEUE).observe_at(percent, at))
        # The process's other Python threads' CPU (a prefetch pool), on its samples.
        self.other_threads = OtherThreads(
            frames_for(skip_prefixes(jax, sys.modules.get("jaxlib"))),
            lambda name, percent, at: recorder.distribution(name).observe_at(percent, at))
        self.thread_busy.window = self.other_threads.sample
        self.implicit.gaps.timeline = self.compiles.timeline
        self.implicit.gaps.busy = self.thread_busy.cpu_share  # the host's own part of a step
        self.implicit.drains.timeline = self.compiles.timeline  # a read's h: no compile
        # Library jit wrappers' own host time around their inner jitted call.
        self.wrappers = LibraryWrappers(context)
        # The training thread's own host work between the step's calls, per line.
        self.host_lines = HostLines(frames_for(skip_prefixes(jax, sys.modules.get("jaxlib"))),
                                    engine_dirs(jax, sys.modules.get("jaxlib")),
                                    calls.wrapper_codes()[0], on_error=recorder.hook_failed,
                                    own_codes=calls.wrapper_codes())
        recorder.on_reset(self._forget_calls)
        self._hooked: dict[str, bool] = {}  # "jit", "pmap", "aot": whether each is counted

    def _forget_calls(self) -> None:
        self.runs.forget()
        self.step_watch.forget()
        self.context.name_step(None)  # which calls are steps: guessed again
        self.implicit.clear()  # the lines: a reset forgets what they did too
        self.wrappers.forget()
        self.host_lines.forget()
        self.other_threads.forget()

    # Install / uninstall ---------------------------------------------------

    def install(self) -> None:
        self.degraded.extend(monitoring.listen(self.context))
        self.compiles.install(self._patches)
        self._patch_transfers()
        self.device_times.read = _unhooked_read()  # the latency probe reads past the hook
        self._patch_calls()
        self.wrappers.install(self._patches)  # once the library is imported
        self.eager.install(self._patches, self.context)
        if self._explain:
            self._explanations.install(self._patches)
        self.context.name_step(None)  # not an earlier engine's step
        self.context.active = self

    def uninstall(self) -> None:
        if self.context.active is self:
            self.context.active = None
        self.device_times.stop()
        self.host_lines.enabled = False
        self.wrappers.uninstall()
        self.implicit.uninstall()
        self._patches.restore()
        self._explanations.uninstall()
        self.compiles.patched = False
        self._hooked.clear()

    def _patch_transfers(self) -> None:
        # Explicit device_puts of host data are counted by the numpy shard
        # handler (one hook per put); jax.device_put is wrapped only where
        # that cannot tell them apart.
        self.implicit.install(self._patches)
        put = not self.implicit.explicit_puts_counted
        self.implicit.counted_by(*self.explicit.install(self._patches, self.context, put=put))

    def _patch_calls(self) -> None:
        """Counts calls without wiring: ``jax.jit`` and ``jax.pmap`` wrap what
        they return; AOT-compiled calls are counted by ``Compiled.__call__``."""
        apply, ctx = self._patches.apply, self.context
        self._hooked["jit"] = apply(jax, "jit", lambda orig: calls.hook_jit(orig, ctx))
        self._hooked["pmap"] = apply(jax, "pmap", lambda orig: calls.hook_pmap(orig, ctx))
        self._hooked["aot"] = aot.install(self._patches, ctx)

    # Scrape time -----------------------------------------------------------

    def sites(self) -> list[SiteReading]:
        """Lines that synced or moved data implicitly, or ran eager ops."""
        self.step_watch.name_step(self.context)  # later reads' step index, named now
        self.calls.flush()  # each function's graph, then its device time to the ledger
        self.device_times.publish()
        to_unix = self.rec.mono_to_unix
        step = self.context.step_owner
        return (self.implicit.sites() + self.wrappers.sites(to_unix)
                + self.host_lines.sites(to_unix, step.calls if step is not None else 0)
                + self.other_threads.sites(to_unix))

    def busy_percent(self) -> tuple[float | None, str]:
        """Host-side busy % and its reason (:meth:`StepWatch.busy_percent`)."""
        return self.step_watch.busy_percent()

    def steps(self) -> StepsReading | None:
        """Steps when the program never marks them (:mod:`metrics.engines.jax.steps`)."""
        return self.step_watch.steps()

    keeps_readings = True  # extra_readings: the step loop's compile steps

    def extra_readings(self) -> tuple[list[CounterReading], list[DistributionReading]]:
        """``CompileStepTime``: the compile work in the steps that held any
        (:meth:`StepWatch.compile_steps`)."""
        return [], self.step_watch.compile_steps(self.compiles.timeline)

    def blind_spots(self) -> list[str]:
        """What the JAX hook cannot see in this process, one sentence each:
        calls the executions count misses, then transfers and syncs."""
        return (calls.blind_spots(self._hooked) + self.implicit.blind_spots()
                + self.eager.blind_spots())

    def devices(self) -> list[DeviceRecord]:
        """One record per local device, memory read now."""
        return self._memory.records(self.busy_percent())

    def rank(self) -> ranks.Rank | None:
        return ranks.from_jax()

    def versions(self) -> dict[str, str]:
        v = {"jax": jax.__version__}
        try:
            import jaxlib

            v["jaxlib"] = jaxlib.__version__
        except (ImportError, AttributeError):
            pass
        # libtpu as the TPU backend loaded it (JAX imports the package to find
        # its library): the CLI's header and doctor show it where no libtpu
        # service answers (a sandbox without TCP).
        libtpu = sys.modules.get("libtpu")
        if isinstance(version := getattr(libtpu, "__version__", None), str):
            v["libtpu"] = version
        return v


def _unhooked_read() -> Callable[[object], object] | None:
    """JAX's own ``ArrayImpl._value`` getter (under the hook's, if installed)."""
    try:
        from jax._src.array import ArrayImpl

        fget = ArrayImpl.__dict__["_value"].fget
    except (ImportError, KeyError, AttributeError):
        return None
    return getattr(fget, "__wrapped__", fget)
