"""slow_compile's advice from what was recorded (issue 41): IconShop's
torch.compile(dynamic=True, fullgraph=True) of a 2-Linear MLP took 10.8 s to
compile against 120 ms for all 160 compiled steps and was called "a large
graph" with the cache as its advice; nanoGPT's graph came from a warm cache
(a backend cache hit) and was told to keep the cache warm. A graph is large
only by a measured size, the cache is offered only where it did not answer,
and a compile longer than every step that ran it says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from tpu_info.contract import catalog
from tpu_info.contract.model import (
    FIRST_CALL,
    DistributionReading,
    Event,
    EventKind,
    GraphRecord,
    ProcessRecord,
    RecompileCause,
    Severity,
    Snapshot,
    StepsReading,
    Unit,
)
from tpu_info.views.compile_parts import cache_words
from tpu_info.views.cost import cost_of
from tpu_info.views.findings import find
from tpu_info.views.recompile_groups import recompile_severity

ROOT = Path(__file__).resolve().parents[3]

# IconShop's test_train.py, shortened: a 2-Linear MLP compiled with
# dynamic=True, fullgraph=True; 32 Adam steps on small batches.
ICONSHOP = textwrap.dedent('''
    import json
    import metrics
    metrics.install(engines=["torch_compile"], serve=False)
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = torch.compile(nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1)),
                          mode="default", dynamic=True, fullgraph=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(32 * 16, 10), torch.randn(32 * 16, 1)
    total = 0.0
    for i in range(32):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x[i * 16:(i + 1) * 16]), y[i * 16:(i + 1) * 16])
        loss.backward()
        opt.step()
        total += loss.item()
    from tpu_info.wire.fillers import snapshot_to_proto
    print(json.dumps({"proto": snapshot_to_proto(metrics.snapshot()).SerializeToString().hex()}))
''')


@pytest.mark.slow
def test_a_compile_longer_than_all_its_steps_says_so_and_calls_no_graph_large(tmp_path):
    pytest.importorskip("torch")
    from tpu_info.proto import tpu_info_v1_pb2 as pb
    from tpu_info.wire.codec import snapshot_from_proto

    prog = tmp_path / "test_train.py"
    prog.write_text(ICONSHOP)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),  # cold, as a first run
               TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"))
    r = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    s = snapshot_from_proto(pb.Snapshot.FromString(bytes.fromhex(
        json.loads(r.stdout.splitlines()[-1])["proto"])))
    (f,) = [f for f in find(s) if f.kind == "slow_compile"]
    # Main before: "a large graph. Keep Inductor's FX graph cache warm ...".
    assert "large graph" not in f.message, f.message
    assert "more than all 32 steps that ran it took" in f.message, f.message
    assert "run it eagerly (no torch.compile)" in f.message
    assert "only the part where the time goes" in f.message


def _graph(engine: str, executions: int, hits: int) -> GraphRecord:
    return GraphRecord("h1", "compile(GPT.forward)", engine, 999.0, 1010.0, compiles=1,
                       compile_seconds_total=2.7, compile_seconds_last=2.7, cache_hits=hits,
                       executions=executions,
                       causes=(RecompileCause(999.0, FIRST_CALL, "/w/train.py:224"),))


STEPS = StepsReading(301, "inferred", seconds_total=3.9, first_unix=1000.0, last_unix=1004.0)


def test_a_graph_the_cache_answered_is_not_told_to_keep_the_cache_warm() -> None:
    # nanoGPT: its evaluation's graph (160 calls, not every step's) loaded from
    # Inductor's warm cache in 2.7 s; the run took 10.2 s.
    s = Snapshot(1010.0, uptime_seconds=10.2, steps=STEPS,
                 graphs=(_graph("torch_compile", 160, hits=1),))
    (f,) = [f for f in find(s) if f.kind == "slow_compile"]
    assert "Keep Inductor's FX graph cache warm" not in f.message, f.message
    assert "large graph" not in f.message
    assert "cache answered it already (1 cache hit)" in f.message
    assert "eagerly" not in f.message  # 3.9 s of steps: a compile of 2.7 s can pay back
    # Without the hit, the cache is the advice (as before).
    cold = Snapshot(1010.0, uptime_seconds=10.2, steps=STEPS,
                    graphs=(_graph("torch_compile", 160, hits=0),))
    (g,) = [f for f in find(cold) if f.kind == "slow_compile"]
    assert "Keep Inductor's FX graph cache warm" in g.message and "large graph" not in g.message


def test_a_jitted_step_compiled_longer_than_its_steps_keeps_jax_advice() -> None:
    short = StepsReading(301, "marked", seconds_total=0.5, first_unix=1000.0, last_unix=1000.5)
    s = Snapshot(1010.0, uptime_seconds=10.2, steps=short, graphs=(_graph("jax", 301, 0),))
    (f,) = [f for f in find(s) if f.kind == "slow_compile"]
    assert "more than all 301 steps that ran it took (500 ms" in f.message, f.message
    assert "(5.4x the step loop's 500 ms without its compiles; 26% of run time" in f.message
    assert "torch.compile" not in f.message and "persistent compilation cache" in f.message


def _step_graph(seconds: float) -> GraphRecord:
    return GraphRecord("h2", "jit(make_step)", "jax", 1001.0, 1004.0, compiles=1,
                       compile_seconds_total=seconds, compile_seconds_last=seconds,
                       executions=1500,
                       causes=(RecompileCause(1001.0, FIRST_CALL, "/w/prog.py:98"),))


def test_a_compile_is_weighed_against_the_loop_the_user_waits_for_not_the_imports() -> None:
    # eqx_rnn (issue 41 re-run): make_step's 1.3 s compile beside a loop of
    # 3.0 s went unsaid (a 2 s bar); nnx_mnist's 3.0 s beside a 22 s loop too
    # (under 10% of a 35 s run that imports and sets up for 10 s).
    loop = StepsReading(1500, "inferred", "jit(make_step): ...", seconds_total=4.3,
                        first_unix=1001.0, last_unix=1005.3, compile_steps=1,
                        compile_seconds=1.3)
    s = Snapshot(1006.0, uptime_seconds=8.2, steps=loop, graphs=(_step_graph(1.3),))
    (f,) = [f for f in find(s) if f.kind == "slow_compile"]
    assert "jit(make_step) at prog.py:98 took 1.3 s to compile once" in f.message, f.message
    assert "as long as 43% of the step loop, 3.0 s without its compiles" in f.message
    assert "persistent compilation cache" in f.message
    long_run = StepsReading(600, "inferred", "jit(make_step): ...", seconds_total=25.0,
                            first_unix=1001.0, last_unix=1026.0, compile_steps=1,
                            compile_seconds=3.0)
    s = Snapshot(1036.0, uptime_seconds=35.0, steps=long_run, graphs=(_step_graph(3.0),))
    assert [f for f in find(s) if f.kind == "slow_compile"]
    # Not said: under a second, or under a tenth of a long loop.
    s = Snapshot(1006.0, uptime_seconds=8.2, steps=loop, graphs=(_step_graph(0.9),))
    assert not [f for f in find(s) if f.kind == "slow_compile"]
    hour = StepsReading(1500, "inferred", "jit(make_step): ...", seconds_total=3600.0,
                        first_unix=1001.0, last_unix=4601.0, compile_steps=1,
                        compile_seconds=3.0)
    s = Snapshot(4602.0, uptime_seconds=3610.0, steps=hour, graphs=(_step_graph(3.0),))
    assert not [f for f in find(s) if f.kind == "slow_compile"]


# equinox's diffusion example: 11 jit(_uniform) graphs at start-up (one per
# parameter shape, 0.33 s each, none a recompile), then 200 steps of a step
# compiled once. Said before as "compiled 11 times, no cause", cost 0, no line.
_INIT = "/w/diffusion.py:160"


def _uniforms(n: int, each: float = 0.33) -> tuple[tuple[GraphRecord, ...], tuple[Event, ...]]:
    graphs = tuple(GraphRecord(f"{i:02d}" * 32, "jit(_uniform)", "jax", 990.0 + i, 990.0 + i,
                               compiles=1, compile_seconds_total=each, compile_seconds_last=each)
                   for i in range(n))
    events = tuple(Event(i + 1, g.first_seen_unix + each, EventKind.COMPILE, g.name, g.hash,
                         f"called from init() at {_INIT}", _INIT, each)
                   for i, g in enumerate(graphs))
    return graphs, events


def _diffusion(n: int, uptime: float, each: float = 0.33) -> Snapshot:
    graphs, events = _uniforms(n, each)
    steps = StepsReading(200, "marked", seconds_total=uptime - 12.0, first_unix=1002.0,
                         last_unix=990.0 + uptime)
    total = n * each
    return Snapshot(990.0 + uptime, uptime_seconds=uptime, steps=steps, events=events,
                    process=ProcessRecord(pid=1, name="diffusion.py", engine="jax"),
                    distributions=(DistributionReading(
                        catalog.COMPILE_TIME, Unit.TIME_NS, n, total * 1e9, each * 1e9,
                        each * 1e9),), graphs=graphs)


def test_a_function_compiled_once_per_shape_costs_its_whole_compile_time_at_its_line() -> None:
    s = _diffusion(11, uptime=14.0)
    found = find(s)
    assert not [f for f in found if f.kind == "recompile_no_cause"], found
    (f,) = [f for f in found if f.kind == "compile_per_shape"]
    assert f.location == _INIT and f.seconds_lost == pytest.approx(11 * 0.33)
    assert "jit(_uniform) compiled 11 graphs from diffusion.py:160, one per shape" in f.message
    assert "pad or bucket those shapes" in f.message, f.message
    # compile_share's own cache words: 0.33 s graphs are kept only with the bar lowered.
    assert cache_words("jax", list(s.graphs), 0) in f.message
    assert "set jax_persistent_cache_min_compile_time_secs to 0" in f.message
    # Severity by the recompile findings' rule: one-off work, a quarter of the
    # run and 5 s before it warns.
    c = cost_of(s, f.seconds_lost, 11, phase=f.phase)
    assert f.severity == recompile_severity(c, expected=False) == Severity.INFO
    (share,) = [f for f in found if f.kind == "compile_share"]
    assert "(see compile_per_shape)" in share.message, share.message
    assert "jax_compilation_cache_dir" not in share.message  # said once, in the finding
    (big,) = [f for f in find(_diffusion(11, uptime=14.0, each=0.9))
              if f.kind == "compile_per_shape"]
    assert big.severity == Severity.WARNING, big


def test_few_shapes_or_a_told_recompile_are_not_compile_per_shape() -> None:
    assert not [f for f in find(_diffusion(4, uptime=14.0)) if f.kind == "compile_per_shape"]
    s = _diffusion(11, uptime=14.0)
    again = (replace(s.graphs[0], compiles=2, compile_seconds_total=0.66),) + s.graphs[1:]
    assert not [f for f in find(replace(s, graphs=again)) if f.kind == "compile_per_shape"]


# The diffusion example's start-up on real JAX: jax.random.uniform once per
# parameter shape (a library's jitted _uniform, a graph for each), then steps.
INIT_PER_SHAPE = textwrap.dedent('''
    import json
    import metrics
    metrics.install(engines=["jax"], serve=False)
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(0)
    params = [jax.random.uniform(key, (i + 1, 3)) for i in range(11)]  # INIT
    step = jax.jit(lambda x: x * 2)
    x = jnp.ones(3)
    for _ in range(20):
        x = step(x)
    from tpu_info.wire.fillers import snapshot_to_proto
    print(json.dumps({"proto": snapshot_to_proto(metrics.snapshot()).SerializeToString().hex()}))
''')


@pytest.mark.slow
def test_a_library_function_compiled_per_shape_on_real_jax(tmp_path):
    pytest.importorskip("jax")
    from tpu_info.proto import tpu_info_v1_pb2 as pb
    from tpu_info.wire.codec import snapshot_from_proto

    prog = tmp_path / "init.py"
    prog.write_text(INIT_PER_SHAPE)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"))
    r = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    s = snapshot_from_proto(pb.Snapshot.FromString(bytes.fromhex(
        json.loads(r.stdout.splitlines()[-1])["proto"])))
    uniform = [g for g in s.graphs if g.name == "jit(_uniform)"]
    assert len(uniform) == 11 and all(g.compiles == 1 for g in uniform), uniform
    found = find(s)
    assert not [f for f in found if f.kind == "recompile_no_cause"], found
    (f,) = [f for f in found if f.kind == "compile_per_shape"]
    line = next(n for n, text in enumerate(INIT_PER_SHAPE.splitlines(), 1) if "# INIT" in text)
    assert f.location is not None and f.location.endswith(f"init.py:{line}"), f
    assert f.seconds_lost == pytest.approx(sum(g.compile_seconds_total for g in uniform))
    assert f"jit(_uniform) compiled 11 graphs from init.py:{line}" in f.message, f.message
