"""A library's jit wrapper's own host time, around the jitted call it makes.

flax's ``nnx.jit`` returns a ``JitWrapped`` whose ``__call__`` splits the
Modules and optimizer it is passed into a graph definition and state, calls
an inner ``jax.jit`` of its own on the state, and merges the result back:
per call, on the host, outside the inner call the ``jax.jit`` hook times
(:mod:`metrics.engines.jax.calls`). On issue 41's nnx_vae that work was
about a third of the step (an A/B against ``nnx.cached_partial``), and the
step's host time read as "other".

When the library's module is imported (:mod:`metrics.engines.importwatch`;
at once where it already is), its wrapper class's ``__call__`` is replaced
(:data:`WRAPPERS`; restored at uninstall). Every call counts once; a call
whose inner jitted call the hook times anyway (the inner wrapper's own
schedule, :mod:`metrics.recording.sampling`: its next call is timed) also
reads the clock around the whole call, and after it finds the inner call's
timed record at the end of the calls journal (and the clock the inner
wrapper read as it returned, once the hook's own work after the call was
done: one more clock read on those calls): the wrapper's own time is the
time before the inner call's timed span and after the inner wrapper
returned. A sample is dropped where the inner call
compiled, was not the one just recorded (another thread's, or the journal
folded meanwhile), or did work of the hook's own off its timed span (a
pre-put of numpy arguments, a first call's feedback check). Each wrapper
object keeps its latest :data:`KEEP` samples; read out, per wrapper object,
as one :class:`~tpu_info.contract.model.SiteReading` of kind
``library_jit`` at the user's line that called it (found on the first
sample): ``seconds`` the median own time times the calls, ``timed`` the
samples that median stands on, ``via`` the library call (``flax nnx.jit``),
``detail`` the inner jitted function's name (``via`` ``flax
nnx.cached_partial`` where flax's ``cached_partial`` made the call: what
is left of the wrapper's work once the user cached it).

Not timed: equinox's ``filter_jit`` (its ``__call__`` blocks on a marker
output of the jitted call, so its wrapper time holds the device's).

Example:
    >>> from metrics.engines.jax.wrappers import WRAPPERS
    >>> WRAPPERS[0].module
    'flax.nnx.transforms.compilation'
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from metrics.engines import importwatch
from metrics.engines.jax.library_step import user_frame
from tpu_info.contract.model import NNX_CACHED_PARTIAL, NNX_JIT, SiteKind, SiteReading

if TYPE_CHECKING:
    from metrics.engines._patching import Patches
    from metrics.engines.jax.context import JaxContext

KEEP = 256  # samples kept per wrapper object (their median is its figure)
MAX_WRAPPED = 64  # wrapper objects read out, at most (the first ones called)
_STATE = "_tpu_info_wrapper"  # a wrapper object's state, in its __dict__


class Wrapper(NamedTuple):
    """A library's jit wrapper class: its module, class names, the attribute
    holding the inner jitted function, and the library call in words."""

    module: str
    classes: tuple[str, ...]
    inner: str
    via: str


# The library's own function that called the wrapper, by name: the user
# already caches the wrapper's work this way (the advice differs).
_CACHED_CALLERS = {"cache_args_wrapper": NNX_CACHED_PARTIAL}

WRAPPERS = (Wrapper("flax.nnx.transforms.compilation", ("JitWrapped", "SimpleJitWrapped"),
                    "jitted_fn", NNX_JIT),)


class _Calls:
    """One wrapper object's calls: counted, and its sampled own times (ns)."""

    __slots__ = ("owner", "next_timed", "via", "calls", "own", "inner", "at", "first", "last")

    def __init__(self, owner: Any, next_timed: Callable[[], bool], via: str) -> None:
        self.owner, self.next_timed, self.via = owner, next_timed, via
        self.calls = 0
        self.own: deque[int] = deque(maxlen=KEEP)
        self.inner: deque[int] = deque(maxlen=KEEP)
        self.at: tuple[Any, int] | tuple[()] | None = None  # the user's (code, offset)
        self.first = self.last = 0  # monotonic ns of the first and latest sample


