"""What the hook saw the program do, and what the views conclude: the lines
that synced or moved data (:class:`SiteReading`), the steps
(:class:`StepsReading`), the program's phases (:class:`Phase`) and the
problems in plain words (:class:`Finding`).

:mod:`tpu_info.contract.model` re-exports every name here; import from either.

Example:
    >>> Phase("periodic") is Phase.PERIODIC, Finding("x", "info").severity.label
    (True, 'info')
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class SiteKind(str, enum.Enum):
    """What happened at a :class:`SiteReading`'s line."""

    # Device -> host reads the program did not ask for with device_get:
    # float(x), int(x), bool(x) (``if x > 0:``), x.tolist(), print(x).
    SYNC = "sync"
    # Host data moved to the device with no device_put: a numpy array passed
    # into a jitted function, jnp.asarray(numpy), per-call shard transfers.
    IMPLICIT_TO_DEVICE = "implicit_to_device"
    # A torch.compile graph break Dynamo resumes from: ``seconds`` is the
    # Python run between the two compiled graphs, ``count`` the crossings.
    GRAPH_BREAK = "graph_break"
    # Eager (un-jitted) JAX primitives run from this line, each dispatched on
    # its own: ``count`` the times the line ran them, ``seconds`` host time
    # inside them (their compiles apart), ``detail`` the primitives' names.
    EAGER_OP = "eager_op"
    # A jitted function other than the step called from this line in the
    # loop's gaps (an evaluation's loop): ``count`` the times it was called
    # after other work (its first call of each gap), not every call.
    CALL = "call"
    # jax.device_get from this line (a checkpoint's copy of the state):
    # ``count`` calls, ``bytes`` copied, ``seconds`` inside them.
    DEVICE_GET = "device_get"
    # torch: ``model.eval()`` from this line between optimizer steps (an
    # evaluation begins): ``count`` calls. Leads the gap it began.
    EVAL_MODE = "eval_mode"
    # torch: ``torch.save`` from this line (a checkpoint): ``count`` calls.
    SAVE = "save"
    # torch: a ``torch.no_grad()`` or ``torch.inference_mode()`` block the
    # user entered at this line (its ``with``, or a decorated function's
    # call) between optimizer steps, not between every two: an evaluation
    # with no ``model.eval()``. ``count`` entries. Leads its gap after
    # ``model.eval()`` and a compiled call with gradients off.
    NO_GRAD = "no_grad"
    # A library's jit wrapper called from this line (``via``: which, e.g.
    # :data:`NNX_JIT`; ``detail``: its inner jitted function): ``count`` its
    # calls, ``timed`` the sampled ones, ``seconds`` their median host time
    # outside the inner jitted call (the wrapper's own work) times ``count``.
    LIBRARY_JIT = "library_jit"
    # The training thread's own host work between the step's calls at this
    # line (no JAX in it: a loader's numpy), over sampled intervals between
    # steps: ``timed`` the intervals, ``seconds`` its median time per
    # interval times ``timed`` (per step: ``seconds / timed``), ``count`` the
    # intervals it had time in, ``detail`` the calls the time went into.
    HOST_WORK = "host_work"
    # JAX: time under JAX's own code in those intervals, at the user's line
    # that entered it (an eager ``value_and_grad`` of a jitted loss, an
    # optimizer update run op by op): fields as ``host_work``'s, ``detail``
    # the functions the line entered (``jax value_and_grad``).
    EAGER_WORK = "eager_work"
    # torch: the batches the main thread drew from a DataLoader at this line
    # (the ``for`` line): ``count`` batches, ``seconds`` its time in their
    # ``__next__`` (with ``num_workers=0`` their samples' loading; with
    # workers, its wait for them), ``detail`` ``num_workers=N``.
    DATA_LOADER = "data_loader"
    # The process's other Python threads of one name (numbers dropped: a
    # prefetch pool's ``grain-prefetch``) while the step loop ran, at the line
    # their stacks were at most (the user's, else a library's): ``seconds``
    # their CPU time in the sampled windows, ``count`` the windows they were
    # busy in, ``timed`` the windows, ``detail`` how many and their name.
    THREAD_WORK = "thread_work"
    # torch: ``nn.Parameter`` leaves a ``backward()`` at this line gave
    # gradients that no optimizer steps (checked once, on one backward after
    # the first optimizer step): ``count`` tensors, ``bytes`` their
    # gradients', ``timed_bytes`` the optimizers' parameters' (both per
    # backward), ``detail`` their elements and largest shapes.
    UNUSED_GRADIENTS = "unused_gradients"


# A LIBRARY_JIT site's ``via``: flax's nnx.jit (its per-call graph split and
# merge of the Modules and optimizer it is passed).
NNX_JIT = "flax nnx.jit"
# ... called through flax's nnx.cached_partial (its graph traversal cached).
NNX_CACHED_PARTIAL = "flax nnx.cached_partial"


