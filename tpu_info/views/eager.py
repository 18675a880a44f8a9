"""Eager (un-jitted) JAX code: many single-operation graphs, and when they compiled.

JAX compiles each primitive of eager code once per new shape (``jit(add)``,
``jit(_reduce_sum)``). Where the compiles happened decides what they cost:
model initialisation before the first step is one-off start-up work; an
evaluation's first pass compiles once, in the loop; only compiles that keep
coming through the loop (new shapes every step) are a per-step cost
(:func:`tpu_info.contract.phases.bursts_phase`).

Example:
    >>> from tpu_info.contract.model import Snapshot
    >>> list(eager_ops(Snapshot(taken_at_unix=0.0))), single_op("jit(add)")
    ([], True)
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

from tpu_info.contract.model import (
    CALLED_FROM,
    INDEXING_OPS,
    EventKind,
    Finding,
    GraphRecord,
    Phase,
    Severity,
    SiteReading,
    Snapshot,
    StepsReading,
)
from tpu_info.contract.phases import bursts_phase, loop_of, phase_of
from tpu_info.views.cost import (
    OUTSIDE_STEP,
    cost_of,
    duration,
    outside_warns,
    short_location,
    size_words,
    steps_of,
)

# What eager (un-jitted) JAX code compiles: one graph per primitive and shape.
_SINGLE_OP_RE = re.compile(r"^jit\((?P<op>_?[a-z][a-z0-9_]*)\)$")
_SINGLE_OPS = frozenset("""
abs add and argmax argmin bitwise_and broadcast_in_dim ceil clamp clip concatenate
convert_element_type cos cosh cumsum div divide dot dot_general dynamic_slice
dynamic_update_slice eq equal exp expand_dims floor gather ge greater gt integer_pow iota
le less log log1p logistic lt matmul max maximum mean min minimum mul multiply ne negative
neg not or pow power reshape rsqrt scatter select_n sign sin sinh slice sqrt square
squeeze sub subtract sum tanh tan transpose true_divide where _where xor zeros_like
ones_like full full_like concatenate stack clip _mean _var _reduce_max _reduce_min
_reduce_prod _reduce_sum _reduce_all _reduce_any var std einsum _einsum softmax relu
""".split())


def single_op(name: str) -> bool:
    """A graph of one primitive (``jit(add)``, ``jit(_reduce_sum)``): what eager code compiles."""
    m = _SINGLE_OP_RE.match(name)
    if not m:
        return False
    op = m.group("op")
    return op in _SINGLE_OPS or op.lstrip("_") in _SINGLE_OPS or op.startswith("_reduce_")


_JIT_NAME_RE = re.compile(r"\bjit\([^()]*\)")


def not_jitted_step(line: str) -> str:
    """The advice where the step itself is not jitted (``StepsReading.step_line``)."""
    return (f"The step, at {short_location(line)}, is not jitted (only the library functions "
            "it calls are): jit the function that holds that line, so its ops compile once "
            "per shape as one graph.")


# Libraries that take arrays to the host (plots, tables, loggers, images):
# eager ops at their frames convert the jax arrays the user handed them.
_HOST_CONSUMERS = frozenset({"matplotlib", "seaborn", "plotly", "bokeh", "pandas", "PIL",
                             "imageio", "wandb", "tensorboard", "tensorboardX", "mlflow"})


def _host_consumer_advice(via: str) -> str | None:
    """Advice for eager ops that ran inside a plotting or logging library
    (``via`` "matplotlib _preprocess_data"); None for any other."""
    top = via.split(" ", 1)[0] if via else ""
    if top not in _HOST_CONSUMERS:
        return None
    return (f"{top} converts the jax arrays it is given, op by op: hand it host data "
            f"(jax.device_get(x) or np.asarray(x), once) before the call.")


def _generator_name(function: str) -> str:
    """``batches.<locals>.<genexpr>`` -> ``batches()``: the generator function
    a line's expression runs in."""
    parts = [p for p in function.split(".<locals>.") if p and p != "<genexpr>"]
    return f"{parts[-1]}()" if parts else "a generator"


