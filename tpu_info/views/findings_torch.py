"""Findings of the torch engines: graph breaks, torch_xla value reads, CPU fallbacks.

Pure functions of a :class:`~tpu_info.contract.model.Snapshot`, each yielding
:class:`~tpu_info.contract.model.Finding` s, listed in :data:`tpu_info.views.findings.RULES`:
:func:`graph_breaks` (torch.compile: where Dynamo split a function, and the
breaks it cannot resume from, with their share of step time),
:func:`xla_value_access` (torch_xla compiled an extra graph because a tensor's
value was read before ``torch_xla.sync()``), :func:`xla_eager_mode` (torch_xla's
eager mode, op by op), :func:`xla_closure_reads` (the same words from
torch_xla for a read in a step closure, after the sync: no problem) and
:func:`cpu_fallbacks`
(torch_xla's ``aten::`` counters).

Example:
    >>> from tpu_info.contract.model import CounterReading, Snapshot
    >>> s = Snapshot(0.0, counters=(CounterReading("aten::nonzero", 3),))
    >>> [f.kind for f in cpu_fallbacks(s)]
    ['cpu_fallback']
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable

from tpu_info.contract.catalog import (
    EAGER_FALLBACK_TIME,
    EXECUTE_TIME,
    GRAPH_BREAKS,
    TRANSFER_FROM_DEVICE_TIME,
)
from tpu_info.contract.cause_kinds import CauseKind
from tpu_info.contract.diagnosis import PeriodicWork
from tpu_info.contract.model import (
    UNRESUMABLE,
    UNRESUMABLE_REST,
    EventKind,
    Finding,
    GraphRecord,
    RecompileCause,
    Severity,
    SiteKind,
    SiteReading,
    Snapshot,
)
from tpu_info.views.causes import typed
from tpu_info.views.cost import (
    Cost,
    cost_of,
    duration,
    share_words,
    short_location,
    size_words,
    steps_of,
)

# Dynamo's words for a break it cannot resume from, in the details of hooks
# from before the markers (UNRESUMABLE): this version's hook never needs them.
_OLD_UNRESUMABLE = ("cannot resume", "unresumable", "can't resume", "can’t resume")
_HINT_RE = re.compile(r"\bHint:\s*(?P<hint>[^\n]+)")


def _unresumable(s: Snapshot, name: str, where: str, loc: str | None,
                 detail: str) -> Finding:
    """A break Dynamo cannot resume from: the rest of the frame runs eagerly.
    The share outside compiled graphs is step time minus the compiled graphs'
    execute time (estimated); Dynamo's own hint is kept."""
    hints = [m.group("hint").strip() for m in _HINT_RE.finditer(detail)]
    reason = _HINT_RE.sub("", detail).strip().rstrip(".") or "no reason recorded"
    st, ex = steps_of(s), s.distribution(EXECUTE_TIME)
    outside = None
    if st is not None and st.seconds_total and ex is not None and ex.count:
        outside = max(0.0, st.seconds_total - ex.total / 1e9)
    if outside is None:
        why = ("no timed steps" if st is None or not st.seconds_total
               else "the compiled graphs' time is not recorded")
        cost_words, fields = f"its share of step time is not known ({why})", {}
    else:
        c = cost_of(s, outside, None, "estimated as step time minus compiled-graph time")
        cost_words = (f"{share_words(c.share_of_step)} of step time runs outside "
                      f"compiled graphs ({c.words()})" if c.share_of_step is not None else
                      f"its time outside compiled graphs: {c.words()}")
        fields = c.fields()
    hint = f" Dynamo's hint: {' '.join(hints)}" if hints else ""
    return Finding(
        f"graph break in {name}{where} that Dynamo cannot resume from: {reason}. The rest "
        f"of the function runs eagerly in Python, uncompiled; {cost_words}.{hint} Move the "
        "unsupported call out of the compiled function (or rewrite it with traceable ops).",
        "warning", loc, kind="graph_break_unresumable", **fields)


# Dynamo's words for a function it skips on purpose (Optimizer.zero_grad,
# torch.autograd.backward): pytorch/tutorials' torch_compile_full_example
# compiles a train step holding both; removing the zero_grad break saved
# nothing (0.782 vs 0.793 s a call), and "rewrite that line" was no advice.
_SKIPPED_RE = re.compile(r"marked as skipped.*?the function (`[^`]+`)"
                         r"|Unsupported (`?Tensor\.backward\(\)`?) call")
