"""The Graphs and Findings panels in a real terminal (tmux, 160x45) against a
real hooked JAX program that builds its parameters with ``jax.random`` (JAX
compiles its own set-up graphs for that) and recompiles its step for a short
batch: the step is on top, JAX's set-up graphs sit below their own line, ↻
marks only the recompile, ``g`` shows its cause, and the recompile finding is
in view without scrolling."""

from __future__ import annotations

import os
import re

import pytest

from tests.conftest import ROOT
from tests.tui.test_tui_tmux import (  # noqa: F401 - tmux_bin is the fixture
    Pane,
    start_program,
    tmux_bin,
    watch_script,
)

pytestmark = pytest.mark.slow

GRAPH_ROW = re.compile(r"│[0-9a-f]{8}  (\S+(?: \S+)?)\s{2,}")
PROGRAM = r"""
import sys, jax, jax.numpy as jnp, metrics
metrics.install()
key = jax.random.PRNGKey(0)
w = jax.random.normal(key, (4, 4))
@jax.jit
def train_step(w, batch):
    return w - 0.01 * (batch @ w).mean()
for n in [32] * 50 + [31]:
    w = train_step(w, jnp.ones((n, 4)))
    metrics.mark_step()
print(metrics.exporter().address, flush=True)
sys.stdin.read()
"""


def test_graphs_and_findings_against_a_real_program(tmux_bin, tmp_path):  # noqa: F811
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"),
               TPU_INFO_PORT="0", JAX_PLATFORMS="cpu")
    prog = start_program(PROGRAM, env)
    pane = None
    try:
        pane = Pane(tmux_bin, watch_script(tmp_path, env, 0.5), width=160, height=45)
        shown = pane.wait_for(lambda t: "library set-up:" in t and "jit(train_step)" in t
                              and "jit(train_step) compiled 2 times" in t)
        rows = [m.group(1) for m in GRAPH_ROW.finditer(shown)]  # names, in order
        assert rows[0].endswith("jit(train_step)"), shown  # the step, costliest, on top
        marked = [i for i, r in enumerate(rows) if r.startswith("↻")]
        assert len(marked) == 1 and rows[marked[0]] == "↻ jit(train_step)", shown
        setup = [i for i, r in enumerate(rows) if r in ("jit(_normal)", "jit(_threefry_split)")]
        assert setup and min(setup) > max(i for i, r in enumerate(rows) if "train_step" in r)
        lines = shown.splitlines()
        findings_at = next(i for i, ln in enumerate(lines) if "Findings" in ln)
        graphs_at = next(i for i, ln in enumerate(lines) if "Graphs" in ln)
        top = next(ln for ln in lines[findings_at:] if "jit(train_step) compiled 2 times" in ln)
        assert lines.index(top) < graphs_at  # the finding is in view, above the graphs
        pane.keys(*["down"] * marked[0], "g")  # the recompile: its cause one key away
        detail = pane.wait_for(lambda t: "Compile causes" in t)
        assert "argument 'batch' changed f32[32,4] -> f32[31,4]" in detail, detail
        pane.keys("q")
    finally:
        if pane is not None:
            pane.close()
        if prog.poll() is None:
            prog.kill()
        prog.wait(timeout=30)