def _generator_advice(site: SiteReading, when: str) -> str | None:
    """Advice for eager ops at a line in a generator function (a data loader
    that yields batches: ``SiteReading.in_generator``), which jit cannot
    hold; None for any other line. ``when``: how often it ran ("each step")."""
    if not site.in_generator:
        return None
    name = _generator_name(site.function)
    into = "the jitted step" if when == "each step" else "the jitted function it feeds"
    if INDEXING_OPS & set(site.detail.split(", ")):
        return (f"The data loader there, {name} (a generator, which jit cannot hold), "
                f"indexes a jax.Array from Python {when}: keep the data set as numpy "
                "(np.asarray once, before the loop) and index it on the host, so each batch "
                f"goes to the device in one copy; or pass the indices into {into} and gather "
                "there.")
    return (f"They run in a generator, {name}, which jit cannot hold: do this work in "
            f"{into}, or in numpy on the host before the batch goes to the device.")


HOST_DATA_BYTES = 64_000  # numpy inputs a time from which the copy is the advice


def _host_data_advice(site: SiteReading, when: str) -> str | None:
    """Advice for eager ops on numpy inputs (``site.bytes``: the hook counts
    an op's numpy inputs; a numpy data set resharded eagerly every epoch):
    each time they copy the data to the device again, which jit would not
    save; None below ``HOST_DATA_BYTES`` a time."""
    each = site.bytes / site.count if site.count else 0.0
    if each < HOST_DATA_BYTES:
        return None
    return (f"Their inputs are numpy arrays, {size_words(each)} copied to the device {when}: "
            "put the data on the device once, before the loop (jax.device_put(data, "
            "sharding)), and run these ops on the device array.")


def eager_site_advice(site: SiteReading, when: str = "each step") -> str | None:
    """Advice chosen from what the hook knows of an eager-op line: a
    plotting or logging library it went through, a generator it runs in (a
    loader's batches, made there), or numpy inputs it copied to the device
    (``when``: how often it ran); None when none (the caller's advice then)."""
    return (_host_consumer_advice(site.via) or _generator_advice(site, when)
            or _host_data_advice(site, when))


def step_function(s: Snapshot) -> str | None:
    """The jitted function a step runs (``jit(train_step)``): named by the
    inferred steps' basis, else the non-single-op graph called most (10+
    times); None where the step is not jitted (``StepsReading.step_line``:
    its counted calls are a library's, never named as the step)."""
    st = steps_of(s)
    if st is not None and st.step_line:  # the step is not jitted: a library's calls counted
        return None
    if st is not None and (m := _JIT_NAME_RE.search(st.basis)) and not single_op(m.group()):
        return m.group()
    called = [g for g in s.graphs if (g.executions or 0) >= 10 and not single_op(g.name)
              and g.name.startswith("jit(")]
    return max(called, key=lambda g: g.executions or 0).name if called else None


_CALLED_FROM_RE = re.compile(re.escape(CALLED_FROM)
                             + r"(?P<fn>\S+?)\(\) at (?P<loc>.+?:\d+)(?: via (?P<via>\S+?)\(\))?")


def _eager_sites(s: Snapshot, tiny: list[GraphRecord],
                 window: tuple[float, float] | None = None) -> list[tuple[str, str | None]]:
    """Where single-op graphs compiled, most compiles first: (line, call), the
    line that ran the op and the user's call that led there from the outermost
    function (``accuracy() at /w/train.py:104 via predict()``) or None when the
    line is in that function itself. Compile events carry both, causes the line."""
    names = {g.hash for g in tiny}
    sites: list[tuple[str, str | None]] = []
    for e in s.events:
        if window is not None and not window[0] <= e.time_unix <= window[1]:
            continue
        if e.kind == EventKind.COMPILE and e.location and (e.graph_hash in names
                                                           or single_op(e.name)):
            m = _CALLED_FROM_RE.search(e.detail)
            sites.append((e.location, m.group() if m else None))
    if not sites:
        sites = [(c.location, None) for g in tiny for c in g.causes if c.location]
    counts: dict[tuple[str, str | None], int] = defaultdict(int)
    for site in sites:
        counts[site] += 1
    return sorted(sites, key=lambda site: (-counts[site], site[0], site[1] or ""))


