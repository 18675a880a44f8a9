"""The host's slack in the step loop: how long the training thread waited
for the device's queued steps, and the one rule every host-side cost in
the steps is cut by.

A loop whose device is the one it waits for has the host run ahead: the
host does its per-step work (a library jit wrapper's, a numpy argument's
copy, its dispatch) while the device runs the steps queued before, then
waits for the device. The wait is the host's slack: host work added to the
step comes out of it, and host work removed goes into it, so the loop's
time does not move. A host-side cost in the steps is what exceeds it
(:func:`beside_queue`), the whole cost where there is none.

The slack is measured on the training thread, never guessed from the
device's sampled times (those grow with the Python work that holds the
interpreter lock their watcher needs):

- the waits at its reads every N steps beyond the drain they caused
  (:func:`queued_wait`: :mod:`metrics.engines.jax.drains`), where the
  queue runs deep between them (issue 41's optax_mlp: its print
  every 20 steps waited 9 ms a step);
- the step's own call's wait in dispatch (``DispatchWaitTime``, the call's
  wall time less the thread's CPU time in it, on calls sampled once a
  second: :mod:`metrics.recording.thread_busy`), where no read holds the
  host back and JAX's bounded queue does (issue 41's nnx_mnist: 15 ms of a
  43 ms step on average, and flax's wrapper, 2.6 ms a step, saved nothing
  by A/B). Its mean times the steps, at most the device's own time for
  them (the host waits for the device no longer than the device works).

None where the training thread was on the CPU 80 % of the loop or more
(:func:`host_paced`): the host set the pace and its work is the step's; or
where the device is the CPU backend's on one core (:func:`one_core`): the
host's work and the device's take turns on it.

Example:
    >>> from tpu_info.contract.model import Snapshot, StepsReading
    >>> s = Snapshot(0.0, steps=StepsReading(100, "inferred", "jit(step)", 1.0))
    >>> host_slack(s) is None
    True
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

from tpu_info.contract import catalog
from tpu_info.contract.diagnosis import SiteKind
from tpu_info.contract.model import STEPS_INFERRED, Phase, Snapshot, StepsReading
from tpu_info.views.cost import Cost, duration, site_phase, steps_of

# A graph runs "once a step" when its executions are within this of the steps.
PER_STEP_SLACK = 0.1
MIN_WAIT_SAMPLES = 3  # sampled step calls a median wait in dispatch stands on

# The training thread on the CPU this share of the loop's time or more
# (``TrainingThreadBusy``'s median): it never waited for the device, so the
# host set the pace and its work overlapped nothing.
HOST_PACED_PERCENT = 80.0


def host_paced(s: Snapshot) -> tuple[float, int] | None:
    """(the training thread's median CPU share of the loop in percent, the
    seconds it stands on) when it reaches :data:`HOST_PACED_PERCENT`; else None."""
    busy = s.distribution(catalog.TRAINING_THREAD_BUSY)
    if busy is None or busy.count < 3:
        return None
    median = busy.percentile(50.0)
    return (median, busy.count) if median is not None and median >= HOST_PACED_PERCENT else None


# The training thread waited for a core this share of the loop's time or
# more (``TrainingThreadRunQueue``'s median): the machine's other work holds
# it off the cores, and its steps are slow at random.
LOADED_PERCENT = 10.0


def loaded_machine(s: Snapshot) -> tuple[float, int] | None:
    """(the training thread's median share of the loop's time waiting for a
    core, in percent; the samples it stands on) when it reaches
    :data:`LOADED_PERCENT`; else None (cores free, or not told)."""
    d = s.distribution(catalog.TRAINING_THREAD_RUN_QUEUE)
    if d is None or d.count < 3:
        return None
    median = d.percentile(50.0)
    return (median, d.count) if median is not None and median >= LOADED_PERCENT else None


def on_cpu(s: Snapshot) -> bool:
    """Whether the process computes on the host's CPU (or says nothing of its
    devices): there a read costs microseconds and shows nothing of a pipeline."""
    return all(d.platform.lower() in ("cpu", "") for d in s.devices)


def one_core(s: Snapshot) -> bool:
    """A program on the CPU backend that may run on one core only
    (``ProcessCores``): the device's work is that core's too, so none of the
    host's runs beside it (ais_vizmetrics pinned to one core: a TensorBoard
    scalar every step, 20 % of the loop by A/B, said to run beside the
    device's queued steps, "device busy 74 %")."""
    cores = s.distribution(catalog.PROCESS_CORES)
    return on_cpu(s) and cores is not None and cores.count > 0 and cores.max == 1


def busy_cpu(s: Snapshot) -> tuple[float, int] | None:
    """:func:`loaded_machine` where the device is the host's own CPU: its
    work and the host's share the busy cores, so no host cost there is hidden
    beside the device's, nor saved whole by removing it; else None."""
    return loaded_machine(s) if on_cpu(s) else None


def busy_cpu_words(s: Snapshot, what: str) -> str:
    """Where :func:`busy_cpu` holds, the words that ``what``'s cost (a read's
    drain, a line's host time) is an upper bound (flax's fsdp example: a
    ``float()`` every step said 13-18 % where removing it saved ~2 % by A/B;
    seq2seq's ``get_batch`` 21-42 ms/step against 1.8 ms); else ``""``."""
    loaded = busy_cpu(s)
    if loaded is None:
        return ""
    return (f"Its cost is an upper bound: on the CPU backend the device is the host's own "
            f"cores, and the machine was busy (the training thread waited for a core "
            f"{loaded[0]:.0f}% of the loop's time), so removing {what} saves less.")