# A break the user put there: pytorch/tutorials' compiled_autograd_tutorial
# calls torch._dynamo.graph_break() twice to show the graphs it splits.
_USER_BREAK_RE = re.compile(r"User-inserted graph break|torch\._dynamo\.graph_break\(\)")


def graph_breaks(s: Snapshot) -> Iterable[Finding]:
    """torch.compile graph breaks, one finding per break site seen in the events."""
    n = s.counter(GRAPH_BREAKS)
    if not n:
        return
    sites: dict[str | None, tuple[str, str]] = {}
    inside: dict[str | None, str] = {}  # the break itself in torch's own code (event's via)
    for e in s.events:
        if e.kind == EventKind.GRAPH_BREAK:
            held = sites.get(e.location)
            # One line, several frames (a function and the module it calls):
            # the frame Dynamo cannot resume names that line.
            if held is None or not _marked(held[1]):
                sites[e.location] = (e.name, e.detail)
            if e.via:
                inside[e.location] = e.via
    for loc, (name, detail) in sites.items():
        where = f" at {short_location(loc)}" if loc else ""
        if _marked(detail):  # the torch hook measured the eager time
            yield _unresumable_break(s, name, where, loc, detail)
            continue
        if any(w in detail.lower() for w in _OLD_UNRESUMABLE):
            yield _unresumable(s, name, where, loc, detail)
            continue
        crossings = [x for x in s.sites if x.kind == SiteKind.GRAPH_BREAK.value
                     and x.location == loc and x.count]
        gap = next((x for x in crossings if x.work != PeriodicWork.EVALUATION), None)
        evals = [x for x in crossings if x.work == PeriodicWork.EVALUATION]
        calls = sum(g.executions or 0 for g in s.graphs if g.name == name)
        if gap is not None or evals:  # the torch hook timed the Python between the two graphs
            c, crossed = _crossings(s, gap, evals)
        else:
            c = cost_of(s, 0.0, calls or None)
            crossed = (f" It is crossed on every call ({calls:,} times, {c.per_step:.1f} per "
                       "step; the graph ends, that line runs in Python, the next graph "
                       "starts; the time in between is not measured)."
                       if calls and c.per_step is not None else "")
        skipped = _SKIPPED_RE.search(detail)
        if _USER_BREAK_RE.search(detail) and loc not in inside:  # (torch's own: below)
            yield Finding(
                f"graph break in {name}{where}: {detail.rstrip('.')}. Dynamo splits the "
                f"function there into separate graphs with Python in between.{crossed} It is "
                "the break your code asks for (torch._dynamo.graph_break()); if its crossings "
                "cost, remove that call.",
                "warning" if (c.share_of_step or 0.0) >= 0.05 else "info", loc,
                kind="graph_break", **c.fields())
            continue
        if skipped is not None or loc in inside:  # made on purpose: no user's line to rewrite
            at = (f", inside torch's own code at {short_location(inside[loc])}" if loc in inside
                  else "")
            skips = (skipped.group(1) or skipped.group(2)) if skipped is not None else ""
            why = ("torch breaks there on purpose: nothing at your line to rewrite; if its "
                   "crossings cost, compile the part around it instead." if at else
                   f"Dynamo does not trace {skips} on purpose, so that line cannot be "
                   "rewritten to be traced; if its crossings cost, call it outside the compiled "
                   "function (compile the model or the forward and loss, not the whole step).")
            yield Finding(
                f"graph break in {name}{where}{at}: {detail.rstrip('.')}. Dynamo splits the "
                f"function there into separate graphs with Python in between.{crossed} {why}",
                "warning" if (c.share_of_step or 0.0) >= 0.05 else "info", loc,
                kind="graph_break", **c.fields())
            continue
        yield Finding(
            f"graph break in {name}{where}: {detail.rstrip('.')}. Dynamo splits the function there "
            f"into separate graphs with Python in between.{crossed} Rewrite that line so it "
            "can be traced (torch._dynamo.explain(fn)(*args) lists every break).",
            "warning", loc, kind="graph_break", **c.fields())
    if not sites:
        yield Finding(f"{n} torch.compile graph breaks (their reasons are no longer in the "
                      "recent events): run torch._dynamo.explain(fn)(*args) to list them.",
                      "warning", None, 0.0, "graph_break")


