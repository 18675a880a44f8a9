"""What the JAX hook's parts share: one typed :class:`JaxContext`.

The wrappers installed into JAX (``jax.jit``'s, ``Compiled.__call__``'s,
the compiler's, ``device_put``'s) run in the user's calls, whoever made
them; each is given the context when it is made and reads
:attr:`JaxContext.active` once per call (None: it passes straight through).
The engine (:mod:`.engine`) sets ``active`` at install; no part imports the
engine or another part's module state.

Example:
    >>> from metrics.engines.jax.context import CONTEXT
    >>> CONTEXT.active is None or CONTEXT.active.name == "jax"
    True
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Hashable
from typing import TYPE_CHECKING, NamedTuple, cast

if TYPE_CHECKING:
    from metrics.engines.jax.calls import Owner
    from metrics.engines.jax.engine import JaxEngine
    from metrics.engines.jax.steps import MarkedSteps
    from tpu_info.contract.model import RecompileCause

ENGINE = "jax"

# Hot paths write each record as its fields, in one ``deque.extend`` (atomic
# under the GIL, like an append): the journal then holds only numbers and
# existing objects, so records waiting to be folded make no new objects for
# the garbage collector to count and trace, and a fold takes each field as
# one slice. Transfers: (to_device, start, end, bytes). Counted calls:
# (owner, key, start, end, compiled graph or None).
TRANSFER_FIELDS = 4
CALL_FIELDS = 5

RECENT_COMPILES = 64  # per thread; a call that compiles more finds its first among these
MAX_AOT_GRAPHS = 4096  # executable fingerprints kept (oldest dropped first)


class Lowering(NamedTuple):
    """What a lowering tells the compile that follows it on the same thread."""

    name: str  # the graph's name: ``jit(step)``
    fun_name: str
    signature: tuple[str, ...]  # one ``name: f32[8]`` per input
    moved: RecompileCause | None  # an input on another device than last time
    loop: tuple[str, int] | None = None  # the user's line that filled the graph (loops.py)
    const_bytes: int = 0  # arrays closed over, compiled into the graph as constants


class CompileInProgress:
    """One backend compile on this thread: what the wrapped cache read and
    the ``jax.monitoring`` cache-hit event tell the compile wrapper."""

    __slots__ = ("cache_key", "cache_hit", "executable")

    def __init__(self) -> None:
        self.cache_key: str | None = None
        self.cache_hit = False
        self.executable: object = None  # what the compile returned (AOT calls find it)


class CompileLocal(threading.local):
    """Per thread: the compile in progress, the lowering the next compile
    gets, pending recompile explanations by function, and this thread's
    newest compiles ((seq, graph hash): a counted call learns its graph)."""

    compile: CompileInProgress | None = None
    lowering: Lowering | None = None
    causes: dict[str | None, RecompileCause] | None = None
    compiles: deque[tuple[int, str]] | None = None


class JaxContext:
    """The state the JAX hook's parts share; one per process (:data:`CONTEXT`)."""

    def __init__(self) -> None:
        # The installed engine (None while none is): each wrapper reads it
        # once per call.
        self.active: JaxEngine | None = None
        # Bumped by every compile; a counted call compares it before and
        # after, which is cheaper than resetting a thread-local on every call.
        self.compile_seq: list[int] = [0]
        self.local = CompileLocal()
        # executable fingerprint -> (graph hash, graph name), noted at compile time
        self.aot_graphs: dict[Hashable, tuple[str, str]] = {}
        # One owner per (user function, jit options), so a function re-jitted
        # every call (``jax.jit(f)(x)`` in a loop) is one function with its graphs.
        self.owners: weakref.WeakKeyDictionary[object, dict[str, Owner]] = (
            weakref.WeakKeyDictionary())
        # The jax.monitoring listeners are registered once per process: what
        # could not be listened to, in words (None until registered).
        self.listeners_missing: list[str] | None = None
        # What a device->host read's step index is (its ``calls`` now): the
        # step function, so a burst of reads in one evaluation is one
        # occurrence of its line (an eval function's own calls are not
        # steps). Guessed by counted calls' timed calls (step_candidate)
        # until the step watch names it at a read (name_step); None: each
        # read is its own occurrence.
        self.step_owner: Owner | MarkedSteps | None = None
        self.step_named = False
        # Monotonic-ns spans in which the backends opened (startup.py): taken
        # out of whatever transfer, read or op they fell in, at fold time.
        self.startups: list[tuple[int, int]] = []
        # The function whose call came last with nothing else after it: a
        # call of any other (or after a read) goes to gaps.at_call, where the
        # step's call closes a gap in the loop (evaluation, checkpoint).
        self.gap_owner: object = None
        # The step's latest call after other work (a gap's end): (its start
        # ns, its step index, the step). The device runs none of the steps
        # from it on before it: an eager op that waited for queued steps is
        # charged only its time past them (eager.py).
        self.gap_call: tuple[int, int, object] | None = None
        # The thread the step was called on at its latest gap's end (0: none
        # yet): calls and reads on other threads (an actor, a prefetcher
        # feeding a queue the loop waits on) are no work in the loop's gaps.
        self.step_thread = 0
        # A gap's first call of another function: (its ns, the thread's CPU
        # ns then, the ns it had waited for a core), or None; the step's next
        # call hands gaps.py the time the thread spent blocked between (a
        # dispatch behind the queued steps): gaps.blocked_ns.
        self.gap_cpu: tuple[int, int, int | None] | None = None
        # The step indices of the latest eager op and of the latest before it
        # at another index (eager.py): ops at a step index after steps without
        # any start a gap (an un-jitted evaluation's).
        self.eager_step = self.eager_prev = -2
        # The functions in their first calls (calls.note_feedback): whose
        # output feeds which other function's call.
        self.checking: set[Owner] = set()

    def step_candidate(self, owner: Owner) -> None:
        """A timed call of ``owner``: it becomes the guessed step when it
        outranks the current guess: a tracked function first, then one whose
        name does not say evaluation, then the user's own over a library's
        (optax's helpers: :attr:`Owner.library`), then one whose output feeds its next
        call (a training step's state; ``Owner.fed_back``), then more calls (the step watch ranks
        by time once it can: :meth:`name_step`)."""
        lead = cast("Owner | None", self.step_owner)  # (guessed only while none is named)
        if lead is None or (step_rank(owner), owner.calls) > (step_rank(lead), lead.calls):
            self.step_owner = owner
            self.gap_owner = None

    def succeed(self, owner: Owner) -> None:
        """A timed call of ``owner``, not the named step: where it bears the
        inferred step's name and the step was not called since its previous
        timed call (TIME_EVERY calls of it ago), it is the step now: a second
        training loop's (optax's reduce_on_plateau trains twice, each part
        with its own ``jax.jit(train_step)``: the second part's evaluations
        were one gap of the first part's step, never named)."""
        step = self.step_owner
        if (getattr(step, "name", None) != owner.name or getattr(step, "explicit", True)
                or owner.fed_back <= 0 or owner.evaluation):  # (a step carries its state)
            return
        seen = step.calls  # type: ignore[union-attr]
        if owner.step_calls_seen == seen:
            owner.calls += seen  # the step index goes on from the first loop's
            self.step_owner, self.gap_owner = owner, None  # (named, or guessed, as it was)
        owner.step_calls_seen = seen

    def name_step(self, step: Owner | MarkedSteps | None) -> None:
        """The step watch's step (marked steps, the tracked or inferred step
        function); None: forget it and guess again (a reset, an install).
        The same step named again (each snapshot names it) is no gap's end.
        A function named by time whose output never fed its next call stays
        a guess (:meth:`step_candidate` may still replace it): a save in the
        first second names an evaluation run before the loop, and every
        call of the loop's step would be a gap of it until the next naming;
        so does one whose name says evaluation (optax's mlp_mnist: nnx.jit's
        eval_step hands the model's state back, and its 40 calls before the
        loop named it at a scrape: the loop's reads took its call count as
        their step, six prints every 20 steps one occurrence)."""
        if step is None or step is not self.step_owner:
            self.gap_owner = None
        self.step_owner = step
        self.step_named = step is not None and (getattr(step, "explicit", True) or (
            getattr(step, "fed_back", 1) > 0 and not getattr(step, "evaluation", False)))

    def note_compile(self, graph_hash: str) -> None:
        """Counts one compile (the engine calls it) and notes its graph for
        the call it happens in."""
        self.compile_seq[0] += 1
        local = self.local
        recent = local.compiles
        if recent is None:
            recent = local.compiles = deque(maxlen=RECENT_COMPILES)
        recent.append((self.compile_seq[0], graph_hash))

    def compiled_since(self, seq: int) -> str | None:
        """The graph of this thread's first compile after ``seq``: a call's own
        graph (compiles nested in running it, such as resharding an input of a
        pmapped call, come after it); None when this thread compiled none."""
        for n, graph_hash in self.local.compiles or ():
            if n > seq:
                return graph_hash
        return None

    def remember_executable(self, executable: object, graph_hash: str, name: str) -> None:
        """Notes which graph ``executable`` (what the backend compile returned)
        runs, for AOT-compiled calls (:mod:`.aot`); once per compile (~0.6 us)."""
        try:
            fingerprint = executable.fingerprint  # type: ignore[attr-defined]
            hash(fingerprint)
        except Exception:  # noqa: BLE001 - a backend without fingerprints: AOT calls have no graph
            return
        if fingerprint is None:
            return
        known = self.aot_graphs
        if len(known) >= MAX_AOT_GRAPHS:
            del known[next(iter(known))]
        known[fingerprint] = (graph_hash, name)

    def hook_failed(self, where: str, error: BaseException) -> None:
        """A failure inside a hook: counted by the installed engine's
        recorder (none installed: nothing to count it in), swallowed."""
        eng = self.active
        if eng is not None and isinstance(error, Exception):
            eng.rec.hook_failed(where, error)


def step_rank(step: object) -> tuple[bool, bool, bool, bool]:
    """What makes a step function more likely the loop's than another, before
    time and calls: tracked, a name that does not say evaluation, the user's
    own (not a library's), its output fed to its next call. Marked steps
    (no such attributes) rank first."""
    return (getattr(step, "explicit", True), not getattr(step, "evaluation", False),
            not getattr(step, "library", False), getattr(step, "fed_back", 1) > 0)


# The process's context: the adapter's entry points (``create``, ``track``)
# hand it to the parts; the parts never read it from here.
CONTEXT = JaxContext()
