"""compile_share's parts, the largest first, each with the advice that fits
it (issue 41 re-runs): eager code's single-operation graphs point at the
eager_ops finding, a slow_compile finding's graph at that finding, a
recompiled function at its recompile finding, and the rest is named with
its times, with the persistent compilation cache as the advice: with
jax_persistent_cache_min_compile_time_secs lowered to 0 where a compile took
under the 1.0 s JAX keeps by default (eqx_rnn's make_step: 0.74-1.1 s, by
A/B the cache so set cut its run from 13.5 to 6.8 s)."""

from __future__ import annotations

from tpu_info.contract.model import (
    FIRST_CALL,
    DistributionReading,
    GraphRecord,
    ProcessRecord,
    RecompileCause,
    Snapshot,
    StepsReading,
    Unit,
)
from tpu_info.views.compile_parts import MESSAGE_CHARS
from tpu_info.views.findings import find

JAX = ProcessRecord(pid=7, name="train.py", engine="jax")
RULE = "jax_persistent_cache_min_compile_time_secs"


def _one(s: Snapshot, kind: str):
    (f,) = [f for f in find(s) if f.kind == kind]
    return f


def _graphs(name: str, n: int, seconds: float, causes=(), hits: int = 0, tag: str = ""):
    return tuple(GraphRecord(f"{tag}{name}{i}".ljust(64, "0"), name, "jax", 1.0, 1.0,
                             compiles=1, compile_seconds_total=seconds, cache_hits=hits,
                             causes=causes) for i in range(n))


def _snap(graphs: tuple[GraphRecord, ...], uptime: float, steps: StepsReading | None = None):
    total = sum(g.compile_seconds_total for g in graphs)
    ct = DistributionReading("CompileTime", Unit.TIME_NS, len(graphs), total * 1e9,
                             0.005e9, 2e9)
    return Snapshot(0.0, JAX, graphs=graphs, distributions=(ct,), uptime_seconds=uptime,
                    steps=steps)


def _first(line: str) -> tuple[RecompileCause, ...]:
    return (RecompileCause(0.5, FIRST_CALL, f"/w/{line}"),)


# eqx_rnn's saved run (hooked3): 37 single-op graphs 831 ms, jax.random's
# init at 6 shapes 772 ms, the step 742 ms, in a 6.9 s run of 1,500 steps.
EAGER = _graphs("jit(add)", 37, 0.0225)
INIT = _graphs("jit(_uniform)", 6, 0.129)
STEP = _graphs("jit(make_step)", 1, 0.742, _first("prog.py:98"))
LOOP = StepsReading(1500, "inferred", "jit(make_step)", 3.0)


def test_a_step_compiled_under_a_second_is_named_with_the_setting_to_lower():
    # Before: "see the eager_ops finding (... a compilation cache would not
    # remove these)" only: the other 70% of compiling went unnamed.
    s = _snap(EAGER + INIT + STEP + _graphs("jit(scan)", 2, 0.043), 6.9, LOOP)
    assert not [f for f in find(s) if f.kind == "slow_compile"]  # under a second
    f = _one(s, "compile_share")
    assert ("jit(_uniform) 774 ms in 6 graphs, jit(make_step) 742 ms, jit(scan) 86 ms in "
            "2 graphs, 1.6 s in all: the persistent compilation cache would load them next "
            "run: jax.config.update('jax_compilation_cache_dir', DIR), and set "
            f"{RULE} to 0 (by default it keeps only compiles of 1.0 s or more)"
            in f.message), f.message
    assert "eager code's 37 single-op graphs 832 ms (see eager_ops)" in f.message
    assert f.message.index("jit(make_step)") < f.message.index("eager code")  # larger first
    assert "would not remove" not in f.message  # set to 0, it loads those too
    assert len(f.message) <= MESSAGE_CHARS