def _crossings(s: Snapshot, gap: SiteReading | None,
               evals: list[SiteReading]) -> tuple[Cost, str]:
    """The cost and words of a break's measured crossings: the steps' (per
    step, share of step time) and the evaluation's (gradients off, in all,
    never per step) apart. A step figure more than the steady steps took is
    not capped: it is said not to fit, with no per-step figure."""
    words = []
    c = cost_of(s, 0.0, None)
    if gap is not None:
        c, steps = cost_of(s, gap.seconds, gap.count), steps_of(s)
        steady = steps.steady_seconds_total if steps is not None else None
        each = duration(gap.seconds / gap.count)
        if steps is not None and steady and gap.seconds > steady:
            c = cost_of(s, 0.0, gap.count, "not timed: its crossings measured "
                        f"{duration(gap.seconds)}, more than the {steps.count:,} steps took "
                        f"({duration(steady)}), so not all of them are in the steps")
        words.append(f" Each crossing runs Python between the two graphs for {each} "
                     f"({c.words()}).")
    if evals:
        n, seconds = sum(x.count for x in evals), sum(x.seconds for x in evals)
        words.append(f" Evaluation (calls with gradients off) crossed it {n:,} times, "
                     f"{duration(seconds / n)} each, {duration(seconds)} in all, measured; "
                     "not part of the steps' figure.")
    return c, "".join(words)


def value_access(c: RecompileCause) -> bool:
    """torch_xla compiled the graph because a tensor's value was read before the sync."""
    return typed(c).kind == CauseKind.XLA_VALUE_ACCESS


def _xla_graphs(s: Snapshot, cause: Callable[[RecompileCause], bool]) -> list[GraphRecord]:
    """torch_xla's graphs with a cause ``cause`` accepts."""
    return [g for g in s.graphs if g.engine == "torch_xla" and any(map(cause, g.causes))]


def _value_access_graphs(s: Snapshot) -> list[GraphRecord]:
    return _xla_graphs(s, value_access)


def closure_read(c: RecompileCause) -> bool:
    """torch_xla compiled the graph of a value read in a step closure (after the sync)."""
    return typed(c).kind == CauseKind.XLA_CLOSURE_READ


def _closure_graphs(s: Snapshot) -> list[GraphRecord]:
    return _xla_graphs(s, closure_read)


def _steps_count(s: Snapshot) -> int:
    """The program's steps as the views count them (:func:`steps_of`: not
    torch_xla's syncs where the hook knows the steps), 0 when unknown."""
    steps = steps_of(s)
    return steps.count if steps is not None else 0


# torch_xla's metrics in eager mode (torch_xla.experimental.eager_mode(True)).
EAGER_OP_EXECUTE_TIME, EAGER_OP_COMPILE_TIME = "EagerOpExecuteTime", "EagerOpCompileTime"
EAGER_OPS_MANY = 20  # eager ops a step from which it is a warning: a step's worth of ops


def _steps_apart(per_step: float) -> str:
    """Steps between reads at ``per_step`` reads a step: ``1.3``, ``12``."""
    apart = 1 / max(per_step, 1e-9)
    return f"{apart:.1f}".rstrip("0").rstrip(".") if apart < 10 else f"{apart:.0f}"


def xla_eager_mode(s: Snapshot) -> Iterable[Finding]:
    """torch_xla's eager mode: every op runs as its own small graph. Where
    the step itself runs that way (many ops a step) it is a warning with
    torch_xla's own advice (compile the step); a few ops a step (data made
    eagerly around a compiled step) are information."""
    ran = s.distribution(EAGER_OP_EXECUTE_TIME)
    if ran is None or not ran.count:
        return
    built = s.distribution(EAGER_OP_COMPILE_TIME)
    steps = steps_of(s)
    per_step = ran.count / steps.count if steps is not None and steps.count else None
    often = f", {per_step:,.0f} a step" if per_step is not None else ", steps are not known"
    compiled = (f"; {built.count:,} op graphs compiled ({duration(built.total / 1e9)})"
                if built is not None and built.count else "")
    many = per_step is not None and per_step >= EAGER_OPS_MANY
    advice = (" The step runs op by op: compile it, torch_xla.compile(step_fn), so its ops are "
              "one graph (eager mode can stay on around it, as in pytorch/xla's "
              "examples/eager/train_decoder_only_eager_with_compile.py). What that saves is "
              "not measured here." if many else
              " A few ops a step around a compiled step (data made on the device): nothing "
              "to change.")
    yield Finding(
        f"torch_xla eager mode: {ran.count:,} ops ran one at a time, each as its own small "
        f"graph{often}{compiled}.{advice}",
        Severity.WARNING if many else Severity.INFO, None, kind="xla_eager_mode",
        count=ran.count, per_step=per_step)


