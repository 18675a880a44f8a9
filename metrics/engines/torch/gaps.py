"""Periodic work between a torch program's optimizer steps, named and measured:
an evaluation (``model.eval()``, ``model.train(False)``, a ``no_grad`` block)
or a checkpoint (``torch.save``) every N steps.

The torch side of :mod:`metrics.engines.jax.gaps`, in the same model: a gap
is what the program did between two steps, led by the line that began the
work. The step here is the optimizer's (:mod:`~metrics.engines.torch.optim`);
the work is told by rare calls, patched at install
(:mod:`~metrics.engines.torch.gap_notes`), each noting ``(kind, the user's
line, its detail, now)`` with one append: the user's outermost
``model.eval()`` or ``model.train(False)`` (an evaluation begins; pytorch/
tutorials' trainingyt validates after ``model.train(False)``), the user's
entry into a ``torch.no_grad()`` or ``torch.inference_mode()`` block (an
evaluation with no ``model.eval()``: pytorch/examples' super_resolution),
``torch.save`` (a checkpoint); and by torch.compile's graphs compiled for
gradients off (an evaluation under ``no_grad``): their first call after a
step is noted at the user's call (:meth:`StepGaps.call_off_grad`; one bool
test on a training call). The work's ends are noted by their time alone (no
frame walk): the user's ``model.train()`` after another note (so a loop that
calls it every step and never evaluates adds nothing), a noted block's exit,
a ``torch.save``'s return. A ``no_grad`` block's line entered after two
steps in a row (a hand-written SGD update, an EMA) is no evaluation: it is
quiet from then on (:attr:`StepGaps.quiet`; its one gap before is dropped
when read). Nothing else runs per step on the hot path. At
:data:`FOLD_NOTES` notes waiting, the steps are folded (their gaps take the
notes) rather than the oldest dropped unfolded.

At fold time (the optimizer's steps folded, off the training thread) each
interval between two steps of the first optimizer that holds notes is a gap;
intervals without notes are the usual step. A gap costs its interval beyond
the usual step (the median of the last :data:`USUAL_KEPT` usual intervals,
taken when read) less the compile work inside it (an evaluation's first call
recompiles for ``no_grad``: that is a compile step, ``CompileStepTime``),
charged to the line that led it: the first ``model.eval()`` (or
``train(False)``), else the first call with gradients off, else the first
``no_grad`` block, else the first ``torch.save``. A gap whose last note is
an end is that work alone: its span from its first note to that end, less
compiles, no usual step taken out (pytorch/examples' gcn evaluates twice
after every step: no interval is a usual step), and the rest of its interval
is a usual step; a gap led by ``torch.save`` is the saves' own spans, each
to its return (2-10 ms in super_resolution, never the work before it). The
other lines are ``within`` it, and so are the tensor reads (``loss.item()``)
whose first and last fell in its gaps (:meth:`StepGaps.lead_around`). The
first step's interval is no usual step (its compiles) and work before the
first step is set-up.

The work after the last step (makemore evaluates and saves after its final
step, then leaves the loop) has no next step to close its gap: while the
program runs it is left open (it may still be going on, or be tear-down
that another step never follows), and when the program has ended (its
main thread done: the saved run, ``tpu-info run --summary``) it is closed
at its last note (:meth:`StepGaps.close_open`): its time is then its span
to that note where it is an end (a ``torch.save``'s return), else from the
last step to that call's start, less the usual step, a lower bound of the
work. An evaluation whose only note is its ``model.eval()`` at its start
adds an occurrence and (nearly) nothing to the time.

The steps are the first optimizer's; while no optimizer has stepped, the
``backward()`` calls' (a program that updates its weights by hand), until an
optimizer's first step takes them over (:meth:`StepGaps.restart`).

Example:
    >>> gaps = StepGaps()
    >>> gaps.notes.append(Note(EVAL, "/w/train.py:57", "", "GPT.eval()", 3_500))
    >>> gaps.intervals([1_000, 2_000, 3_000, 5_000, 6_000], 1)  # the gap: 3_000 to 5_000
    >>> [(x.work, x.location, x.gaps, x.gap_seconds) for x in gaps.sites(None)]
    [('evaluation', '/w/train.py:57', 1, 1e-06)]
"""