# The primitives indexing binds (an EAGER_OP site's detail keeps one even
# when its other names fill it): x[idx] with an index array (gather), x[i]
# with an array or traced scalar (dynamic_slice), x[a:b] (slice).
INDEXING_OPS = frozenset({"gather", "dynamic_slice", "slice"})


class PeriodicWork(enum.StrEnum):
    """What the work in the step loop's gaps was (:attr:`SiteReading.work`),
    told by the hook from what ran there: another jitted function's calls
    (or the step's at other shapes), copies of the state to the host, a read;
    in torch, ``model.eval()`` or ``torch.save`` between optimizer steps."""

    NONE = ""
    EVALUATION = "evaluation"
    CHECKPOINT = "checkpoint"
    LOGGING = "logging"
    # Another jitted function whose output the step takes (``augment(batch)``
    # before ``train_step``): the step's input, made between its calls.
    INPUT = "input"
    # JAX: a read that waited for device work sent in the gap beyond the
    # training steps' queue (their count x the step's measured device time),
    # work the hook did not see called: eager ops JAX runs in C++ after their
    # first call (an un-jitted evaluation). Led by the read.
    DEVICE_WORK = "device_work"


class Phase(enum.StrEnum):
    """The part of the program something happened in, told from the step
    loop (the first step's start to the latest step's end) and how often it
    recurred there. A plain string from the wire that is none of these reads
    as :attr:`UNKNOWN`."""

    UNKNOWN = "unknown"  # the steps are not known: no phase can be told
    SETUP = "setup"  # before the first step: model and data set-up, first compiles
    STEP = "step"  # in the step loop, in (nearly) every step
    PERIODIC = "periodic"  # in the loop's gaps every N steps: evaluation, logging, checkpoints
    ONCE = "once"  # in the step loop, once: not a per-step cost
    TEARDOWN = "teardown"  # after the last step: final evaluation, saving


@dataclass(frozen=True, slots=True)
class SiteReading:
    """One line of the user's code that did something costly, every time.

    ``location`` is ``/abs/path/file.py:LINE`` (resolved when read, never on
    the hot path); ``detail`` says how (``float()``, ``print``,
    ``jnp.asarray``, ``numpy argument of jit(step)``). ``kind`` is a
    :class:`SiteKind` value (kept a plain string on the wire so a newer
    hook's kinds still travel).
    """

    kind: str
    location: str
    count: int
    bytes: int = 0
    seconds: float = 0.0
    function: str = ""
    detail: str = ""
    last_seen_unix: float = 0.0
    first_seen_unix: float = 0.0
    phase: str = ""  # a Phase value, filled by the hook at read time ("": not told)
    via: str = ""  # the library call the user's line went through
    # How many separate times the line ran: reads in one step's (or one
    # evaluation's) burst count once; 0 when the engine does not tell.
    occurrences: int = 0
    # Steps from the first occurrence's step to the last's (the step index
    # the hook kept); 0 when the engine does not tell. ``steps_spanned /
    # (occurrences - 1)`` is how many steps apart periodic work ran, exact
    # where a loop's time per step is not (one-off compiles in it).
    steps_spanned: int = 0
    # A read's drain (kind sync): per read, ``h + w - max(h, d)`` (h: the
    # host's own time since the previous read ended, w: its wait, d: the
    # device's measured time for the work between; metrics.engines.jax.drains),
    # summed: what the read added to the loop. ``seconds -
    # drain_seconds`` is the device's queued work the reads waited for. None:
    # not told (another kind, or an older hook).
    drain_seconds: float | None = None
    # Records of the line that were timed (a host->device copy's time is
    # sampled: the jit wrapper times a sample of its numpy arguments) and the
    # bytes they moved: the site's ``seconds`` are theirs. 0: not told (an
    # older hook, or a kind whose every record is timed).
    timed: int = 0
    timed_bytes: int = 0
    # The loop's gaps this line led (the step function's calls around them
    # bound them: metrics/engines/jax/gaps.py): ``work`` a PeriodicWork value,
    # ``gaps`` how many, ``gap_seconds`` their wall time, each from its first
    # record to the step's next call. ``within``: the line that led the gaps
    # this one sat in (its time is that line's). Empty/0/None: not told.
    work: str = ""
    gaps: int = 0
    gap_seconds: float | None = None
    within: str = ""
    # The line runs in a generator function (a data loader that yields
    # batches; a generator expression counts as the enclosing function's),
    # which jit cannot hold. False: not, or not told.
    in_generator: bool = False
    # count, bytes and seconds are estimates from a random sample of the
    # line's records, each weighted (torch's reads past the first 1,000: one
    # in 64, weighted 64). False: every record counted, or not told.
    estimated: bool = False
    # host_work: the line's median share of its sampled intervals' wall time
    # (0 in those it had no time in): what a step spends there is this times
    # the steady step, whatever the intervals' own lengths (an RL loop's
    # first episodes, sampled most, are its shortest). None: not told.
    interval_share: float | None = None


# StepsReading.source values.
STEPS_MARKED = "marked"  # metrics.mark_step / metrics.track, or the engine's own steps
STEPS_INFERRED = "inferred"  # picked by the hook from what the program did