def xla_closure_reads(s: Snapshot) -> Iterable[Finding]:
    """A tensor's value read in a step closure (``xm.add_step_closure``, run
    after the sync): torch_xla names it a read before the sync, but it cuts no
    step's graph; the read's own small graph compiles once. Information:
    what the reads cost, and that there is nothing to change."""
    by_site: dict[str | None, list[GraphRecord]] = defaultdict(list)
    for g in _closure_graphs(s):
        by_site[next((c.location for c in g.causes if closure_read(c)), None)].append(g)
    steps = _steps_count(s)
    d2h = s.distribution(TRANSFER_FROM_DEVICE_TIME)
    alone = not _value_access_graphs(s) and len(by_site) == 1
    for site, graphs in by_site.items():
        compiles = sum(g.compiles for g in graphs)
        compiled = sum(g.compile_seconds_total for g in graphs)
        where = f" at {short_location(site)}" if site else ""
        reads = ""
        if alone and d2h is not None and d2h.count:
            per = f" in {steps:,} steps" if steps else ""
            reads = (f"; the program's device->host reads: {d2h.count:,}{per}, "
                     f"{duration(d2h.total / 1e9)} waiting, measured")
        yield Finding(
            f"value read in a step closure{where}: xm.add_step_closure runs it after "
            "torch_xla.sync(), so it cuts no step's graph (torch_xla's analysis still says "
            "\"before torch_xla.sync\"); torch_xla compiled the read's own small graph "
            f"{compiles} time{'s' * (compiles != 1)} ({duration(compiled)}){reads}. Nothing "
            "to change: this is how torch_xla asks for values to be read.",
            "info", site, kind="value_read_in_step_closure", count=compiles)


def xla_value_access(s: Snapshot) -> Iterable[Finding]:
    """torch_xla compiled a graph because the program read a tensor's value
    (``.item()``, ``print``, ``if t:``) before ``torch_xla.sync()``: each step
    then runs the graph up to that line on its own and waits for the result."""
    by_site: dict[str | None, list[GraphRecord]] = defaultdict(list)
    for g in _value_access_graphs(s):
        site = next((c.location for c in g.causes if value_access(c)), None)
        by_site[site].append(g)
    steps = _steps_count(s)
    d2h = s.distribution(TRANSFER_FROM_DEVICE_TIME)
    for site, graphs in by_site.items():
        compiles = sum(g.compiles for g in graphs)
        compiled = sum(g.compile_seconds_total for g in graphs)
        waited = d2h.total / 1e9 if d2h is not None and len(by_site) == 1 else 0.0
        where = f" at {short_location(site)}" if site else ""
        reads = (f"; {d2h.count} device->host reads in {steps} steps "
                 f"({d2h.count / steps:.1f} per step, {duration(waited)} waiting, measured)"
                 if d2h is not None and steps and waited else "")
        yield Finding(
            f"value access before sync{where}: the program reads a tensor's value there "
            "before torch_xla.sync() (torch_xla: \"most likely user code trying to access "
            "tensor value before torch_xla.sync\"), so each step cuts its graph at that line, "
            f"runs the part so far and waits for it ({compiles} extra graph"
            f"{'s' * (compiles > 1)} compiled, {duration(compiled)}{reads}). Move the .item() "
            "/ print after torch_xla.sync(), or read the value every N steps.",
            "warning", site, kind="value_access_before_sync",
            **cost_of(s, compiled + waited, d2h.count if d2h is not None else None).fields())


def _marked(detail: str) -> bool:
    """The hook marked the break unresumable: Dynamo gave up on the whole
    function (UNRESUMABLE), or compiled it up to the break and runs the rest
    eagerly (UNRESUMABLE_REST)."""
    return UNRESUMABLE in detail or UNRESUMABLE_REST in detail