class LibraryWrappers:
    """The wrapper classes' patches and their calls (one per engine)."""

    def __init__(self, context: JaxContext) -> None:
        self.context = context
        self.calls: list[_Calls] = []
        self._on = False
        # Where a wrapper object keeps its state for this engine (a later
        # engine's is its own: an object's state is never an earlier one's).
        self._key = f"{_STATE}_{id(self):x}"

    def install(self, patches: Patches) -> None:
        """Patches each wrapper class once its module is imported."""
        self._on = True
        for w in WRAPPERS:
            importwatch.when_imported(w.module, functools.partial(self._patch, patches, w))

    def uninstall(self) -> None:
        self._on = False  # (the patches are the engine's: restored with them)

    def forget(self) -> None:
        for c in list(self.calls):
            c.calls, c.first, c.last = 0, 0, 0
            c.own.clear()
            c.inner.clear()

    def _patch(self, patches: Patches, w: Wrapper) -> None:
        if not self._on:
            return
        module = sys.modules.get(w.module)
        for name in w.classes:
            cls = getattr(module, name, None)
            if isinstance(cls, type) and callable(cls.__dict__.get("__call__")):
                patches.apply(cls, "__call__", functools.partial(self._hook, w=w))

    def _state(self, obj: Any, w: Wrapper) -> _Calls | bool:
        """A wrapper object's state, made at its first call: False where its
        inner function is not one the ``jax.jit`` hook counts."""
        inner = getattr(obj, w.inner, None)
        owner = getattr(inner, "_tpu_info_owner", None)
        next_timed = getattr(inner, "_tpu_info_next_timed", None)
        st: _Calls | bool = False
        if owner is not None and next_timed is not None and len(self.calls) < MAX_WRAPPED:
            st = _Calls(owner, next_timed, w.via)
            owner.returned = 1  # its timed calls read the clock once more as they return
            self.calls.append(st)
        obj.__dict__[self._key] = st
        return st

    def _hook(self, original: Callable[..., Any], w: Wrapper) -> Callable[..., Any]:
        clock, context, key = time.monotonic_ns, self.context, self._key

        def __call__(self_: Any, *args: Any, **kwargs: Any) -> Any:
            try:  # the usual call: two lookups and a count
                st = self_.__dict__.get(key)
                if st is None:
                    st = self._state(self_, w)
                if st:
                    st.calls += 1
                    if st.next_timed() and context.active is not None:
                        return self._timed(st, original, self_, args, kwargs, clock)
            except Exception as e:  # noqa: BLE001 - a hook never raises into the program
                context.hook_failed("jax.wrappers", e)
            return original(self_, *args, **kwargs)

        __call__.__wrapped__ = original  # type: ignore[attr-defined]
        return __call__

    def _timed(self, st: _Calls, original: Callable[..., Any], obj: Any,
               args: tuple[Any, ...], kwargs: dict[str, Any],
               clock: Callable[[], int]) -> Any:
        """A call whose inner call is timed: timed whole, then paired."""
        owner = st.owner
        copies, checks = owner.copies_seen, owner.checks
        start = clock()
        out = original(obj, *args, **kwargs)
        end = clock()
        try:
            eng = self.context.active
            q = eng.calls_queue if eng is not None else ()
            # The inner call's record: (owner, key, start, end, compiled); its
            # wrapper's return (the hook's work after the call is no library's).
            back = owner.returned
            if (len(q) >= 5 and q[-5] is owner and q[-2] and q[-3] >= start
                    and start <= q[-2] <= back <= end
                    and q[-1] is None and not checks and owner.copies_seen == copies):
                inner = q[-2] - q[-3]
                st.own.append(q[-3] - start + end - back)
                st.inner.append(inner)
                if not st.first:
                    st.first = start
                st.last = end
                if st.at is None and eng is not None:  # once: the user's line
                    caller = sys._getframe(2)
                    st.at = user_frame(eng.implicit._frames, caller)
                    if (caller.f_code.co_name in _CACHED_CALLERS  # nnx.cached_partial's
                            and st.at and st.at[0] is not caller.f_code):  # (not the user's)
                        st.via = _CACHED_CALLERS[caller.f_code.co_name]
            if eng is not None and owner is self.context.step_owner:
                eng.host_lines.after_step(end, st.calls)  # host work to the next step
        except Exception as e:  # noqa: BLE001 - a hook never raises into the program
            self.context.hook_failed("jax.wrappers", e)
        return out

    def sites(self, mono_to_unix: float) -> list[SiteReading]:
        """One reading per wrapper object with samples (read time)."""
        from metrics.engines.jax.sites import where  # read time: sites imports numpy

        out = []
        for st in list(self.calls):
            own = list(st.own)
            if not own or not st.at:
                continue
            location, function = where(*st.at)
            median = statistics.median(own)
            out.append(SiteReading(
                kind=SiteKind.LIBRARY_JIT.value, location=location, count=st.calls,
                seconds=median * st.calls / 1e9, function=function,
                detail=getattr(st.owner, "name", ""), via=st.via,
                first_seen_unix=st.first / 1e9 + mono_to_unix,
                last_seen_unix=st.last / 1e9 + mono_to_unix,
                occurrences=st.calls, timed=len(own)))
        return out
