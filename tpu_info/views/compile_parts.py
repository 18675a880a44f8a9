"""Where a large share of compiling went (``compile_share``'s words): the
parts it holds, the largest first, each with its seconds and with the
finding or the advice that fits it.

The parts: eager code's single-operation graphs (the eager_ops finding's:
jit that code), graphs a slow_compile finding names (its own advice), the
compiles of functions a recompile finding holds (shapes or arguments that
change: a cache across runs is no fix there), and the rest, named by function
with their times, for which the compilation cache across runs is the advice.
JAX's persistent cache keeps only compiles of
``jax_persistent_cache_min_compile_time_secs`` (1.0 s by default, by JAX's
own clock around the backend compile) or more, so where any of them is
shorter than twice that the advice says to lower it.

Example:
    >>> from tpu_info.contract.model import GraphRecord
    >>> g = [GraphRecord(f"{i}" * 64, "jit(_uniform)", "jax", 1.0, 1.0, compiles=1,
    ...                  compile_seconds_total=0.2) for i in range(3)]
    >>> g.append(GraphRecord("f" * 64, "jit(step)", "jax", 1.0, 1.0, compiles=1,
    ...                      compile_seconds_total=0.9))
    >>> named(g, 2)
    'jit(step) 900 ms, jit(_uniform) 600 ms in 3 graphs, 1.5 s in all'
    >>> named(g, 0)
    '4 graphs, 1.5 s in all'
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from tpu_info.contract.model import GraphRecord
from tpu_info.views.cost import duration

CACHE_ADVICE = {
    "jax": "Enable the persistent compilation cache (jax.config.update("
           "'jax_compilation_cache_dir', DIR)) so the next run loads them.",
    "torch_compile": "Keep Inductor's FX graph cache warm across runs (on by default; point "
                     "TORCHINDUCTOR_CACHE_DIR at a directory that persists).",
    "torch_xla": "Enable torch_xla's persistent cache (torch_xla.runtime.initialize_cache(DIR)) "
                 "so the next run loads them.",
}
NO_CACHE = "Cache compiled graphs across runs."
# JAX writes a compile to its persistent cache only from this long
# (jax_persistent_cache_min_compile_time_secs' default), by its own clock.
JAX_CACHE_MIN_S = 1.0
RULE = "jax_persistent_cache_min_compile_time_secs"
_ENABLE = "jax.config.update('jax_compilation_cache_dir', DIR)"
# The most characters a finding's words may take: the report cuts them
# (FINDING_TEXT) and a summary line cuts them sooner; the advice comes last.
MESSAGE_CHARS = 500
MOST_NAMED = 3  # the functions the cache's part names at most, largest first


def by_seconds(graphs: Iterable[GraphRecord]) -> list[tuple[float, str, int]]:
    """``(seconds, function, graphs)`` of ``graphs``' compiles by name, the
    largest first (ties by name)."""
    seconds: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for g in graphs:
        seconds[g.name] += g.compile_seconds_total
        count[g.name] += 1
    return sorted(((t, n, count[n]) for n, t in seconds.items()), key=lambda x: (-x[0], x[1]))


def named(graphs: Sequence[GraphRecord], most: int) -> str:
    """The ``most`` functions of ``graphs`` that took longest to compile, each
    with its time (and its graphs where more than one), and the total."""
    ranked = by_seconds(graphs)
    total = duration(sum(g.compile_seconds_total for g in graphs))
    shown = ranked[:most]
    left = len(graphs) - sum(n for _, _, n in shown)
    words = [f"{name} {duration(t)}" + (f" in {n} graphs" if n > 1 else "")
             for t, name, n in shown]
    if not words:
        return f"{left} graph{'s' * (left != 1)}, {total} in all"
    if left:
        words.append(f"{left} more graph{'s' * (left != 1)}")
    if len(words) == 1:
        return words[0]
    return f"{', '.join(words)}, {total} in all"


def cache_words(engine: str, graphs: Sequence[GraphRecord], cache_on: int) -> str:
    """What a compilation cache across runs would do for ``graphs`` (none of
    them answered by it this run); ``cache_on``: the graphs the backend cache
    answered this run (JAX's persistent cache is on)."""
    them = "them" if len(graphs) > 1 else "it"
    if engine != "jax":
        advice = CACHE_ADVICE.get(engine, NO_CACHE).replace(" loads them", f" loads {them}")
        return advice[0].lower() + advice[1:-1]
    each = [g.compile_seconds_total / max(1, g.compiles) for g in graphs]
    under = any(x < JAX_CACHE_MIN_S for x in each)  # kept only with the bar lowered
    near = any(x < 2 * JAX_CACHE_MIN_S for x in each)  # JAX's clock may read it under
    bar = f"by default it keeps only compiles of {duration(JAX_CACHE_MIN_S)} or more"
    if cache_on:
        return (f"the persistent compilation cache is on ({cache_on} graph"
                f"{'s' * (cache_on > 1)} loaded) but {bar}: set {RULE} to 0 to load {them} "
                "next run too" if under else
                f"the persistent compilation cache is on and should load {them} next run")
    return (f"the persistent compilation cache would load {them} next run: " + _ENABLE
            + (f", and set {RULE} to 0 ({bar})" if under else
               f" ({bar} by JAX's own clock: lower {RULE} if some are not kept)" if near
               else ""))


def message(head: str, parts: Sequence[tuple[float, str]], cached: Sequence[GraphRecord],
            advice: str, first: Sequence[str] = ()) -> str:
    """``head``, then ``first`` (the graphs the step loop waited for, with
    their advice, ahead of the rest; in full, then briefer), then each part
    (``(seconds, words)``) and the cache's part (``cached``'s graphs, named,
    with ``advice``; none where empty), the largest first, in at most
    :data:`MESSAGE_CHARS` characters: where the words would be longer the
    cache's part names fewer functions, then its advice leaves out its
    closing reason in parentheses, then (after ``first``) the smallest parts
    are left out."""
    def text(most: int, advice: str, lead: str = "", keep: int | None = None) -> str:
        said = list(parts)
        if cached:
            seconds = sum(g.compile_seconds_total for g in cached)
            said.append((seconds, f"{named(cached, most)}: {advice}" if advice
                         else f"the other {named(cached, most)}"))
        said.sort(key=lambda x: -x[0])
        return f"{head}: {'; '.join([lead] * bool(lead) + [w for _, w in said[:keep]])}."
    brief = advice.rsplit(" (", 1)[0] if advice.endswith(")") else advice
    for lead in first or ("",):
        for words in (advice, brief):
            for most in range(MOST_NAMED, 0, -1):
                if len(said := text(most, words, lead)) <= MESSAGE_CHARS:
                    return said
    lead = first[-1] if first else ""
    keep = len(parts) + bool(cached)
    while lead and keep > 0 and len(text(0, brief, lead, keep)) > MESSAGE_CHARS:
        keep -= 1
    return text(0, brief, lead, keep)