@dataclass(frozen=True, slots=True)
class StepsReading:
    """How many training steps ran and how long they took.

    ``source`` is :data:`STEPS_MARKED` or :data:`STEPS_INFERRED`; ``basis``
    says in words what a step was taken to be (``jit(train_step): the
    compiled function with the most time, 1,200 calls``). ``seconds_total``
    is the wall time the steps cover (first step start to last step end),
    ``None`` when unknown. ``first_unix`` and ``last_unix`` bound the step
    loop (the first step's start, the latest step's end; ``None`` when
    unknown): what happened before it is set-up, after it tear-down.
    ``excluded_calls`` counts calls of the step's function that are not
    steps (evaluation with gradients off). ``loop_ended``: the program has
    ended (a saved run's last snapshot), so whatever came after the latest
    step is tear-down, however soon after it. ``step_line``: the user's line
    (``/w/train.py:41``) whose calls the steps are when the step itself is
    not jitted (a plain Python train step around a library's jitted
    functions, optax's: those calls were counted); "" otherwise.
    """

    count: int
    source: str
    basis: str = ""
    seconds_total: float | None = None
    first_unix: float | None = None
    last_unix: float | None = None
    excluded_calls: int = 0
    loop_ended: bool = False
    step_line: str = ""
    # Steps that held a compile or the backend's start-up, and the seconds
    # those took (the engine's ``CompileStepTime``, joined by
    # :func:`tpu_info.views.cost.steps_of`): one-off time inside the loop,
    # apart from the steady steps.
    compile_steps: int = 0
    compile_seconds: float = 0.0
    # The measured wall time of evaluations and checkpoints in the loop's gaps
    # (inside the steps' span; joined by steps_of too): not the steps' own.
    periodic_seconds: float = 0.0

    @property
    def seconds_per_step(self) -> float | None:
        if not self.count or self.seconds_total is None:
            return None
        return self.seconds_total / self.count

    @property
    def steady_seconds_total(self) -> float | None:
        """The steps' wall time less the compiles (and start-up) inside them
        and the periodic work between them: what shares of step time are
        taken over; None when unknown."""
        if self.seconds_total is None:
            return None
        return max(0.0, self.seconds_total - self.compile_seconds - self.periodic_seconds)

    @property
    def steady_seconds_per_step(self) -> float | None:
        """The mean steady step: the steps less the compiles inside them."""
        total = self.steady_seconds_total
        if not self.count or total is None:
            return None
        return total / self.count


class Severity(enum.StrEnum):
    """How much a :class:`Finding` matters; ``label`` is its word in tables."""

    ERROR = "error"  # something could not be read at all
    WARNING = "warning"  # costs the program time: worth fixing
    INFO = "info"  # worth knowing; nothing to fix

    @property
    def label(self) -> str:
        """The four-letter word tables show: ``FAIL``, ``warn``, ``info``."""
        return _SEVERITY_LABELS[self]


_SEVERITY_LABELS = {Severity.ERROR: "FAIL", Severity.WARNING: "warn", Severity.INFO: "info"}


@dataclass(frozen=True, slots=True)
class Finding:
    """A problem in plain words, ranked by what it cost (``seconds_lost``, then
    ``share_of_step``).

    ``kind`` is a stable snake_case name per rule (``per_step_sync``,
    ``recompile_short_last_batch``, ``eager_ops``); ``location`` the user's
    line; ``count`` how many times it happened; ``per_step`` how often per
    step, ``seconds_per_step`` its cost per step and ``share_of_step`` (0..1)
    that cost over the step time: ``None`` when the steps (or their time) are
    not known, never guessed. ``cost_estimated`` says the cost was estimated
    (bytes over a transfer rate) rather than timed; ``bytes_per_step`` is what
    a transfer finding moved per step (None for other kinds, or steps unknown).
    ``severity`` is a
    :class:`Severity` (a plain string given to the constructor becomes one;
    an unknown one is :attr:`Severity.INFO`). ``phase`` is the
    :class:`Phase` it happened in ("": not told); work outside the step
    (set-up, periodic, once) has no per-step figures but ``share_of_run``, its
    time over the run's wall time so far, and ``every_steps`` for periodic work.
    """

    message: str
    severity: Severity = Severity.WARNING
    location: str | None = None
    seconds_lost: float = 0.0
    kind: str = ""
    count: int | None = None
    per_step: float | None = None
    seconds_per_step: float | None = None
    share_of_step: float | None = None
    cost_estimated: bool = False
    bytes_per_step: float | None = None
    phase: str = ""
    share_of_run: float | None = None
    every_steps: float | None = None

    def __post_init__(self) -> None:
        if type(self.severity) is not Severity:  # mapped here, once, for every reader
            severity = _SEVERITY_OF.get(self.severity, Severity.INFO)
            object.__setattr__(self, "severity", severity)


_SEVERITY_OF: dict[str, Severity] = {s.value: s for s in Severity}
