"""compile_share's parts, each with the advice that fits it (issue 41
re-run): eager code's single-operation graphs point at the eager_ops
finding, and the rest still gets the compilation cache, offered for what
JAX's persistent cache keeps by default (compiles of 1 s or more)."""

from __future__ import annotations

from tpu_info.contract.model import (
    DistributionReading,
    GraphRecord,
    ProcessRecord,
    Snapshot,
    Unit,
)
from tpu_info.views.findings import find

JAX = ProcessRecord(pid=7, name="train.py", engine="jax")


def _one(s: Snapshot, kind: str):
    (f,) = [f for f in find(s) if f.kind == kind]
    return f


def test_a_third_of_compiling_eager_ops_and_the_rest_a_train_step_says_both():
    # nnx_mnist (issue 41 re-run): "see the eager_ops finding" only, the
    # cache advice for the train step's 3.0 s left unsaid. Each part its
    # advice: the eager ops' is the eager_ops finding's (the cache keeps no
    # compile under a second by default); the train step's is the cache.
    tiny = tuple(GraphRecord(f"{i:064x}", "jit(add)", "jax", 1.0, 1.0, compiles=1,
                             compile_seconds_total=0.05) for i in range(40))
    big = (GraphRecord("f" * 64, "jit(train_step)", "jax", 1.0, 1.0, compiles=1,
                       compile_seconds_total=4.0),)
    ct = DistributionReading("CompileTime", Unit.TIME_NS, 41, 6e9, 0.05e9, 4e9)
    s = Snapshot(0.0, JAX, graphs=tiny + big, distributions=(ct,), uptime_seconds=10.0)
    f = _one(s, "compile_share")
    assert "33% of it single-operation graphs of eager code" in f.message
    assert "see the eager_ops finding" in f.message
    assert ("The other 4.0 s: the persistent compilation cache would load jit(train_step) "
            "(4.0 s) next run" in f.message), f.message
    # The rest all under the cache's default bar: no cache advice for it.
    small = (GraphRecord("f" * 64, "jit(train_step)", "jax", 1.0, 1.0, compiles=1,
                         compile_seconds_total=0.8),)
    g = _one(Snapshot(0.0, JAX, graphs=tiny + small, distributions=(ct,),
                      uptime_seconds=10.0), "compile_share")
    assert "see the eager_ops finding" in g.message
    assert "persistent compilation cache" not in g.message, g.message


def test_the_cache_is_offered_for_what_it_keeps_by_default():
    # eqx_rnn: 56 compiles, 3.9 s; JAX's persistent cache keeps only compiles
    # of 1 s or more by default, so "the next run loads them" held for the
    # step's 1.3 s alone: that graph is named, and the setting for the rest.
    once = tuple(GraphRecord(f"{i:064x}", f"jit(f{i})", "jax", 1.0, 1.0, compiles=1,
                             compile_seconds_total=0.1) for i in range(26))
    step = (GraphRecord("f" * 64, "jit(make_step)", "jax", 1.0, 1.0, compiles=1,
                        compile_seconds_total=1.3),)
    ct = DistributionReading("CompileTime", Unit.TIME_NS, 27, 3.9e9, 0.1e9, 1.3e9)
    s = Snapshot(0.0, JAX, graphs=once + step, distributions=(ct,), uptime_seconds=8.2)
    f = _one(s, "compile_share")
    assert "each graph compiled once" in f.message
    assert "the persistent compilation cache would load jit(make_step) (1.3 s) next run" \
        in f.message.lower(), f.message
    assert "jax_persistent_cache_min_compile_time_secs" in f.message
    # None that long: the setting is the advice, not "loads them".
    g = _one(Snapshot(0.0, JAX, graphs=once, distributions=(ct,), uptime_seconds=8.2),
             "compile_share")
    assert "would load" not in g.message
    assert "set jax_persistent_cache_min_compile_time_secs to 0" in g.message, g.message