from __future__ import annotations

import operator
import statistics
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from metrics.engines.rare_work import RARE_FACTOR, RARE_MIN_NS, RareWork
from metrics.engines.torch.gap_notes import (
    CALL,
    CHECKPOINT,
    ENDS,
    EVAL,
    GRAD_ON,
    NOGRAD,
    SAVED,
    TRAIN,
    Note,
    install_notes,
)
from tpu_info.contract.diagnosis import PeriodicWork
from tpu_info.contract.model import SiteReading, StepsReading
from tpu_info.contract.phases import phase_of

if TYPE_CHECKING:
    from metrics.engines._patching import Patches
    from metrics.engines.compile_steps import CompileTimeline
    from metrics.engines.torch.context import TorchContext

__all__ = ["CHECKPOINT", "EVAL", "GRAD_ON", "NOGRAD", "SAVED", "TRAIN", "Note", "StepGaps"]

_WORK = {EVAL: PeriodicWork.EVALUATION.value, CALL: PeriodicWork.EVALUATION.value,
         NOGRAD: PeriodicWork.EVALUATION.value, CHECKPOINT: PeriodicWork.CHECKPOINT.value}
_LEAD_ORDER = (EVAL, CALL, NOGRAD, CHECKPOINT)
MAX_NOTES = 4096  # notes waiting for a step to close their gap (the oldest go first)
FOLD_NOTES = 2048  # notes waiting when the steps are folded (so that none goes unfolded)
MAX_SPANS = 1024  # the latest gaps' bounds kept, to place reads in them
MAX_SITES = 256  # lines kept apart (and no_grad lines followed)
USUAL_KEPT = 256  # usual intervals the median is taken over
RECENT_LED = 16  # a lead's latest gaps kept, for a rare line found later


class _Site:
    """One line that led gaps or sat in them."""

    __slots__ = ("kind", "location", "via", "detail", "count", "gaps", "gap_ns", "spanned",
                 "span_ns", "first_step", "last_step", "first_ns", "last_ns", "within", "rare",
                 "led")

    def __init__(self, kind: str, location: str, via: str, detail: str) -> None:
        self.kind, self.location, self.via, self.detail = kind, location, via, detail
        self.count = 0  # notes at the line
        self.gaps = 0  # gaps it led
        self.gap_ns = 0  # their intervals less their compiles (the usual step still in)
        self.spanned = 0  # of those gaps, the ones ended by the user's model.train()
        self.span_ns = 0  # their time from their first note to it, less compiles
        self.first_step = self.last_step = 0  # the steps those gaps came after
        self.first_ns = self.last_ns = 0
        self.within = ""  # the line whose gaps it sat in (its time is that line's)
        self.rare = RareWork()  # as a lead: its usual own time, the lines its gaps held
        # Its latest gaps as lead: [own ns, spanned, the lines held, step] (a
        # rare line found later takes its part of the earlier ones too).
        self.led: deque[list[Any]] = deque(maxlen=RECENT_LED)


