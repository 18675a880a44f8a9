"""Every counter and distribution name the hook records, with unit and help.

Names follow torch_xla's where one exists, so ``metrics_report()`` reads the
same; new ones are CamelCase the same way. The table in docs/names.md is this one.
It lives in ``tpu_info`` so the CLI knows the names without importing the
hook.

Example:
    >>> CATALOG[COMPILE_TIME][0]
    'distribution'
"""

from __future__ import annotations

from tpu_info.contract.model import Unit

COMPILE_TIME = "CompileTime"
TRACE_TIME = "TraceTime"
LOWERING_TIME = "LoweringTime"
UNCACHED_COMPILE = "UncachedCompile"
CACHED_COMPILE = "CachedCompile"
EXECUTE_TIME = "ExecuteTime"
EXECUTE_COUNT = "ExecuteComputation"
TRANSFER_TO_DEVICE_TIME = "TransferToDeviceTime"
TRANSFER_FROM_DEVICE_TIME = "TransferFromDeviceTime"
OUTBOUND_DATA = "OutboundData"
INBOUND_DATA = "InboundData"
MARK_STEP = "MarkStep"
STEP_TIME = "StepTime"
HOOK_ERRORS = "HookErrors"
GRAPHS_EVICTED = "GraphsEvicted"
GRAPH_BREAKS = "GraphBreaks"
IMPLICIT_TRANSFER_TO_DEVICE = "ImplicitTransferToDevice"
IMPLICIT_TRANSFER_FROM_DEVICE = "ImplicitTransferFromDevice"
IMPLICIT_OUTBOUND_BYTES = "ImplicitOutboundBytes"
IMPLICIT_INBOUND_BYTES = "ImplicitInboundBytes"
EAGER_FALLBACK_TIME = "EagerFallbackTime"
DEVICE_BUSY_TIME = "DeviceBusyTime"
MONITORING_DROPPED = "JaxMonitoringDropped"
BACKEND_START_TIME = "BackendStartTime"
COMPILE_STEP_TIME = "CompileStepTime"
TRAINING_THREAD_BUSY = "TrainingThreadBusy"
DISPATCH_WAIT_TIME = "DispatchWaitTime"
TRAINING_THREAD_RUN_QUEUE = "TrainingThreadRunQueue"
OTHER_THREADS_CPU = "OtherThreadsCpu"
PROCESS_RUN_QUEUE = "ProcessRunQueue"
PROCESS_CORES = "ProcessCores"

