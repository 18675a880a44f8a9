"""Problems in plain words, computed from a snapshot, worst first.

Each rule is a small pure function of :class:`~tpu_info.contract.model.Snapshot`;
:func:`find` runs them all and ranks them by what each problem cost (seconds
lost, then share of step time). Every finding has a stable ``kind``
(``recompile_<cause>``, ``per_step_sync``, ``per_step_implicit_transfer``,
``eager_ops``, ``graph_break_unresumable``, ``compile_share``, ...), the
user's line where one is known, and its cost per step where steps are known
(:mod:`tpu_info.views.cost`). Rules over one kind of record live beside
this module: :mod:`tpu_info.views.sites` (lines that synced or copied every
step) and :mod:`tpu_info.views.findings_torch` (graph breaks, torch_xla's value
reads and CPU fallbacks); :data:`RULES` lists them all.

Example:
    >>> from tpu_info.contract.model import Snapshot
    >>> find(Snapshot(taken_at_unix=0.0))
    []
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import replace

from tpu_info.contract import catalog
from tpu_info.contract.model import (
    FIRST_CALL,
    EventKind,
    Finding,
    GraphRecord,
    Phase,
    ProcessRecord,
    RecompileCause,
    Severity,
    SiteKind,
    Snapshot,
)
from tpu_info.contract.phases import bursts_phase
from tpu_info.views import recompile_groups as groups
from tpu_info.views.causes import CauseAdvice, classify, warm_up, xla_new_graph
from tpu_info.views.compile_in_loop import first_in_loop, in_loop_part, worth_saying
from tpu_info.views.compile_parts import cache_words, message, named
from tpu_info.views.cost import (
    cost_of,
    duration,
    engine_of,
    rank_key,
    share_words,
    short_location,
    steps_of,
)
from tpu_info.views.data_loading import data_loading
from tpu_info.views.eager import eager_ops, single_op
from tpu_info.views.explicit_syncs import explicit_syncs
from tpu_info.views.findings_torch import (
    closure_read,
    cpu_fallbacks,
    graph_breaks,
    unused_gradients,
    value_access,
    xla_closure_reads,
    xla_eager_mode,
    xla_value_access,
)
from tpu_info.views.host_work import host_work
from tpu_info.views.job_graphs import diverging_graphs  # noqa: F401 - (re-exported)
from tpu_info.views.library_jit import library_jit
from tpu_info.views.periodic import per_step_work, periodic_work
from tpu_info.views.recompile_groups import own_seconds, recompile_severity, recreated_once
from tpu_info.views.sites import site_findings
from tpu_info.views.slow_compile import PER_SHAPE_GRAPHS, per_shape, slow_compiles, slow_graphs
from tpu_info.views.slow_steps import slow_steps
from tpu_info.views.startup import startup
from tpu_info.views.thread_work import thread_work
from tpu_info.views.values import recorded_anything

_NON_RECOMPILE = (FIRST_CALL,)
# A line's findings that per_step_eager_work's measured JAX time holds: its ops
# and its copies (equinox's filter_shard of each numpy batch: the copies'
# "device_put the data set once" made the loop 56 % slower; the fix is the
# eager call itself).
_EAGER_LINES = ("per_step_eager_ops", "per_step_implicit_transfer")
# The cache across runs is advised where the graphs it would load hold at
# least this share of compiling (less is named, without advice).
CACHE_PART = 0.25
_XLA_WARM_UP = ("warm-up (the step after the first is a new graph once: optimizer state or "
                "accumulators created by the first step now live on the device), not a problem.")


_seconds = duration


def cause_kind_name(k: CauseAdvice) -> str:
    """A cause kind as a finding kind: ``second batch size, e.g. evaluation vs
    training`` -> ``recompile_second_batch_size``; ``global state: grad_mode``
    -> ``recompile_global_state_grad_mode``."""
    head, _, tail = k.kind.split(",")[0].partition(":")
    tail = tail.strip()
    words = f"{head} {tail}" if tail and " " not in tail else head
    return "recompile_" + (re.sub(r"[^a-z0-9]+", "_", words.lower()).strip("_") or "other")


def _describe(text: str, cause: RecompileCause) -> str:
    if cause.location:
        text += f" at {short_location(cause.location)}"
        if cause.via:  # the user's line called a library that compiled
            text += f" (via {cause.via})"
    return text


_PART_RE = re.compile(r"^(?P<fn>compile\(.+)@\d+\)$")


def function_name(name: str) -> str:
    """The function a graph compiles part of: torch.compile's graphs of the
    rest of a function after a graph break (``compile(Net.forward@56)``)
    belong to ``compile(Net.forward)``; other names are their own."""
    m = _PART_RE.match(name)
    return f"{m.group('fn')})" if m else name


def _parts(graphs: list[GraphRecord]) -> dict[str, list[GraphRecord]]:
    by_part: dict[str, list[GraphRecord]] = defaultdict(list)
    for g in graphs:
        by_part[g.name].append(g)
    return by_part


def by_function(s: Snapshot) -> dict[str, list[GraphRecord]]:
    """The graphs of ``s`` grouped by the function they compile (:func:`function_name`)."""
    by_name: dict[str, list[GraphRecord]] = defaultdict(list)
    for g in s.graphs:
        by_name[function_name(g.name)].append(g)
    return by_name


def function_compiles(graphs: list[GraphRecord]) -> int:
    """How often one function's ``graphs`` compiled: a call that recompiles
    every part of a function split by graph breaks is one compile (the most
    any part compiled)."""
    return max(sum(g.compiles for g in part) for part in _parts(graphs).values())


def recompiles(s: Snapshot) -> Iterable[Finding]:
    """A function compiled more than once, with the latest real cause. The
    graphs of one function split by graph breaks count as one: a call that
    recompiles both parts is one recompile (the most any part compiled)."""
    for name, graphs in by_function(s).items():
        yield from _function_recompiles(s, name, graphs)


def _function_recompiles(s: Snapshot, name: str,
                         graphs: list[GraphRecord]) -> Iterable[Finding]:
    """:func:`recompiles`' findings for one function's ``graphs``."""
    parts = _parts(graphs).values()
    compiles = function_compiles(graphs)
    if compiles < 2:
        return
    causes = sorted((c for g in graphs for c in g.causes
                     if c.description not in _NON_RECOMPILE),
                    key=lambda c: c.time_unix)
    if causes and all(value_access(c) or closure_read(c) for c in causes):
        return  # xla_value_access or xla_closure_reads names it
    if not causes and (told := per_shape(s, name, graphs)) is not None:
        yield told  # each graph its first compile: no recompile to leave out
        return
    if not causes and (again := groups.same_graph(s, name, graphs)) is not None:
        yield again  # the same program compiled again: no new shape to say
        return
    if not causes and (compiles < PER_SHAPE_GRAPHS or single_op(name)):
        return  # eager ops compile once per new shape: only many are news
    total = sum(g.compile_seconds_total for g in graphs)
    firsts = [min(compiled, key=lambda g: g.first_seen_unix) for part in parts
              if (compiled := [g for g in part if g.compiles])]
    first_site = next((c.location for g in graphs for c in g.causes
                       if c.description == FIRST_CALL and c.location), None)
    own = own_seconds(causes)
    lost = own if own is not None else max(
        0.0, total - sum(g.compile_seconds_last for g in firsts))
    if causes and warm_up(compiles, graphs[0].engine, tuple(causes)) and all(
            map(xla_new_graph, causes)):
        yield Finding(f"{name} compiled {compiles} times in its first steps "
                      f"({_seconds(total)}): {_XLA_WARM_UP}",
                      Severity.INFO, causes[-1].location, 0.0, "warm_up")
        return
    if causes:
        yield from _by_kind(s, name, compiles, total, lost, graphs, first_site)
        return
    phase, _ = bursts_phase([g.last_seen_unix for g in graphs if g.compiles > 1]
                            or [g.first_seen_unix for g in graphs[1:]], steps_of(s))
    c = cost_of(s, lost, compiles - 1, phase=phase)
    msg = (f"{name} compiled {compiles} times ({_seconds(total)} compiling, {c.tail()}) "
           "for different inputs, with no cause recorded. "
           + ("Keep its input shapes fixed or run it inside jit." if engine_of(s) == "jax"
              else "Keep its input shapes fixed (or mark the changing dimension dynamic: "
              "torch._dynamo.mark_dynamic(x, dim))."))
    yield Finding(msg, recompile_severity(c, expected=False), None, kind="recompile_no_cause",
                  **c.fields())


def _by_kind(s: Snapshot, name: str, compiles: int, total: float, lost: float,
             graphs: list[GraphRecord], first_site: str | None) -> Iterable[Finding]:
    """One finding per kind of cause (its ``kind`` is the cause's kind), each with
    its latest example and advice. Every recompile of a graph counts for the kind
    of its own cause (a short batch, then grad mode: once for each) with its own
    compile time (older hooks: the graph's split evenly among its compiles).
    Compiles whose backend came from a persistent cache still recompiled: said so."""
    kinds: dict[str, list[tuple[RecompileCause, GraphRecord]]] = defaultdict(list)
    for g in graphs:
        for c in g.causes:
            if c.description not in _NON_RECOMPILE:
                kinds[classify(c, first_site).kind].append((c, g))
    kinds = recreated_once(kinds)
    for kind, seen in kinds.items():
        # The function's own graph names the user's argument (a later part, a local).
        own = [c for c, g in seen if g.name == name]
        cause = max(own or [c for c, _ in seen], key=lambda c: c.time_unix)
        k = classify(cause, first_site, s.process.engine if s.process else graphs[0].engine)
        if k.kind == "warm-up":
            yield Finding(f"{name} compiled {len(seen)} new graph{'s' * (len(seen) > 1)} in its "
                          f"first steps: {_XLA_WARM_UP}", Severity.INFO, cause.location, 0.0,
                          "warm_up")
            continue
        mine = graphs if len(kinds) == 1 else list({id(g): g for _, g in seen}.values())
        hits = sum(g.cache_hits for g in mine if g.compiles)
        loaded = f", {hits} backend cache hit{'s' * (hits > 1)}" if hits else ""
        per_part: dict[str, int] = defaultdict(int)  # recompiles of this kind per part
        for _, g in seen:
            per_part[g.name] += 1
        across = (f" in {len(per_part)} graphs split by graph breaks" if len(per_part) > 1
                  else "" if name in per_part else f" in {next(iter(per_part))}, the part "
                  "after a graph break")
        # Each recompile's site (its line, graph and argument): recompiles at
        # lines that each recompiled once are one cluster, once, never a period.
        each = groups.one_per_change(seen)
        phase, _ = bursts_phase([c.time_unix for c, _ in each], steps_of(s), sites=[
            f"{c.location}|{g.name}|{c.argument}" for c, g in each])
        if phase == Phase.PERIODIC and max(per_part.values()) < 2:
            phase = Phase.ONCE  # one call recompiled each part of a split function once
        if len(kinds) == 1:
            # (JAX explains every recompile: count its changes, a pair's graphs once)
            n = (groups.changes(c for c, _ in seen) if graphs[0].engine == "jax"
                 and own_seconds(c for c, _ in seen) is not None else compiles - 1)
            c = cost_of(s, lost, max(1, n), phase=phase)
            n = c.count or 0
            head = (f"{name} compiled {compiles} times ({_seconds(total)} compiling{across}"
                    f"{loaded}; "
                    f"{n} recompile{'s' * (n != 1)}, {_seconds(lost)}: {c.tail()})")
        else:
            split = any(len({classify(x, first_site).kind for x in g.causes
                             if x.description not in _NON_RECOMPILE}) > 1 for g in mine)
            own = own_seconds(c for c, _ in seen)
            seconds = own if own is not None else min(lost, sum(
                g.compile_seconds_total / max(1, g.compiles) for _, g in seen))
            n = max(per_part.values())  # one call recompiles each part once
            if graphs[0].engine == "jax":
                n = min(n, groups.changes(c for c, _ in seen))
            c = cost_of(s, seconds, n,
                        "estimated: a graph's compile time split evenly among its compiles"
                        if split and own is None else "", phase)
            head = (f"{name} recompiled {n} time{'s' * (n > 1)} for {kind} "
                    f"({_seconds(c.seconds)} compiling{across}{loaded}, {c.tail()})")
        yield Finding(f"{head}; {_describe(k.text, cause)}. {groups.once_advice(k, phase)}",
                      recompile_severity(c, k.expected), cause.location,
                      kind=cause_kind_name(k), **c.fields())


def compile_share(s: Snapshot) -> Iterable[Finding]:
    """Compiling took a large share of the program's life: where it went,
    the largest part first, each with the finding or advice that fits it
    (:mod:`tpu_info.views.compile_parts`): eager code's single-operation
    graphs, the slow_compile findings' graphs, the recompiles' findings,
    and the rest named, with the cache across runs. Graphs first compiled
    inside the step loop come first, said as such
    (:mod:`tpu_info.views.compile_in_loop`), and are news on their own."""
    ct = s.distribution(catalog.COMPILE_TIME)
    if ct is None or s.uptime_seconds <= 0:
        return
    share = min(1.0, ct.total / 1e9 / s.uptime_seconds)
    compiled = [g for g in s.graphs if g.compiles]
    told, kinds = _told_recompiles(s)
    slow_hashes = slow_graphs(s)
    # First compiles the loop waited for: said first (slow_compile's and the
    # recompiles' graphs have their own findings).
    looped = [(g, w) for g, w in first_in_loop(s, compiled)
              if g.hash not in slow_hashes and function_name(g.name) not in told]
    looped = looped if worth_saying(s, looped) else []
    if (share < 0.25 or ct.count < 3) and not looped:
        return
    head = (f"compiling took {share_words(share)} of the run so far ({ct.count} compiles, "
            f"{_seconds(ct.total / 1e9)}, measured)")
    if engine_of(s) == "torch_xla" and ct.count <= 3 and not told:
        yield Finding(f"{head}: torch_xla compiles its first steps (warm-up), a start-up "
                      "cost that a longer run pays once.", Severity.INFO, None, 0.0,
                      "compile_share")
        return
    # Each graph in one part: a recompile's finding, eager code's, slow_compile's,
    # answered by the backend cache, or the rest (the cache across runs).
    eager = list(dict.fromkeys(f.kind for f in eager_ops(s)))
    in_loop = {g.hash for g, _ in looped}
    again: list[GraphRecord] = []
    tiny: list[GraphRecord] = []
    slow: list[GraphRecord] = []
    hit: list[GraphRecord] = []
    cached: list[GraphRecord] = []
    loop_first: list[GraphRecord] = []
    for g in compiled:
        (again if function_name(g.name) in told else tiny if eager and single_op(g.name)
         else slow if g.hash in slow_hashes else loop_first if g.hash in in_loop
         else hit if g.cache_hits else cached).append(g)
    parts: list[tuple[float, str]] = []
    if tiny:  # the eager_ops finding's advice: jit that code
        parts.append((_total(tiny), f"eager code's {len(tiny)} single-op graphs "
                                    f"{_seconds(_total(tiny))} (see {eager[0]})"))
    if slow:
        parts.append((_total(slow), f"{named(slow, 2)} (see slow_compile)"))
    if again:
        fns = list(dict.fromkeys(function_name(g.name) for g in again))
        n = sum(g.compiles for g in again)
        kinds += ["slow_compile"] * any(g.hash in slow_hashes for g in again)
        parts.append((_total(again), f"{', '.join(fns[:2])}{' and more' * (len(fns) > 2)} "
                                     f"{_seconds(_total(again))} in {n} compile"
                                     f"{'s' * (n > 1)} (see {', '.join(kinds[:2])}"
                                     f"{f' and {len(kinds) - 2} more' * (len(kinds) > 2)})"))
    if hit:
        parts.append((_total(hit), f"the other {named(hit, 0)}, with backend cache hits"))
    worth = _total(cached) >= CACHE_PART * ct.total / 1e9
    advice = cache_words(engine_of(s), cached, sum(1 for g in s.graphs if g.cache_hits))
    first = in_loop_part(s, looped) if looped else ()
    if first:  # its advice named the cache already
        advice = f"the same cache would load {'them' if len(cached) > 1 else 'it'} next run too"
    yield Finding(message(head, parts, cached, advice if worth else "", first), Severity.INFO,
                  None, 0.0, "compile_share")


def _total(graphs: Iterable[GraphRecord]) -> float:
    return sum(g.compile_seconds_total for g in graphs)


def _told_recompiles(s: Snapshot) -> tuple[set[str], list[str]]:
    """The functions whose recompiles a finding holds (their shapes or
    arguments change: see it, not a cache), and those findings' kinds."""
    told: set[str] = set()
    kinds: list[str] = []
    xla = [f.kind for rule in (xla_value_access, xla_closure_reads) for f in rule(s)]
    for name, graphs in by_function(s).items():
        if function_compiles(graphs) < 2:
            continue
        own = [f.kind for f in _function_recompiles(s, name, graphs)]
        causes = [c for g in graphs for c in g.causes if c.description not in _NON_RECOMPILE]
        if not own and xla and causes and all(value_access(c) or closure_read(c)
                                              for c in causes):
            own = xla
        if own:
            told.add(name)
            kinds += [k for k in own if k not in kinds]
    return told, kinds


def memory_pressure(s: Snapshot) -> Iterable[Finding]:
    """Device memory near its limit, or uneven across devices."""
    stats = [d for d in s.devices
             if d.memory.source != "live_arrays" and d.memory.used_bytes is not None
             and d.memory.limit_bytes]
    for d in stats:
        share = d.memory.used_bytes / d.memory.limit_bytes  # type: ignore[operator]
        if share >= 0.9:
            yield Finding(f"device {d.id} memory at {share:.0%} of its limit: the next "
                          "larger batch or graph may run out of memory.",
                          Severity.WARNING, None, 0.0, "memory_pressure")
    used = [d.memory.used_bytes for d in stats if d.memory.used_bytes]
    if len(used) >= 2 and max(used) > 2**30 and max(used) > 1.5 * min(used):  # type: ignore[type-var,operator]
        yield Finding(f"device memory is uneven: {min(used) / 2**30:.1f} to "  # type: ignore[type-var,operator]
                      f"{max(used) / 2**30:.1f} GiB across {len(used)} devices; "  # type: ignore[type-var,operator]
                      "check the sharding of the largest arrays.",
                      Severity.INFO, None, 0.0, "memory_uneven")


def hook_errors(s: Snapshot) -> Iterable[Finding]:
    n = s.counter(catalog.HOOK_ERRORS)
    if n:
        yield Finding(f"the tpu-info hook failed {n} times and skipped those records "
                      "(the program itself was not affected); see its log for the first error.",
                      Severity.INFO, None, 0.0, "hook_errors")


def kept_out(s: Snapshot) -> Iterable[Finding]:
    """Values the client refused when it decoded the reply (not finite, too many)."""
    if s.left_out:
        where, why = s.left_out[0]
        more = f" and {len(s.left_out) - 1} more" if len(s.left_out) > 1 else ""
        yield Finding(f"the target sent values this client kept out ({where}: {why}{more}); "
                      "`tpu-info doctor` lists them all.", Severity.WARNING, None, 0.0, "kept_out")


def no_engine_reason(p: ProcessRecord) -> str:
    """Why a hooked process records nothing, and the remedy (empty: an engine is hooked)."""
    if p.engine:
        return ""
    waiting = [e for e in p.waiting.split(",") if e]
    if waiting:
        return (f"no engine imported yet: the hook waits for {', '.join(waiting)} "
                "(hooked when its import finishes); import it, or call "
                "metrics.install(engines=[...])")
    return ("no engine hook is installed in the process: call metrics.install() "
            "(before or after importing jax/torch), or start it with `tpu-info run`")


def no_engine(s: Snapshot) -> Iterable[Finding]:
    """The hook runs but no engine is hooked: nothing it shows means "no problems"."""
    if s.process is not None and not s.process.engine:
        yield Finding(f"nothing recorded: {no_engine_reason(s.process)}.", Severity.WARNING, None,
                      0.0, "no_engine")


def nothing_recorded(s: Snapshot) -> Iterable[Finding]:
    """An engine is hooked but nothing was recorded: no finding is not "no problems"."""
    p = s.process
    if p is None or not p.engine:
        return
    if recorded_anything(s):
        return  # (a line's reads are: an eager torch program's .item())
    launch = (" A torch_xla.launch / xmp.spawn parent runs no steps itself: each worker is "
              "hooked and listed on its own (`tpu-info` lists their pids)."
              if "torch_xla" in p.engine else "")
    yield Finding(f"nothing recorded yet by the {p.engine} hook (no compiles, steps or "
                  "transfers), so there is nothing to judge: run a step, or check that the "
                  f"program runs its work through {p.engine}.{launch}{_unseen(s)}", Severity.INFO,
                  None, 0.0, "nothing_recorded")


def _unseen(s: Snapshot) -> str:
    return f" Not counted here: {'; '.join(s.blind_spots)}." if s.blind_spots else ""


# The event kinds the rules read from ``Snapshot.events`` (graph-break reasons,
# where eager ops compiled): a reader that folds a stream of snapshots, each
# carrying only its new events, keeps these so the rules see the whole window.
EVENTS_READ = frozenset({EventKind.COMPILE, EventKind.RECOMPILE, EventKind.GRAPH_BREAK})

RULES: tuple[Callable[[Snapshot], Iterable[Finding]], ...] = (
    no_engine, recompiles, eager_ops, site_findings, library_jit, host_work, data_loading,
    explicit_syncs, thread_work,
    periodic_work, per_step_work,
    slow_steps,
    slow_compiles,
    compile_share,
    memory_pressure, graph_breaks, xla_value_access, xla_closure_reads, xla_eager_mode,
    cpu_fallbacks, unused_gradients,
    hook_errors, kept_out, startup,
    nothing_recorded,
)


def find(snapshot: Snapshot) -> list[Finding]:
    """Every finding, costliest first (seconds lost, then share of step time;
    warnings before info at equal cost)."""
    out: list[Finding] = []
    for rule in RULES:
        out.extend(rule(snapshot))
    out = [f if f.kind else replace(f, kind="other") for f in out]  # kind is always set
    if any(f.kind == "per_step_eager_work" for f in out):  # its lines' JAX time, ops and all
        eager = {x.location for x in snapshot.sites if x.kind == SiteKind.EAGER_WORK.value}
        out = [f for f in out if f.kind not in _EAGER_LINES or f.location not in eager]
    out.sort(key=rank_key)
    return out + list(_overlap(out))


def _overlap(found: list[Finding]) -> Iterable[Finding]:
    """The per-step shares of one process's findings add up to more than the
    step: said, since one wait can hold several causes (a sync waits for the
    same device work a transfer is part of)."""
    shares = [f.share_of_step for f in found if f.share_of_step]
    if len(shares) > 1 and sum(shares) > 1.0:
        yield Finding(f"the per-step costs above add up to {share_words(sum(shares))} of the "
                      "step time: they overlap (a sync waits for the same device work a "
                      "transfer or a compile is part of), so fix the costliest first and "
                      "measure again.", Severity.INFO, None, 0.0, "overlapping_costs")
