"""When one-off compile work happens and how it is said (issue 41): the
same eager op compiling again inside the loop's one compile step is once,
never "every N steps"; the graphs one line compiled once are one
``slow_compile``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.tpu_info.views.test_phases import LOOP
from tpu_info.contract.model import Snapshot
from tpu_info.contract.phases import Phase, bursts_phase
from tpu_info.views.findings import find


def test_ops_compiling_again_within_the_loops_compile_step_are_once() -> None:
    # An eager Adam in the loop's first step compiles add and multiply once per
    # parameter shape: the same op at the same line again, two bursts 0.3 s
    # apart, within the 1.6 s that step held compiles; the loop ran on 4 s
    # (issue 41: "every 160 steps ... a warning"): once.
    loop = replace(LOOP, seconds_total=5.5, last_unix=1005.5, compile_steps=1,
                   compile_seconds=1.6)
    ops = [f"jit({op}) /w/train.py:24 " for op in ("add", "multiply")] * 5
    first = [1000.5 + 0.04 * i for i in range(10)]
    second = [1001.2 + 0.04 * i for i in range(10)]
    assert bursts_phase(first + second, loop, [0.03] * 20, ops + ops) == (Phase.ONCE, 2)
    # The same two passes later in the loop, each with its new shapes: they recur.
    later = [t + 2.0 for t in first + second]
    assert bursts_phase(later, loop, [0.03] * 20, ops + ops)[0] == Phase.PERIODIC


def test_the_graphs_one_line_compiled_once_are_one_slow_compile() -> None:
    # A torch.compile'd model split by graph breaks compiles its pieces at its
    # first call, each a first compile: PyG's GAT's 39 s first step was said
    # as six findings, the largest 14.5 s. One finding, all of that line's.
    from tpu_info.contract.model import FIRST_CALL, GraphRecord, RecompileCause

    def graph(h: str, name: str, seconds: float) -> GraphRecord:
        return GraphRecord(h, name, "torch_compile", 1000.5, 1009.0, compiles=1,
                           compile_seconds_total=seconds, compile_seconds_last=seconds,
                           causes=(RecompileCause(1000.5, FIRST_CALL, "/w/train.py:167"),))

    parts = (graph("h1", "compile(GAT.forward)", 9.0), graph("h2", "compile(GAT.forward@40)",
                                                             6.0),
             graph("h3", "compile(GAT.forward@52)", 0.5))
    s = Snapshot(1011.0, uptime_seconds=60.0, steps=LOOP, graphs=parts)
    (f,) = [f for f in find(s) if f.kind == "slow_compile"]
    assert f.location == "/w/train.py:167"
    assert f.message.startswith("3 graphs (compile(GAT.forward), compile(GAT.forward@40), "
                                "compile(GAT.forward@52); the largest 9.0 s) at train.py:167 "
                                "took 15.5 s to compile once"), f.message
    assert f.seconds_lost == pytest.approx(15.5)
