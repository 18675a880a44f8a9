"""The device's own time per graph, and a read's own latency, measured off the
training thread.

The ``jax.jit`` wrapper's sampled calls (its timed ones: the first 64, then
one in 16; of those, after a function's first 24, at most one every 50 ms,
and past its first 64 one every 500 ms)
hand :meth:`DeviceTimes.offer` the call's start, its smallest output
array and its first input array that was not ready at the call (the
previous step's output, when the device is behind): among the arguments
and their containers, a bounded walk (mnist's ``[(w, b), ...]``, haiku's
``TrainingState(params={module: {name: w}}, ...)``).
A watcher thread (started at the first offer, a daemon) takes each sample
from a bounded queue (full: the sample is dropped and counted, the training
thread never waits) and calls ``block_until_ready()`` on the input, then on
the output, reading the clock after each. The device ran that execution
from the later of the call's start and the input's completion to the
output's completion: its device time (an upper bound by the watcher's
wake-up; the median over samples is kept). Where no input was pending, the
device had nothing of this call's before the call enqueued it: the span
starts at the call's return, not its start, when its output was not ready
there (the call's own host time is no device time: on a TPU v5e a
host-bound step read each step sampled 774 us from its start, where the
whole loop without the read ran at 202 us a step; from the return, the
read's cost came to 0.58 of its A/B, from 0.45, and 0.68-0.90 with the
watcher's wake-up lag taken off such a span (:meth:`DeviceTimes._sample`):
bench/RESULTS-TPU.md); the call's tail after its enqueue makes that a slight
lower bound. An output
ready at the return was computed inside the call (the CPU runs a step
whose inputs are ready in the calling thread): the span is the call's. The
inputs are looked at before the call (:meth:`DeviceTimes.before`): a call
that donates them (``donate_argnums``) deletes them, and a sample whose
pending input was donated is dropped (``donated``: its completion can no
longer be seen; jax's spmd_mnist example made every sample a hook error). A
sample queued behind another whose arrays were ready by the time the watcher
reached it is dropped (``late``): when they completed is lost, and a backlog
read as device time made mnist's 16 ms step 500 ms. The
watcher holds at most the arrays of the queue's samples and the one it
waits on, for as long as the device takes to finish them.

On one sample in four whose output is small (a loss; past the first four
reads, at most one a second), once it is ready, the
watcher also reads it to the host through a fresh array over the same buffer
(the user's array keeps no host copy) with JAX's own, unhooked read: the
wait of a read whose data is ready is the read's own latency (the device ->
host round trip: ~0.7 ms on a TPU v5e, microseconds on the CPU).

Per counted function, the last :data:`KEEP` samples are kept (at most
:data:`MAX_GRAPHS` functions); :mod:`metrics.engines.jax.drains` reads them
to cost each device->host read, and at read time the graph ledger gets each
function's median for the graph it runs (``GraphRecord.device_seconds``,
``device_samples``; a function with several graphs: their mix).

Example:
    >>> times = DeviceTimes()
    >>> times.note(owner="f", graph="h", ns=100); times.note(owner="f", graph="h", ns=300)
    >>> times.device_ns("f"), times.upper_ns("f")
    ((200, 2), 300)
"""

from __future__ import annotations

import atexit
import collections
import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from metrics.recording import forksafe

QUEUE = 4  # samples waiting for the watcher; more are dropped
# A sample wakes the watcher, which takes the GIL from the training thread on
# a host-bound loop (~30 us a sample on the CPU): after each function's first
# FIRST_SAMPLES, its samples are spaced at least SPACING_NS apart in time, not
# in calls, so the watcher costs a bounded share of wall time (<= 20 a second)
# however short the step.
FIRST_SAMPLES = 24  # (a figure stands on 20: some of the first are dropped or compile)
SPACING_NS = 50_000_000
# Once a function has KEEP samples, one every LATER_SPACING_NS: each wakes the
# watcher, which then takes the interpreter lock back from the training
# thread (on a host-bound loop: 0.6 % of a TPU v5e host's 0.56 ms step at 20
# a second, 1.3 % of the CPU's mnist step; bench/tpu_hook_parts.py).
LATER_SPACING_NS = 500_000_000
KEEP = 64  # samples kept per function, per graph and of the latency
MAX_GRAPHS = 256  # functions / graphs kept; a new one past this is not measured
# One sample in PROBE_EVERY with a small output also times a read, and past
# the first PROBE_FIRST at most one per PROBE_SPACING_NS: a read on a TPU
# takes ~0.7 ms, which the training thread may wait on for the interpreter
# lock on a host-bound loop, and the sync latency is a constant of the machine.
PROBE_EVERY = 4
PROBE_FIRST = 4
PROBE_SPACING_NS = 1_000_000_000
PROBE_BYTES = 64 << 10  # the largest output a latency probe reads
LEAVES = 64  # arrays of a sampled call's output (or inputs) looked at
SMALL = 16  # bytes: an output leaf this small is the one (a loss)
NODES = 128  # containers opened to find them (haiku's params: a dict of dicts)