def _unresumable_break(s: Snapshot, name: str, where: str, loc: str | None,
                       detail: str) -> Finding:
    """A graph break Dynamo cannot resume from: the whole function, or the
    rest of it after the break, runs eagerly. Its cost: that eager time of
    the calls (measured by the hook: ``EagerFallbackTime``)."""
    rest = UNRESUMABLE_REST in detail
    reason, _, hints = detail.partition(UNRESUMABLE_REST if rest else UNRESUMABLE)
    hint = " ".join(h.strip() for h in hints.split("Hint:") if h.strip())
    wall = s.distribution(EAGER_FALLBACK_TIME)
    cost, measured = 0.0, ""
    if wall is not None and wall.count and wall.total > 0:
        # Dynamo runs the whole function eagerly: all of its calls' time is outside graphs.
        cost = wall.total / 1e9
        c = cost_of(s, cost, wall.count)
        share = (f"{share_words(c.share_of_step)} of step time"
                 if c.share_of_step is not None else "all of its calls' time")
        measured = (f": {share} is spent outside compiled graphs ({duration(cost)} in "
                    f"{wall.count} calls, {c.tail()})")
    advice = f" Dynamo's hint: {hint.rstrip('.')}." if hint else ""
    fields = cost_of(s, cost, wall.count if wall is not None else None).fields()
    what = ("Dynamo compiles the function up to that line and runs the rest of it eagerly "
            "on every call" if rest else
            "Dynamo gave up on the whole function and runs it eagerly on every call")
    return Finding(
        f"graph break in {name}{where} that Dynamo cannot resume from: "
        f"{reason.strip().rstrip('.')}. {what}{measured}.{advice} Or move that code out of "
        "the compiled function and compile the parts around it.",
        "warning", loc, kind="graph_break_unresumable", **fields)


def cpu_fallbacks(s: Snapshot) -> Iterable[Finding]:
    """torch_xla's ``aten::`` counters: ops that ran on the CPU instead of XLA."""
    for c in s.counters:
        if not c.name.startswith("aten::") or not c.value:
            continue
        if c.name == "aten::_local_scalar_dense" and (_value_access_graphs(s)
                                                      or _closure_graphs(s)):
            continue  # named with its line by xla_value_access or xla_closure_reads
        if c.name == "aten::_local_scalar_dense":
            cost = cost_of(s, 0.0, c.value)
            p = cost.per_step
            often = ("steps are not known" if p is None
                     else f"{p:.1f} per step" if p >= 0.1 else f"{p:.2g} per step")
            if cost.per_step is not None and cost.per_step < 1.0:  # fewer reads than steps
                # No compile was forced by them (else xla_value_access names them):
                # occasional reads after the sync, e.g. logging every N steps.
                yield Finding(
                    f"{c.name} ran {c.value} times ({often}, about one every "
                    f"{_steps_apart(cost.per_step)} steps): occasional reads of a tensor's "
                    "value on the host (logging every N steps), none of them before "
                    "torch_xla.sync() (no extra graph was compiled for them): nothing to do.",
                    "info", None, kind="value_read", count=c.value, per_step=cost.per_step)
                continue
            yield Finding(
                f"{c.name} ran {c.value} times ({often}; its time is in TransferFromDeviceTime): "
                "a device tensor's value was read on the host (.item(), printing, Python "
                "control flow on a tensor); each read waits for the device, and a read "
                "before torch_xla.sync() cuts the graph and compiles an extra one. Read "
                "values every N steps, after torch_xla.sync().", "warning", None,
                kind="value_read", count=c.value, per_step=cost.per_step)
            continue
        else:
            msg = (f"{c.name} ran on the CPU {c.value} times: it falls back to the CPU "
                   "(no XLA lowering), so each call copies its inputs to the host and the "
                   "result back. Replace it with ops that lower, or keep it out of the step; "
                   "see torch_xla's TROUBLESHOOTING.md on aten:: counters.")
        yield Finding(msg, "warning", None, 0.0, "cpu_fallback", count=c.value)


def unused_gradients(s: Snapshot) -> Iterable[Finding]:
    """Parameters whose gradients backward() computes and no optimizer steps
    (``unused_gradients`` sites: :mod:`metrics.engines.torch.unused_grads`): a
    frozen network left with requires_grad on. A warning where they outweigh
    the optimizers' own parameters (most of the backward's weight gradients
    then go unused: yunjey's style transfer, 50-55 % of its loop by A/B)."""
    for x in s.sites:
        if x.kind != SiteKind.UNUSED_GRADIENTS.value or not x.count:
            continue
        most = x.bytes >= x.timed_bytes
        yield Finding(
            f"backward() at {short_location(x.location)} computes gradients for {x.count:,} "
            f"parameters that no optimizer steps ({x.detail}; {size_words(x.bytes)} of "
            "gradients each backward, seen once after the first optimizer step). If they are "
            "frozen (a feature extractor, a perceptual or style loss's network), set "
            "requires_grad_(False) on them, so backward() skips their weight gradients; if "
            "you update them by hand from .grad, this is expected. Its time is not measured: "
            "time a step with and without.",
            Severity.WARNING if most else Severity.INFO, x.location, 0.0, "unused_gradients")