def queued_wait(s: Snapshot) -> float:
    """Seconds the host waited at its reads every N steps in the loop for the
    device's queued work (a read's wait less its drain:
    :mod:`metrics.engines.jax.drains`): how far the host ran ahead of the
    device. Not a read every step's: it drains the queue each step, so the
    next step's host work before its dispatch has no device work beside it
    (clinic_jax's numpy batch, copied after a ``float(loss)`` each step)."""
    return sum(max(0.0, x.seconds - (x.drain_seconds or 0.0)) for x in s.sites
               if x.kind == SiteKind.SYNC.value and x.drain_seconds is not None
               and site_phase(s, x) == Phase.PERIODIC)


def dispatch_wait(s: Snapshot) -> tuple[float, int] | None:
    """(the step's call's mean wait in dispatch, seconds; the sampled calls
    it stands on), or None where fewer than :data:`MIN_WAIT_SAMPLES`, or
    where fewer than one sampled call in five waited (its 80th percentile
    0: an odd wait, as for the interpreter lock another thread held, is no
    full queue). The mean, not the median: a full queue holds one call long
    and lets the next few through, and after a read or an evaluation the
    queue refills without waits (nnx_mnist: a median 0 at one load, a tenth
    of the calls over 50 ms), and the waits add up."""
    d = s.distribution(catalog.DISPATCH_WAIT_TIME)
    if d is None or d.count < MIN_WAIT_SAMPLES or not (d.percentile(80.0) or 0.0) > 0:
        return None
    return max(0.0, d.total) / d.count / 1e9, d.count


def _step_graphs(s: Snapshot, steps: StepsReading) -> list[Any]:
    """The graphs a step runs: the inferred step function's, else those that
    ran about once a step."""
    if steps.source == STEPS_INFERRED and steps.basis:
        name = steps.basis.split(":", 1)[0].strip()
        named = [g for g in s.graphs if g.name == name and g.executions]
        if named:
            return named
    lo, hi = steps.count * (1 - PER_STEP_SLACK), steps.count * (1 + PER_STEP_SLACK)
    return [g for g in s.graphs if g.executions and lo <= g.executions <= hi]


def step_device_seconds(s: Snapshot) -> tuple[float, int] | None:
    """(the device's seconds per step, the timed executions that stands on):
    each step graph's measured time per execution times its executions per
    step; None when a step graph's device time was not measured."""
    steps = steps_of(s)
    if steps is None or not steps.count:
        return None
    graphs = _step_graphs(s, steps)
    if not graphs or any(g.device_seconds is None or not g.device_samples for g in graphs):
        return None
    seconds = sum((g.device_seconds or 0.0) * (g.executions or 0) for g in graphs) / steps.count
    return seconds, min(g.device_samples for g in graphs)


class Slack(NamedTuple):
    """The host's waits for the device's queued work in the steps, in all:
    at its reads, and in the step's dispatch (the mean of ``samples``
    calls times the steps)."""

    reads: float
    dispatch: float
    samples: int

    @property
    def seconds(self) -> float:
        return self.reads + self.dispatch

    def words(self) -> str:
        """``the 2.7 s the host waited for the device's queued steps (at its
        reads 0.9 s, in the step's dispatch 1.8 s: mean of 12 sampled calls)``."""
        parts = ([f"at its reads {duration(self.reads)}"] if self.reads > 0 else []) + (
            [f"in the step's dispatch {duration(self.dispatch)}: mean of "
             f"{self.samples:,} sampled calls"] if self.dispatch > 0 else [])
        return (f"the {duration(self.seconds)} the host waited for the device's queued steps "
                f"({', '.join(parts)})")


def host_slack(s: Snapshot) -> Slack | None:
    """The host's :class:`Slack` in the steps (module docstring); None where
    it waited for nothing or set the pace."""
    steps = steps_of(s)
    if steps is None or not steps.count or host_paced(s) is not None or one_core(s):
        return None
    reads = queued_wait(s)
    waited = dispatch_wait(s)
    dispatch, samples = (waited[0] * steps.count, waited[1]) if waited else (0.0, 0)
    if dispatch > 0 and (device := step_device_seconds(s)) is not None:
        dispatch = min(dispatch, device[0] * steps.count)
    slack = Slack(reads, dispatch, samples)
    return slack if slack.seconds > 0 else None


def beside_queue(s: Snapshot, cost: Cost, what: str = "this host work") -> Cost:
    """``cost``, host work in the steps, less the host's slack (what of it
    ran while the device still had queued steps, and so cost no time)."""
    if cost.outside_step or cost.seconds <= 0:
        return cost
    slack = host_slack(s)
    if slack is None:
        return cost
    hidden = min(slack.seconds, cost.seconds)
    said = (f"less {slack.words()}, beside which {what} ran" if hidden < cost.seconds else
            f"all of it beside {slack.words()}")
    return replace(cost, seconds=cost.seconds - hidden,
                   note=f"{cost.note}; {said}" if cost.note else said)