# name -> (kind, unit, help). kind is "counter" or "distribution".
CATALOG: dict[str, tuple[str, Unit, str]] = {
    COMPILE_TIME: ("distribution", Unit.TIME_NS,
                   "Backend (XLA) compile time of each real compile."),
    BACKEND_START_TIME: ("distribution", Unit.TIME_NS,
                         "Time opening the device backends (the first device operation of "
                         "the process: 7-11 s for a TPU chip): a start-up, not a cost of the "
                         "operation that asked first."),
    COMPILE_STEP_TIME: ("distribution", Unit.TIME_NS,
                        "Compile work (tracing, lowering, backend compiles, the backends' "
                        "start-up) inside the step loop: one sample per step that held any, "
                        "its time. The steady step is the steps less this."),
    TRAINING_THREAD_BUSY: ("distribution", Unit.NUMBER,
                           "The training thread's CPU time over wall time in the step loop, in "
                           "percent: five samples a second for the first 8, then one a second "
                           "or more. Near 100 the host set the "
                           "loop's pace; low, it waited for the device."),
    DISPATCH_WAIT_TIME: ("distribution", Unit.TIME_NS,
                         "Time the step function's call spent off the CPU (its wall time "
                         "less the training thread's CPU time in it), sampled with "
                         "TrainingThreadBusy: near 0 where dispatch returns at once; about "
                         "the device's step less the host's work where the device's queue "
                         "is full and dispatch waits for a slot (the host's slack)."),
    TRAINING_THREAD_RUN_QUEUE: ("distribution", Unit.NUMBER,
                                "The share of the step loop's wall time the training thread "
                                "was ready to run but waited for a core (Linux schedstat; "
                                "absent where not told), in percent, sampled with "
                                "TrainingThreadBusy (JAX) or at optimizer steps (torch): "
                                "above a few percent the machine's other work slows the "
                                "steps at random."),
    OTHER_THREADS_CPU: ("distribution", Unit.NUMBER,
                        "The share of the process's CPU time in the step loop that its other "
                        "Python threads used (a data pipeline's prefetch pool; not the "
                        "training thread, the hook's or the engine's own), in percent, one "
                        "sample per TrainingThreadBusy window, where such threads exist."),
    PROCESS_RUN_QUEUE: ("distribution", Unit.NUMBER,
                        "The time the process's threads, all together, were ready to run but "
                        "waited for a core over the wall time, in percent (at most 100), "
                        "sampled with OtherThreadsCpu where the process has at most 64 "
                        "threads and Linux schedstat tells."),
    PROCESS_CORES: ("distribution", Unit.NUMBER,
                    "The cores the process may run on (its CPU affinity), sampled with "
                    "OtherThreadsCpu: on the CPU backend with one, the device's work and "
                    "the host's take turns on it."),
    TRACE_TIME: ("distribution", Unit.TIME_NS,
                 "Time tracing Python into a graph (JAX: to a jaxpr; torch.compile: "
                 "Dynamo's bytecode tracing of one frame)."),
    LOWERING_TIME: ("distribution", Unit.TIME_NS,
                    "Time lowering a jaxpr to an MLIR module (JAX)."),
    UNCACHED_COMPILE: ("counter", Unit.NUMBER,
                       "Graphs compiled by the backend (cache misses)."),
    CACHED_COMPILE: ("counter", Unit.NUMBER,
                     "Compiles avoided by a cache (JAX: persistent compilation cache hits)."),
    EXECUTE_TIME: ("distribution", Unit.TIME_NS,
                   "Wall time of each call of a tracked function, as its caller saw it "
                   "(JAX: timed on each function's first 64 calls, then one in 16, each "
                   "timed call weighted by the untimed ones it stands for)."),
    EXECUTE_COUNT: ("counter", Unit.NUMBER, "Calls of tracked functions."),
    TRANSFER_TO_DEVICE_TIME: ("distribution", Unit.TIME_NS,
                              "Time of each host->device transfer (jax.device_put, and the "
                              "implicit ones the hook times: jnp.asarray of host data, numpy "
                              "arguments sharded per call); a device_put of host data is timed "
                              "on the first 64, then one in 16, weighted like ExecuteTime)."),
    TRANSFER_FROM_DEVICE_TIME: ("distribution", Unit.TIME_NS,
                                "Time of each device->host transfer (jax.device_get, and "
                                "implicit syncs: float(x), print(x), if x > 0:, ...)."),
    OUTBOUND_DATA: ("distribution", Unit.BYTES, "Bytes of each host->device transfer."),
    INBOUND_DATA: ("distribution", Unit.BYTES, "Bytes of each device->host transfer."),
    MARK_STEP: ("counter", Unit.NUMBER, "Training steps marked with metrics.mark_step()."),
    STEP_TIME: ("distribution", Unit.TIME_NS, "Wall time between consecutive mark_step() calls."),
    HOOK_ERRORS: ("counter", Unit.NUMBER,
                  "Exceptions inside the hook, counted and swallowed."),
    GRAPHS_EVICTED: ("counter", Unit.NUMBER,
                     "Graph-ledger entries dropped (least recently seen) to stay bounded."),
    GRAPH_BREAKS: ("counter", Unit.NUMBER,
                   "torch.compile graph breaks: Dynamo split a function into several "
                   "graphs with Python in between."),
    IMPLICIT_TRANSFER_TO_DEVICE: ("counter", Unit.NUMBER,
                                  "Host->device transfers nobody asked for (no device_put): "
                                  "numpy arguments of jitted calls, jnp.asarray of host data; "
                                  "part of OutboundData."),
    IMPLICIT_TRANSFER_FROM_DEVICE: ("counter", Unit.NUMBER,
                                    "Device->host syncs nobody asked for (no device_get): "
                                    "float(x), int(x), bool(x), tolist(), print(x); part of "
                                    "InboundData."),
    IMPLICIT_OUTBOUND_BYTES: ("counter", Unit.BYTES,
                              "Bytes of the implicit host->device transfers."),
    IMPLICIT_INBOUND_BYTES: ("counter", Unit.BYTES, "Bytes of the implicit device->host syncs."),
    EAGER_FALLBACK_TIME: ("distribution", Unit.TIME_NS,
                          "Wall time of each call of a torch.compile'd function that Dynamo "
                          "could not resume after a graph break: it runs eagerly."),
    DEVICE_BUSY_TIME: ("counter", Unit.TIME_NS,
                       "Host time inside tracked calls (metrics.track), or before the first "
                       "one inside counted jitted calls: the time busy % is the share of "
                       "(JAX)."),
    MONITORING_DROPPED: ("counter", Unit.NUMBER,
                         "jax.monitoring records (events, durations, scalars) under names "
                         "beyond the distinct names kept: counted here, not by name."),
}


# Names only some engines record: anything that shows every name at zero
# until it counts (the Prometheus exposition's counters) shows these only for
# a process with one of their engines (ProcessRecord.engine, comma separated).
ENGINES: dict[str, frozenset[str]] = {
    LOWERING_TIME: frozenset(("jax",)),
    MONITORING_DROPPED: frozenset(("jax",)),
    DEVICE_BUSY_TIME: frozenset(("jax",)),
    IMPLICIT_TRANSFER_TO_DEVICE: frozenset(("jax",)),
    IMPLICIT_TRANSFER_FROM_DEVICE: frozenset(("jax",)),
    IMPLICIT_OUTBOUND_BYTES: frozenset(("jax",)),
    IMPLICIT_INBOUND_BYTES: frozenset(("jax",)),
    GRAPH_BREAKS: frozenset(("torch_compile",)),
    EAGER_FALLBACK_TIME: frozenset(("torch_compile",)),
}

# An engine's own records whose samples a name of this catalog also gets
# (JAX reports its compile stages through jax.monitoring, which the hook
# records under their own names too): a fleet's exposition keeps one of the
# two, the catalog's.
MIRRORS: dict[str, str] = {
    "/jax/core/compile/backend_compile_duration": COMPILE_TIME,
    "/jax/core/compile/jaxpr_trace_duration": TRACE_TIME,
    "/jax/core/compile/jaxpr_to_mlir_module_duration": LOWERING_TIME,
}


# Distributions of a one-off figure (a sample or two in a process's life):
# the Prometheus exposition makes each one gauge of its total, named here
# (buckets would say nothing one number does not, at 24-28 series each).
ONE_OFF: dict[str, str] = {BACKEND_START_TIME: "tpu_info_backend_start_seconds"}


def for_engines(name: str, engines: str) -> bool:
    """Whether a process whose engines are ``engines`` (``"jax"``,
    ``"torch_compile,torch_lazy"``) records ``name``."""
    only = ENGINES.get(name)
    return only is None or any(e in only for e in engines.split(","))


def help_for(name: str) -> str:
    """The help text of a known name, else empty."""
    entry = CATALOG.get(name)
    return entry[2] if entry else ""


def unit_for(name: str) -> Unit:
    entry = CATALOG.get(name)
    return entry[1] if entry else Unit.NUMBER