def _teardown_span(s: Snapshot, lines: set[str]) -> float:
    """The wall time from the first to the last eager op after the last step
    at ``lines`` (the lines whose ops compiled there), s: an un-jitted final
    evaluation's time, its ops' Python dispatch between them included
    (equinox's vision transformer: 64 ops compiled in 2.2 s, where jitting
    the evaluation saved 13 s of wall time over its 10 batches); 0 where
    none ran there."""
    loop = loop_of(steps_of(s))
    told = [x for x in s.sites if x.kind == "eager_op" and x.location in lines
            and loop is not None and x.first_seen_unix > loop[1] and x.last_seen_unix]
    if not told:
        return 0.0
    return max(x.last_seen_unix for x in told) - min(x.first_seen_unix for x in told)


def _via(s: Snapshot, tiny: list[GraphRecord], window: tuple[float, float]) -> str:
    """`` (via flax nnx.Linear)``: the library call most of these compiles went
    through from the user's line; empty when the user's code ran the ops."""
    names = {g.hash for g in tiny}
    vias: dict[str, int] = defaultdict(int)
    for e in s.events:
        if e.via and e.graph_hash in names and window[0] <= e.time_unix <= window[1]:
            vias[e.via] += 1
    return f" (via {max(vias, key=lambda v: vias[v])})" if vias else ""


def _eager_where(sites: list[tuple[str, str | None]]) -> tuple[str | None, str, str]:
    """(location, where, what to jit) for the eager-ops finding, from the
    place most of its compiles came from: a user function's call that led to
    the op lines, or an op line with no such call (the ops run where the
    loop's own code calls a library: optax's ``transform.update`` at the
    module's level, whose 14 compiles were put on a plot() call's 2)."""
    places: dict[tuple[str, str], list[str]] = defaultdict(list)  # (fn, line) -> op lines
    for line, call in sites:
        m = _CALLED_FROM_RE.match(call) if call else None
        if m is None:
            places[("", line)].append(short_location(line))
            continue
        via = m.group("via")
        places[(m.group("fn"), m.group("loc"))].append(
            f"{short_location(line)}{f' in {via}()' if via else ''}")
    if not places:
        return None, "", "that function"
    (fn, loc), ops = max(places.items(), key=lambda kv: len(kv[1]))
    others = len(places) - 1
    if not fn:
        where = f" at {short_location(loc)}"
        if others:
            where += f" (and {others} other line{'s' * (others > 1)})"
        return loc, where, f"the function that holds {short_location(loc)}"
    ops = list(dict.fromkeys(ops))
    inner = ops[0] + (f" and {len(ops) - 1} other line{'s' * (len(ops) > 2)}"
                      if len(ops) > 1 else "")
    more = ("; 1 other call compiles ops too" if others == 1 else
            f"; {others} other calls compile ops too" if others > 1 else "")
    where = f" in {fn}(), called at {short_location(loc)} (its ops at {inner}{more}),"
    return loc, where, f"{fn}() (called at {short_location(loc)})"


def _compile_times(s: Snapshot, tiny: list[GraphRecord]) -> dict[str, float]:
    """When each single-op graph compiled (by hash): its compile event, else
    the graph's first time (the events ring may have moved on)."""
    names = {g.hash for g in tiny}
    times = {g.hash: g.first_seen_unix for g in tiny}
    for e in s.events:
        if e.kind == EventKind.COMPILE and e.graph_hash in names:
            times[e.graph_hash] = e.time_unix
    return times