def test_a_graph_slow_compile_names_is_pointed_at_not_said_again():
    # nnx_mnist: slow_compile said jit(train_step)'s 1.5 s with the cache;
    # compile_share said the cache would load it again.
    step = _graphs("jit(train_step)", 1, 1.5, _first("prog.py:131"))
    init = _graphs("jit(_truncated_normal)", 4, 0.37)
    s = _snap(_graphs("jit(mul)", 65, 0.03) + step + init, 18.0,
              StepsReading(600, "inferred", "jit(train_step)", 10.0))
    assert _one(s, "slow_compile")
    f = _one(s, "compile_share")
    assert "jit(train_step) 1.5 s (see slow_compile)" in f.message, f.message
    assert "jit(_truncated_normal) 1.5 s in 4 graphs: the persistent compilation cache would " \
           "load them next run" in f.message, f.message
    assert f.message.count("jit(train_step)") == 1


def test_recompiles_are_their_findings_not_the_cache():
    # Shapes that change (a short last batch here; lengths that differ each
    # run elsewhere) would not repeat across runs: their finding's advice.
    short = RecompileCause(2.0, "argument 'batch' changed f32[32,128] -> f32[17,128]",
                           "/w/train.py:40", "batch", "f32[32,128]", "f32[17,128]")
    step = (_graphs("jit(update)", 1, 0.3, _first("train.py:40"))
            + _graphs("jit(update)", 1, 0.3, (short,), tag="b"))
    s = _snap(step + _graphs("jit(_normal)", 3, 0.4), 4.0)
    f = _one(s, "compile_share")
    assert "jit(update) 600 ms in 2 compiles (see recompile_short_last_batch)" in f.message
    assert "jit(_normal) 1.2 s in 3 graphs: the persistent compilation cache" in f.message
    # The recompiles alone: no cache advice at all.
    g = _one(_snap(step * 3, 1.0), "compile_share")
    assert "persistent compilation cache" not in g.message, g.message


def test_the_cache_on_already_is_told_to_keep_the_short_compiles():
    loaded = _graphs("jit(train_step)", 1, 0.02, hits=1)
    s = _snap(loaded + _graphs("jit(_uniform)", 6, 0.3), 5.0)
    f = _one(s, "compile_share")
    assert (f"the persistent compilation cache is on (1 graph loaded) but by default it keeps "
            f"only compiles of 1.0 s or more: set {RULE} to 0 to load them next run too"
            in f.message), f.message
    assert "jax.config.update" not in f.message


def test_compiles_of_two_seconds_and_more_need_no_setting():
    s = _snap(_graphs("jit(step)", 1, 3.0) + _graphs("jit(eval)", 2, 2.5), 12.0)
    f = _one(s, "compile_share")
    assert f.message.endswith("jit(eval) 5.0 s in 2 graphs, jit(step) 3.0 s, 8.0 s in all: "
                              "the persistent "
                              "compilation cache would load them next run: jax.config.update("
                              "'jax_compilation_cache_dir', DIR)."), f.message


def test_many_parts_and_long_names_keep_the_advice_whole():
    # jax_mnist: five parts; the cache's part names fewer functions, never
    # cutting its advice at the report's limit.
    long = "jit(_a_rather_long_initializer_function_name_for_a_layer)"
    short = RecompileCause(2.0, "argument 'batch' changed f32[32,128] -> f32[17,128]",
                           "/w/train.py:40", "batch", "f32[32,128]", "f32[17,128]")
    graphs = (EAGER + _graphs(long, 3, 0.3) + _graphs(long.replace("a_", "b_"), 2, 0.2)
              + _graphs("jit(update)", 1, 0.3, _first("train.py:40"))
              + _graphs("jit(update)", 1, 0.3, (short,), tag="b")
              + _graphs("jit(train_step)", 1, 1.5, _first("train.py:80"), tag="c")
              + sum((_graphs(f"jit(f{i})", 1, 0.05) for i in range(9)), ()))
    s = _snap(graphs, 6.0, StepsReading(400, "inferred", "jit(update)", 3.0))
    f = _one(s, "compile_share")
    assert len(f.message) <= MESSAGE_CHARS, len(f.message)
    assert (f"the persistent compilation cache would load them next run: jax.config.update("
            f"'jax_compilation_cache_dir', DIR), and set {RULE} to 0" in f.message), f.message
    for part in ("jit(train_step) 1.5 s (see slow_compile)", "37 single-op graphs 832 ms (see eager_ops)",
                 "jit(update) 600 ms in 2 compiles (see recompile_short_last_batch)"):
        assert part in f.message, f.message