class StepGaps:
    """The gaps between one optimizer's steps, and what ran in them."""

    def __init__(self) -> None:
        self.notes: deque[Note] = deque(maxlen=MAX_NOTES)
        self.usual: deque[int] = deque(maxlen=USUAL_KEPT)
        self.by_line: dict[tuple[str, str], _Site] = {}
        # The engine's compile spans: a gap's compiles are compile steps, not the gap's.
        self.timeline: CompileTimeline | None = None
        self.to_unix = 0.0  # monotonic seconds -> unix
        self.noted_at = 0  # the step after which a call with gradients off was last noted
        self.spans: deque[tuple[int, int, str]] = deque(maxlen=MAX_SPANS)  # (a, b, lead)
        self.closed_after: int | None = None  # the last step whose open gap was closed
        self.last_mark = 0  # the latest step's end folded (monotonic ns)
        # Folds the steps (set by their owner): notes past FOLD_NOTES are folded, not dropped.
        self.flush: Callable[[], None] | None = None
        # The no_grad blocks' lines: the step after which each was last
        # entered; those entered after two steps in a row (a hand-written SGD
        # update, an EMA) are no evaluation: quiet (no longer noted).
        self.block_after: dict[str, int] = {}
        self.quiet: set[str] = set()

    # Hooks (in the program: one append each) -------------------------------

    def install(self, patches: Patches, ctx: TorchContext) -> None:
        """Patches the calls noted (:mod:`~metrics.engines.torch.gap_notes`;
        restored with ``patches``)."""
        install_notes(self, patches, ctx)

    def call_off_grad(self, steps: int, where: Callable[[], str | None], detail: str,
                      ns: int) -> None:
        """A compiled graph ran with gradients off after ``steps`` steps (an
        evaluation's forward): noted at ``where()`` (the user's call, found
        only here) once per interval between steps; none before the first."""
        if steps == self.noted_at:
            return
        self.noted_at = steps
        location = where()
        if location is not None:
            self.notes.append(Note(CALL, location, "", detail, ns))
            self.noted()

    def noted(self) -> None:
        """After a note's append: at :data:`FOLD_NOTES` waiting, the steps are
        folded (their gaps take the notes), so a long run between two reads
        (work after every step: three notes a step) drops none unfolded."""
        if len(self.notes) == FOLD_NOTES and self.flush is not None:
            self.flush()

    # Fold (off the training thread) ----------------------------------------

    def intervals(self, marks: list[int], first_step: int) -> None:
        """The optimizer's step ends ``marks`` (monotonic ns, ascending; the
        first is step ``first_step``'s): each interval with notes in it is a
        gap, the others usual steps."""
        notes = self.notes
        self.last_mark = marks[-1]
        if not notes:  # the usual fold: steps only (it may run on the training thread)
            first = 2 if first_step == 1 else 1  # the first step's interval is no usual step
            self.usual.extend(map(operator.sub, marks[first:], marks[first - 1:-1]))
            return
        for k, (a, b) in enumerate(zip(marks, marks[1:]), start=first_step):
            got = []
            while notes and notes[0].ns <= b:
                n = notes.popleft()
                if n.ns > a:  # before the step that opens it: set-up, or a stale note
                    got.append(n)
            if got:
                got = self._quieted(got, k)
            # (an end alone is no work: a model.train() after a gap's last note)
            if any(n.kind not in ENDS for n in got):
                span = self._gap(a, b, k, got)
                if span and k > 1:  # beside work measured to its model.train(): the rest
                    self.usual.append(b - a - span)
            elif k > 1:  # the first step's interval holds its compiles: no usual step
                self.usual.append(b - a)

    def close_open(self, a: int, step: int) -> None:
        """The program ended after its last step (step ``step``, ended at
        ``a``): the notes after it are the work its last gap held, closed at
        the last of them (once per last step)."""
        if self.closed_after == a:
            return
        got = [n for n in list(self.notes) if n.ns > a]  # (copied in one C call)
        self.notes.clear()
        got = [n for n in got if n.kind not in (NOGRAD, GRAD_ON) or n.location not in self.quiet]
        if any(n.kind not in ENDS for n in got):
            self.closed_after = a
            self._gap(a, got[-1].ns, step, got)
            # The program has ended: what ran after its last noted call (the
            # evaluation's loader and reads past its second model.eval(), as
            # PyG's gin after its last step) was that work too.
            if self.spans and self.spans[-1][0] == a:
                self.spans.append((a, 1 << 62, self.spans[-1][2]))

    def restart(self) -> None:
        """Another count of steps takes the gaps over (an optimizer's first
        step after backward()'s): what was measured on the old one goes, the
        notes not yet in a gap stay."""
        notes, quiet = list(self.notes), set(self.quiet)
        self.clear()
        self.notes.extend(notes)
        self.quiet.update(quiet)

    def _quieted(self, got: list[Note], k: int) -> list[Note]:
        """``got`` (the notes after step ``k``) less the no_grad blocks of
        lines entered after step ``k - 1`` too: work between every two steps
        (a hand-written update under ``no_grad``, an EMA), no evaluation."""
        after, quiet = self.block_after, self.quiet
        for n in got:
            if n.kind == NOGRAD:
                if after.get(n.location) == k - 1:
                    quiet.add(n.location)
                if n.location in after or len(after) < MAX_SITES:
                    after[n.location] = k
        if not quiet:
            return got
        return [n for n in got if n.kind not in (NOGRAD, GRAD_ON) or n.location not in quiet]

    def _gap(self, a: int, b: int, step: int, got: list[Note]) -> int:
        """The gap ``(a, b]`` after step ``step`` held ``got``: its time goes to
        its lead. Led by a ``torch.save``, it is the saves' own spans, each
        to its return; else, ended by the work's end (the user's
        model.train(), a no_grad block's exit, a save's return: nothing
        after it), that work: from its first note to that end, less compiles
        (measured with no usual step, which a loop that works after every
        step has none of). Returns that span (0: the whole interval's, the
        usual step to be taken out when read)."""
        work = [n for n in got if n.kind not in ENDS]
        lead_note = next(n for kind in _LEAD_ORDER for n in work if n.kind == kind)
        lead = self._site(lead_note)
        if lead is None:
            return 0
        lead.gaps += 1
        if lead_note.kind == CHECKPOINT:  # (nothing else in it: no other lead)
            span = sum(e.ns - n.ns for n, e in zip(got, got[1:])
                       if n.kind == CHECKPOINT and e.kind == SAVED)
            first, last = lead_note.ns, lead_note.ns + span  # (no compile in a save)
        else:
            span = got[-1].ns - work[0].ns if got[-1].kind in ENDS else 0
            first, last = work[0].ns, got[-1].ns
        usual: float | None = None
        if span > 0:
            timeline = self.timeline
            inside = (timeline.within(first, last)
                      if timeline is not None and lead_note.kind != CHECKPOINT else 0)
            own = max(0, span - inside)
        else:
            span = 0
            compile_ns = self.timeline.within(a, b) if self.timeline is not None else 0
            own = max(0, (b - a) - compile_ns)
            usual = self.usual_ns()
        # Work of a longer period in the lead's gap (a generation every 50
        # steps after the validation every 10): split off (rare_work.py).
        rare = (lead.rare.part(own if usual is None else max(0, own - int(usual)),
                               _lines(work), (lead.kind, lead.location), lead.gaps - 1)
                if span or usual is not None else None)
        other = rare and self._site(next(n for n in work if (n.kind, n.location) == rare[0]))
        if rare and other is not None and other is not lead:
            self._earlier(lead, other, rare[0], own - rare[1])
            other.gaps, other.spanned = other.gaps + 1, other.spanned + 1
            other.span_ns += rare[1]
            other.first_step, other.last_step, other.within = other.first_step or step, step, ""
            own -= rare[1]
        if span > 0:
            lead.spanned += 1
            lead.span_ns += own
        else:
            lead.gap_ns += own
        lead.led.append([own, span > 0, frozenset(_lines(work)), step])
        lead.first_step = lead.first_step or step
        lead.last_step = step
        self.spans.append((a, b, lead.location))
        for n in work:
            site = self._site(n)
            if site is None:
                continue
            site.count += 1
            site.first_ns = site.first_ns or n.ns
            site.last_ns = n.ns
            if site is not lead and not site.gaps:
                site.within = lead.location
        return span

    @staticmethod
    def _earlier(lead: _Site, other: _Site, key: tuple[str, str], usual: int) -> None:
        """``other`` (line ``key``) just split off ``lead``'s gap, whose usual own
        time is ``usual`` ns: its part of the lead's earlier gaps that held it
        (nGPT's first generation, after step 1, before the lead's usual was
        known) moves to it too."""
        for gap in lead.led:
            own, spanned, keys, step = gap
            if key not in keys or own <= RARE_FACTOR * usual + RARE_MIN_NS:
                continue
            part = own - usual
            gap[0] = usual
            if spanned:
                lead.span_ns -= part
            else:
                lead.gap_ns -= part
            other.gaps, other.spanned, other.span_ns = other.gaps + 1, other.spanned + 1, (
                other.span_ns + part)
            other.first_step = min(other.first_step or step, step)

    def _site(self, n: Note) -> _Site | None:
        key = (n.kind, n.location)
        site = self.by_line.get(key)
        if site is None and len(self.by_line) < MAX_SITES:
            site = self.by_line[key] = _Site(n.kind, n.location, n.via, n.detail)
        return site

    # Read ------------------------------------------------------------------

    def usual_ns(self) -> float | None:
        """The usual step: the median interval between steps without work
        in between; None before one was seen."""
        usual = list(self.usual)
        return statistics.median(usual) if usual else None

    def lead_around(self, first_unix: float, last_unix: float) -> str:
        """The line that led the gaps a line's first and last record both
        fell in (its reads were the evaluation's: their cost is that
        finding's), else "". A last record after the latest step, in the
        work after it that no step has closed yet (gcn evaluates after its
        last step too), falls in that work's gap, led by its notes' lead."""
        def lead(t: float) -> str | None:
            ns = (t - self.to_unix) * 1e9
            return next((x for a, b, x in self.spans if a < ns <= b), None)

        spans_lead = lead(first_unix) if self.spans else None
        if spans_lead is None:
            return ""
        last = lead(last_unix)
        if last is None:
            last = self._open_lead((last_unix - self.to_unix) * 1e9)
        return spans_lead if last == spans_lead else ""

    def _open_lead(self, ns: float) -> str | None:
        """The line leading the notes after the latest step up to ``ns`` (the
        open gap's lead at that time), None where ``ns`` is before that step
        or no work was noted after it by then."""
        if ns <= self.last_mark:
            return None
        work = [n for n in list(self.notes)
                if self.last_mark < n.ns <= ns and n.kind not in ENDS]
        return next((n.location for kind in _LEAD_ORDER for n in work if n.kind == kind), None)

    def sites(self, steps: StepsReading | None) -> list[SiteReading]:
        """The lines that led gaps (``work``, ``gaps``, ``gap_seconds``: their
        time beyond the usual step) or sat in them (``within``)."""
        usual = self.usual_ns()
        out = []
        quiet = self.quiet
        for site in list(self.by_line.values()):
            if not site.count or (site.kind == NOGRAD and site.location in quiet):
                continue  # (a block entered between every two steps: before it was told)
            first, last = site.first_ns / 1e9 + self.to_unix, site.last_ns / 1e9 + self.to_unix
            fields: dict[str, Any] = {}
            if site.gaps and (usual is not None or site.spanned == site.gaps):
                # Gaps timed over their interval, beyond the usual step; those
                # ended by model.train(), their own span.
                beyond = max(0.0, site.gap_ns - (site.gaps - site.spanned) * (usual or 0.0))
                fields = {"work": _WORK[site.kind], "gaps": site.gaps,
                          "gap_seconds": (beyond + site.span_ns) / 1e9}
            elif site.within:
                fields = {"within": site.within}
            occurrences = site.gaps or site.count
            out.append(SiteReading(
                site.kind, site.location, site.count, detail=site.detail, via=site.via,
                first_seen_unix=first, last_seen_unix=last,
                phase=phase_of(first, last, occurrences, steps).value,
                occurrences=occurrences,
                steps_spanned=site.last_step - site.first_step if site.gaps else 0, **fields))
        return out

    def clear(self) -> None:
        self.noted_at = 0
        self.closed_after = None
        self.last_mark = 0
        self.spans.clear()
        self.notes.clear()
        self.usual.clear()
        self.by_line.clear()
        self.block_after.clear()
        self.quiet.clear()  # (in place: the hooks hold it)


def _lines(work: list[Note]) -> dict[tuple[str, str], int]:
    """A gap's notes per line (kind, location): what its lead's gaps held."""
    out: dict[tuple[str, str], int] = {}
    for n in work:
        out[(n.kind, n.location)] = out.get((n.kind, n.location), 0) + 1
    return out
