"""The object engines record into: registry, graph ledger, events, and the
guard that keeps hook failures away from the user's program.

Example:
    >>> rec = Recorder()
    >>> rec.mark_step()
    >>> rec.registry.counter_value("MarkStep")
    1
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from metrics.recording import events as ev
from metrics.recording import forksafe, interrupts
from metrics.recording.events import EventLog
from metrics.recording.graphs import GraphLedger
from metrics.recording.journal import FOLD_AT, Journal
from metrics.recording.registry import Counter, Distribution, Registry
from tpu_info.contract import catalog as names
from tpu_info.contract.model import EventKind, Unit

log = logging.getLogger("metrics")
_clock = time.monotonic_ns

F = TypeVar("F", bound=Callable[..., Any])


class Recorder:
    """Everything one hooked process records, with injectable clocks."""

    def __init__(
        self,
        registry: Registry | None = None,
        ledger: GraphLedger | None = None,
        events: EventLog | None = None,
    ) -> None:
        self.registry = registry or Registry()
        self.ledger = ledger or GraphLedger()
        self.events = events or EventLog()
        self.start_time_unix = time.time()
        self._warned: set[str] = set()
        self._warned_lock = threading.Lock()
        self._last_step_ns: int | None = None
        self.first_step_ns: int | None = None  # the first marked step's end (monotonic)
        # Marks folded so far, a plain int: a hot path's step index reads it
        # with the marks waiting (MarkStep's value parses a repr: ~0.4 us).
        self.steps_folded = 0
        # Hot-path handles, looked up once.
        self._mark_step = self.counter(names.MARK_STEP)
        self._step_time = self.distribution(names.STEP_TIME)
        self._step_time.keep_whole_run()  # the report's plot of the whole run
        self._hook_errors = self.counter(names.HOOK_ERRORS)
        # monotonic_ns -> unix seconds (journals keep raw clock readings): the
        # registry's, so an event and its sample carry one time.
        self.mono_to_unix = self.registry.mono_to_unix
        self._journals: list[Journal] = []
        self._on_reset: list[Callable[[], None]] = []  # engines' own tallies
        self._flushing = threading.local()
        self._steps = self.journal(self._fold_steps)
        self._steps_queue = self._steps.queue
        self.registry.before_read = self.flush
        self.ledger.before_read = self.flush
        self.events.before_read = self.flush
        forksafe.owned(self)

    def let_go_after_fork(self) -> None:
        """In a fork child: every lock of the recorder starts free (see
        :mod:`metrics.recording.forksafe`), so the child's records never wait on a
        thread of the parent that held one."""
        registry = self.registry
        forksafe.free_locks(self, registry, self.ledger, self.events, *self._journals,
                            *registry._counters.values(), *registry._distributions.values())

    def journal(self, fold: Callable[[list[Any]], None]) -> Journal:
        """A new hot-path journal folded by ``fold`` before every read."""
        j = Journal(self._guarded_fold(fold))
        self._journals.append(j)
        return j

    def _guarded_fold(self, fold: Callable[[list[Any]], None]) -> Callable[[list[Any]], None]:
        def run(batch: list[Any]) -> None:
            try:
                fold(batch)
            except Exception as e:  # noqa: BLE001 - folding runs inside the program
                self.hook_failed(getattr(fold, "__qualname__", "fold"), e)
        return run

    def flush(self) -> None:
        """Folds every journal in; readers call it (re-entrant calls are no-ops)."""
        flag = self._flushing
        if getattr(flag, "on", False):
            return
        flag.on = True
        try:
            for j in self._journals:
                j.flush()
        finally:
            flag.on = False

    def counter(self, name: str, unit: Unit | None = None, help: str | None = None) -> Counter:
        """The counter ``name``, created on first use with ``unit`` and
        ``help`` (the catalog's where not given)."""
        return self.registry.counter(name, names.unit_for(name) if unit is None else unit,
                                     names.help_for(name) if help is None else help)

    def distribution(self, name: str, unit: Unit | None = None,
                     help: str | None = None) -> Distribution:
        """The distribution ``name``, created on first use with ``unit`` and
        ``help`` (the catalog's where not given)."""
        return self.registry.distribution(name, names.unit_for(name) if unit is None else unit,
                                          names.help_for(name) if help is None else help)

    def reset(self) -> None:
        """Forgets everything recorded: counters, distributions, graphs,
        events and the step clock (hooks stay installed)."""
        for j in self._journals:
            j.clear()
        self.registry.clear_all()
        self.ledger.clear()
        self.events.clear()
        self._last_step_ns = self.first_step_ns = None
        self.steps_folded = 0
        for forget in self._on_reset:
            forget()

    def on_reset(self, forget: Callable[[], None]) -> None:
        """Runs ``forget`` at every :meth:`reset` (an engine's own tallies)."""
        self._on_reset.append(forget)

    # Steps -----------------------------------------------------------------

    def mark_step(self) -> None:
        """Counts one training step and the time since the previous one.

        One clock read and one append; counted at the next read or fold.
        """
        q = self._steps_queue
        q.append(_clock())
        if len(q) >= FOLD_AT:
            self._steps.flush()

    def steps_so_far(self) -> int:
        """Steps marked so far, folded or not (read, never changed; two plain
        reads: engines call it per recorded read to know the step)."""
        return self.steps_folded + len(self._steps_queue)

    @property
    def last_step_ns(self) -> int | None:
        """The latest marked step's end (monotonic ns; folded marks only)."""
        return self._last_step_ns

    def _fold_steps(self, times: list[int]) -> None:
        if not times:
            return
        last = self._last_step_ns
        if self.first_step_ns is None:
            self.first_step_ns = times[0]
        self._mark_step.inc(len(times))
        self.steps_folded += len(times)
        ends = times if last is not None else times[1:]
        starts = [last, *times[:-1]] if last is not None else times[:-1]
        self._step_time.observe_many([e - s for s, e in zip(starts, ends)], ends)
        self._last_step_ns = times[-1]
        self.events.emit_batch(len(times), functools.partial(_step_rows, times, self.mono_to_unix))

    # Failure containment ---------------------------------------------------

    def hook_failed(self, where: str, error: BaseException) -> None:
        """Counts a failure inside a hook; logs the first one per place.

        Raises ``error`` again when a signal handler raised it (it ran inside
        the hook: a preemption or timeout handler's own exception is the
        program's, :mod:`metrics.recording.interrupts`)."""
        if interrupts.from_signal_handler(error):
            raise error
        try:
            self._hook_errors.inc()
            with self._warned_lock:
                first = where not in self._warned
                self._warned.add(where)
            if first:  # where in the hook it failed, for a report: the innermost frame
                tb = error.__traceback__
                while tb is not None and tb.tb_next is not None:
                    tb = tb.tb_next
                at = (f" at {os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
                      if tb is not None else "")
                log.warning("tpu-info hook %s failed and was skipped: %r%s "
                            "(further failures there are only counted in HookErrors)",
                            where, error, at)
            self.events.emit(EventKind.HOOK_ERROR, name=where, detail=repr(error)[:200])
        except Exception:  # noqa: BLE001 - never let accounting itself raise
            pass

    def guard(self, where: str) -> Callable[[F], F]:
        """Decorator: exceptions inside the wrapped hook are counted, not raised
        (but for one a signal handler raised there: :meth:`hook_failed`)."""

        def wrap(fn: F) -> F:
            @functools.wraps(fn)
            def guarded(*args: Any, **kwargs: Any) -> Any:
                try:
                    return fn(*args, **kwargs)
                except Exception as e:  # noqa: BLE001
                    self.hook_failed(where, e)
                    return None

            return guarded  # type: ignore[return-value]

        return wrap


def _step_rows(times: list[int], offset: float, first: int) -> Iterable[Any]:
    """Event rows of a folded batch of steps (made when first read)."""
    return ev.rows_of(first, [t / 1e9 + offset for t in times], EventKind.STEP)