def _compile_sites(s: Snapshot, tiny: list[GraphRecord]) -> list[str] | None:
    """What each single-op graph compiled and from where (its op, the op's
    line and the user's call that led there), in ``tiny``'s order: the same
    op from the same line and call compiling again is the next pass. None
    when some compile event is gone from the ring (then times alone judge)."""
    names = {g.hash for g in tiny}
    site: dict[str, str] = {}
    for e in s.events:
        if e.kind == EventKind.COMPILE and e.graph_hash in names:
            m = _CALLED_FROM_RE.search(e.detail)
            site[e.graph_hash] = f"{e.name} {e.location} {m.group('loc') if m else ''}"
    return [site[g.hash] for g in tiny] if all(g.hash in site for g in tiny) else None


def _by_stretch(s: Snapshot, tiny: list[GraphRecord]) -> list[list[GraphRecord]]:
    """The single-op graphs split by when they compiled: before the step loop,
    in it, after it; a stretch of at least ``MIN_GRAPHS`` is judged on its
    own (model initialisation is not the loop's evaluation), else all together."""
    times, steps = _compile_times(s, tiny), steps_of(s)
    if loop_of(steps) is None:
        return [tiny]
    loop = loop_of(steps)
    stretches: dict[int, list[GraphRecord]] = defaultdict(list)
    for g in tiny:  # the phase rule's own set-up, then by the loop's bounds: an
        # evaluation after the last step is one stretch, its first second's ops
        # (phase "once") and the rest's ("tear-down") alike (a loaded machine
        # compiled 10 in that second and split one evaluation in two)
        told = phase_of(times[g.hash], times[g.hash], 1, steps)
        after = loop is not None and times[g.hash] > loop[1]
        stretches[0 if told == Phase.SETUP else 2 if after or told == Phase.TEARDOWN
                  else 1].append(g)
    big = [stretches[k] for k in sorted(stretches) if len(stretches[k]) >= MIN_GRAPHS]
    return big or [tiny]


MIN_GRAPHS = 10  # fewer single-op graphs are not news

_WHERE_WORDS = {
    Phase.SETUP: ("(model or data initialisation): it compiles once, so it costs start-up "
                  "time, not step time. If start-up matters, jit the initialisation ({what}), "
                  "or build it with jax.eval_shape and a jitted init."),
    Phase.ONCE: ("(the first pass of an evaluation, metrics or logging function): it compiled "
                 "once and later passes reuse it. If it matters, jit {what}, so it compiles "
                 "as one graph."),
    Phase.TEARDOWN: ("(a final evaluation or export): it compiled once. If it matters, jit "
                     "{what}, so it compiles as one graph."),
    Phase.PERIODIC: ("(each evaluation or logging pass meets new shapes): jit {what} and keep "
                     "its input shapes fixed (pad the last batch), so it compiles once."),
}


def _outside_loop(times: list[float], steps: StepsReading | None
                  ) -> tuple[Phase, float] | None:
    """Graphs that all compiled outside the step loop (some before it, some
    after: too few of each to judge apart) are one-off work, never "every N
    steps": (phase, since), tear-down (or once, while the loop may go on)
    judged on those compiled after ``since``, the latest step, when some
    came after it; else set-up, all of them (``since`` -inf). None when some
    compiled in the loop."""
    loop = loop_of(steps)
    if loop is None or any(loop[0] <= t <= loop[1] for t in times):
        return None
    after = [t for t in times if t > loop[1]]
    if not after:
        return Phase.SETUP, float("-inf")
    return phase_of(min(after), max(after), len(after), steps), loop[1]


def eager_ops(s: Snapshot) -> Iterable[Finding]:
    """Many tiny single-operation graphs: eager (un-jitted) JAX code compiling
    op by op, costed where it happened: start-up, once, every N steps or
    every step."""
    tiny = [g for g in s.graphs if g.compiles and single_op(g.name)]
    if len(tiny) < MIN_GRAPHS:
        return
    times = _compile_times(s, tiny)
    for stretch in _by_stretch(s, tiny):
        yield _eager_finding(s, stretch, [times[g.hash] for g in stretch])