# DeviceTimes.before: no sample of the function is due (the call is not looked at).
NOT_DUE = object()
_LOOK = object()  # (offer's default: look for the pending input among the arguments)
_PROBE = object()  # a queue item of probe's, not a sample

def _median(values: collections.deque[int]) -> int:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2


class DeviceTimes:
    """Per counted function and graph, device ns per execution; the sync
    latency. ``offer`` runs on the training thread (sampled calls only);
    everything else on the watcher or at read time."""

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns,
                 read: Callable[[Any], Any] | None = None,
                 on_graph: Callable[[str, int, int], None] | None = None,
                 on_error: Callable[[str, Exception], None] | None = None) -> None:
        self.clock = clock
        self.read = read  # JAX's own ArrayImpl._value getter: the latency probe
        self.on_graph = on_graph  # (graph hash, median ns, samples): the ledger's
        self.on_error = on_error
        self.pending: collections.deque[tuple[Any, ...]] = collections.deque()
        self.wake = threading.Event()
        self.dropped = 0  # samples the full queue refused
        self.late = 0  # queued samples already ready when the watcher reached them: dropped
        self.donated = 0  # samples whose pending input the call deleted (donated): dropped
        self.held = 0  # samples the watcher is waiting on now (0 or 1)
        self.by_owner: dict[Any, collections.deque[int]] = {}
        self.latency: collections.deque[int] = collections.deque(maxlen=KEEP)
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._stop = False
        self._probe = 0
        self._probe_next = 0  # the clock (ns) from which the next read may be timed
        self._pid_registered = False
        # Per function: [samples offered, the earliest start of its next one].
        self._spacing: dict[Any, list[int]] = {}

    # Training thread ---------------------------------------------------------

    def due(self, owner: Any) -> bool:
        """Whether a sample of ``owner`` is due now (the spacing past)."""
        spaced = self._spacing.get(owner)
        return spaced is None or time.monotonic_ns() >= spaced[1]

    def before(self, owner: Any, args: tuple[Any, ...]) -> Any:
        """Ahead of a timed call of ``owner`` with ``args``: :data:`NOT_DUE`
        where no sample of it is due; else its first input not ready now, or
        None. Looked at before the call, which may donate (delete) them
        (``donate_argnums``: a deleted array can no longer be waited on)."""
        if not self.due(owner):
            return NOT_DUE
        try:
            return _first_pending(args)
        except Exception as e:  # noqa: BLE001 - a hook never raises into the program
            if self.on_error is not None:
                self.on_error("jax.device_time", e)
            return NOT_DUE

    def offer(self, owner: Any, start: int, args: tuple[Any, ...], out: Any,
              end: int | None = None, behind: Any = _LOOK) -> None:
        """One sampled call of ``owner`` that began at ``start`` (and returned
        at ``end``, where told): its output and a not-yet-ready input
        (``behind``: :meth:`before`'s, else looked for among ``args`` now) go
        to the watcher, or nowhere when the queue is full, or within
        SPACING_NS of its previous sample, or when the pending input was
        donated to the call (its completion can no longer be seen). Never waits."""
        if behind is NOT_DUE:
            return
        spaced = self._spacing.get(owner)
        if spaced is None:
            if len(self._spacing) >= MAX_GRAPHS:
                return
            spaced = self._spacing[owner] = [0, 0]
        if start < spaced[1]:
            return
        spaced[0] += 1
        if spaced[0] >= FIRST_SAMPLES:
            spaced[1] = start + (SPACING_NS if spaced[0] < KEEP else LATER_SPACING_NS)
        queued = len(self.pending)
        if queued >= QUEUE:
            self.dropped += 1
            return
        leaf = _smallest(out)
        if leaf is None:
            return
        if behind is _LOOK:  # the step's params or state
            behind = _first_pending(args)
        elif behind is not None and behind.is_deleted():
            self.donated += 1
            return
        if self._thread is None:  # the first offer (or a forked child's)
            self._start()
        # Behind another sample (the watcher busy): it may reach this one only
        # after its output was ready, when its completion time is lost.
        late = queued > 0 or self.held > 0
        returned = False
        if behind is None and end is not None and not leaf.is_ready():
            start, returned = end, True  # nothing pending, run after the call: after the enqueue
        self.pending.append((owner, getattr(owner, "last_hash", None), start, behind, leaf, late,
                             returned))
        self.wake.set()

    def probe(self, args: tuple[Any, ...]) -> list[int] | None:
        """When the device finishes the first of ``args`` not ready now (the
        training steps' latest output, which a gap's first call or eager op
        takes): a cell the watcher sets to its completion's clock (ns), or to
        -1 where it found it ready (behind another sample: when is lost);
        None where none is pending or the queue is full. A gap's queue,
        measured (:mod:`~metrics.engines.jax.gaps`). Never waits."""
        if len(self.pending) >= QUEUE + 2:  # (samples fill QUEUE: a probe a gap past them)
            return None
        try:
            pending = _first_pending(args)
        except Exception:  # noqa: BLE001 - a hook never raises into the program
            return None
        if pending is None:
            return None
        if self._thread is None:
            self._start()
        cell = [0]
        self.pending.append((_PROBE, pending, cell))
        self.wake.set()
        return cell

    def _start(self) -> None:
        self._pid, self._stop = os.getpid(), False
        self.pending.clear()  # a parent's samples, in a forked child
        self.wake = threading.Event()
        t = threading.Thread(target=self._watch, name="tpu-info-device-time", daemon=True)
        t.start()
        self._thread = t
        if not self._pid_registered:
            self._pid_registered = True
            atexit.register(self.stop)  # before JAX's own exit handler clears the backends
            forksafe.in_child(self._forget_thread)

    def _forget_thread(self) -> None:
        """In a forked child: the parent's watcher does not exist here."""
        self._thread = None

    def stop(self, timeout: float = 1.0) -> None:
        """Stops the watcher (at exit): it finishes the sample it holds."""
        self._stop = True
        t = self._thread
        if t is not None and t.is_alive() and self._pid == os.getpid():
            self.wake.set()
            t.join(timeout)

    # Watcher -----------------------------------------------------------------

    def _watch(self) -> None:
        pending, wake = self.pending, self.wake
        while not self._stop:
            if not pending:
                wake.wait()
                wake.clear()
                continue
            item = pending.popleft()
            if item[0] is _PROBE:
                self._finish(item[1], item[2])
            else:
                self._sample(*item)

    def _finish(self, pending: Any, cell: list[int]) -> None:
        """:meth:`probe`'s wait, off the training thread."""
        try:
            if pending.is_ready():
                cell[0] = -1
                return
            pending.block_until_ready()
            cell[0] = self.clock()
        except Exception:  # noqa: BLE001 - donated to the next call: not known
            cell[0] = -1

    def _sample(self, owner: Any, graph: str | None, start: int, behind: Any,
                leaf: Any, late: bool = False, returned: bool = False) -> None:
        """Waits for one sample off the training thread; its arrays are let go
        of when this returns. A sample queued behind another (``late``) whose
        output, or the input it waits for first, is ready when the watcher
        reaches it is dropped: that finished at some unknown time before, so
        neither the end nor the start of its execution is known.

        A span from the call's return (``returned``) has the watcher's wake-up
        lag at its end only: it loses the read latency the watcher measured
        (on a TPU v5e ``block_until_ready`` sees a completion ~650 us late, a
        ready scalar's read takes 520-590 us: a 31 us graph read 652 us from
        its call's return; bench/tpu_wakeup_lag.py). A span between two
        completions the watcher saw has the lag at both ends and keeps it."""
        clock = self.clock
        self.held = 1
        try:
            if late and (leaf.is_ready() or behind is not None and behind.is_ready()):
                self.late += 1
                return
            began = start
            if behind is not None:
                behind.block_until_ready()
                began = max(start, clock())
            leaf.block_until_ready()
            done = clock()
            lag = _median(self.latency) if returned and self.latency else 0
            self.note(owner, graph, done - began - lag)
            self._probe += 1
            if (self.read is not None and self._probe % PROBE_EVERY == 1
                    and done >= self._probe_next):
                self._time_read(leaf)
                if len(self.latency) >= PROBE_FIRST:
                    self._probe_next = done + PROBE_SPACING_NS
        except Exception as e:  # noqa: BLE001 - a donated or deleted array: no sample
            if self.on_error is not None and "deleted" not in str(e).lower():
                self.on_error("jax.device_time", e)
        finally:
            self.held = 0

    def _time_read(self, leaf: Any) -> None:
        """The latency of a read whose data is ready: a fresh array over the
        leaf's first shard (its own host copy, none cached on the user's),
        read with JAX's unhooked getter."""
        shard = leaf.addressable_shards[0].data
        if shard.nbytes > PROBE_BYTES:
            return
        from jax._src.array import ArrayImpl

        fresh = ArrayImpl(shard.aval, shard.sharding, [shard], committed=True,
                          _skip_checks=True)
        t0 = self.clock()
        self.read(fresh)  # type: ignore[misc]
        self.latency.append(self.clock() - t0)

    def note(self, owner: Any, graph: str | None, ns: int) -> None:
        """One execution's device time (the watcher's, or a test's)."""
        kept = self.by_owner.get(owner)
        if kept is None:
            if len(self.by_owner) >= MAX_GRAPHS:
                return
            kept = self.by_owner[owner] = collections.deque(maxlen=KEEP)
        kept.append(max(0, ns))

    def publish(self) -> None:
        """Each measured function's median, to its graph in the ledger (read
        time: a function's graph is known once its calls are folded)."""
        if self.on_graph is None:
            return
        for owner, kept in list(self.by_owner.items()):
            graph = getattr(owner, "last_hash", None)
            if graph and kept:
                self.on_graph(graph, _median(kept), len(kept))

    # Read time ---------------------------------------------------------------

    def device_ns(self, owner: Any) -> tuple[int, int] | None:
        """(median device ns of one execution, samples) of ``owner``'s calls."""
        kept = self.by_owner.get(owner)
        return (_median(kept), len(kept)) if kept else None

    def upper_ns(self, owner: Any) -> int | None:
        """The upper quartile of ``owner``'s device ns per execution: the top
        of the samples' spread that a cost stands on (a drain or a gap's own
        time is never what the samples' shortfall from the device's period
        made: under CPU contention the watcher's wake-ups spread them, the
        median 36 ms against a 40.5 ms step)."""
        kept = self.by_owner.get(owner)
        if not kept:
            return None
        s = sorted(kept)
        return s[(3 * (len(s) - 1) + 3) // 4]  # (index: 3/4 of the way, rounded up)

    def latency_ns(self) -> tuple[int, int] | None:
        """(median ns of a read whose data was ready, samples)."""
        kept = self.latency
        return (_median(kept), len(kept)) if kept else None


def _leaves(out: Any) -> list[Any]:
    """The arrays among ``out`` and its containers (dicts, lists, tuples,
    dataclasses: a step's ``(params, loss)``, mnist's ``[(w, b), ...]``,
    haiku's ``TrainingState(params={module: {name: w}}, ...)``), the
    shallowest first (a loss beside the params), at most ``LEAVES`` of them
    after opening at most ``NODES`` containers: bounded however large the
    tree (a sampled call's cost)."""
    if _is_array(out):
        return [out]
    found: list[Any] = []
    todo = collections.deque([out])
    nodes = 0
    while todo and nodes < NODES and len(found) < LEAVES:
        nodes += 1
        for x in itertools.islice(_items(todo.popleft()), LEAVES):  # a wide dict: its first
            if isinstance(x, _CONTAINERS):
                todo.append(x)
            elif _is_array(x):
                found.append(x)
            elif hasattr(type(x), "__dataclass_fields__"):
                todo.append(x)
    return found[:LEAVES]


_CONTAINERS = (dict, list, tuple)


def _is_array(x: Any) -> bool:
    """An array the watcher can wait on and ask (a typed PRNG key array can
    be waited on but has no ``is_ready``: dpsgd's step takes one)."""
    return hasattr(x, "is_ready") and hasattr(x, "block_until_ready")


def _items(x: Any) -> Any:
    if isinstance(x, dict):
        return x.values()
    if isinstance(x, (tuple, list)):
        return x
    fields = getattr(type(x), "__dataclass_fields__", None)  # flax's TrainState, eqx modules
    if fields is not None:
        return [getattr(x, name, None) for name in fields]
    return ()


def _first_pending(args: tuple[Any, ...]) -> Any:
    """The first array among ``args`` (and their containers) not ready now;
    None where all are. A deleted one (donated to an earlier call) is no
    input of this call."""
    for a in args:
        for x in _leaves(a):
            if not x.is_deleted() and not x.is_ready():
                return x
    return None


def _smallest(out: Any) -> Any:
    """The smallest array among ``out``'s leaves (:func:`_leaves`: a step's
    ``(params, loss)``: the loss; the first of at most ``SMALL`` bytes), or None."""
    best = None
    least = 0
    for x in _leaves(out):
        n = x.nbytes
        if best is None or n < least:
            best, least = x, n
            if n <= SMALL:  # a scalar: none is smaller to read (nbytes costs ~1.5 us each)
                break
    return best