def _eager_finding(s: Snapshot, tiny: list[GraphRecord], times: list[float]) -> Finding:
    """The finding for single-op graphs compiled at ``times``."""
    outside = _outside_loop(times, steps_of(s))
    if outside is not None:  # after the loop: those alone (flax 03_train_state's set-up's 5)
        phase, bursts = outside[0], 1
        later = [k for k, t in enumerate(times) if t > outside[1]]
        tiny, times = [tiny[k] for k in later], [times[k] for k in later]
    else:
        phase, bursts = bursts_phase(times, steps_of(s), [g.compile_seconds_last for g in tiny],
                                     _compile_sites(s, tiny))
    seconds = sum(g.compile_seconds_total for g in tiny)
    ops = sorted({g.name for g in tiny}, key=lambda n: (-sum(1 for g in tiny if g.name == n), n))
    window = (min(times), max(times))
    lines = _eager_sites(s, tiny, window)
    site, where, what = _eager_where(lines)
    where += _via(s, tiny, window)
    listed = f"{', '.join(ops[:4])}{', ...' if len(ops) > 4 else ''}"
    step = step_function(s)
    if phase in OUTSIDE_STEP:
        # (after the loop: its first ops may come within a second of the last
        # step, said as once rather than tear-down, the same evaluation)
        span = (_teardown_span(s, {line for line, _ in lines}) if outside is not None
                and phase in (Phase.TEARDOWN, Phase.ONCE) else 0.0)
        ran = (f", its ops at those lines running over {duration(span)} after the last step"
               if span > seconds else "")
        c = cost_of(s, max(seconds, span), bursts, phase=phase)
        jitted = f" The step, {step}, is already jitted, so this is code outside it." if (
            step is not None and phase != Phase.SETUP) else ""
        return Finding(
            f"{len(tiny)} single-operation graphs compiled ({duration(seconds)} compiling{ran}, "
            f"{c.tail()}; {listed}): eager, un-jitted code{where} "
            + _WHERE_WORDS[phase].format(what=what) + jitted,
            Severity.WARNING if outside_warns(c) else Severity.INFO, site, kind="eager_ops",
            **c.fields())
    # A jitted function the program calls again and again (the loop's, however
    # few its calls): these ops are code outside it, never "the loop body".
    looped = [g for g in s.graphs if (g.executions or 0) >= 2 and g.name.startswith("jit(")
              and not single_op(g.name)]
    jitted = step or (max(looped, key=lambda g: g.executions or 0).name if looped else None)
    st = steps_of(s)
    if st is not None and st.step_line:
        advice = not_jitted_step(st.step_line)
    elif jitted is not None:
        advice = (f"{'The step, ' if step else 'The program already jits '}{jitted}"
                  f"{', is already jitted' if step else ''}, so this is code outside it "
                  "(evaluation, metrics or initialisation, e.g. an accuracy/eval function): "
                  f"jit {what}, so it compiles once per shape as one graph.")
    else:
        advice = "Wrap the loop body in jax.jit (jit the step function)."
    c = cost_of(s, seconds, len(tiny), phase=phase)
    severity = Severity.WARNING
    # No step known, but the program's work compiled into larger graphs than
    # these ops took (numpyro's CVAE example: svi.init's 81 eager ops beside
    # eager lax loops compiled as jit(scan), 20 s): code outside that work,
    # whose loop is not known; a fully eager loop compiles nothing larger.
    larger = [g for g in s.graphs if g.compiles and not single_op(g.name)]
    if st is None and jitted is None and sum(g.compile_seconds_total for g in larger) > seconds:
        named = ", ".join(sorted({g.name for g in larger})[:3])
        advice = (f"The program's work compiled into larger graphs ({named}), so this is code "
                  "outside them: initialisation (a model's or an optimizer's eager set-up) "
                  "costs this once; code run again (evaluation, metrics) is worth jitting, "
                  "so it compiles once per shape as one graph.")
        severity = Severity.WARNING if outside_warns(c) else Severity.INFO
    return Finding(
        f"{len(tiny)} single-operation graphs compiled ({duration(seconds)} compiling, "
        f"{c.tail()}; {listed}): eager, "
        f"un-jitted code{where} compiles each op for each new shape. {advice}",
        severity, site, kind="eager_ops", **c.fields())
