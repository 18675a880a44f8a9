"""The Graphs and Findings panels in a real terminal (tmux, 160x45) against a
real hooked JAX program that builds its parameters with ``jax.random`` (JAX
compiles its own set-up graphs for that) and recompiles its step for a short
batch: the step is on top, JAX's set-up graphs sit below their own line, ↻
marks only the recompile, ``g`` shows its cause, and the recompile finding is
in view without scrolling."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.tui.test_tui_tmux import Pane, tmux_bin  # noqa: F401 - the fixture

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
    prog = subprocess.Popen([sys.executable, "-c", PROGRAM], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)
    pane = None
    try:
        assert prog.stdout is not None and prog.stdout.readline(), prog.stderr.read()  # type: ignore[union-attr]
        script = tmp_path / "watch.sh"
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()
                          if k in ("PYTHONPATH", "TPU_INFO_RUNTIME_DIR", "PATH", "HOME",
                                   "JAX_PLATFORMS"))
        script.write_text(f"unset COLUMNS LINES\n{exports}cd {shlex.quote(str(ROOT))}\n"
                          f"{shlex.quote(sys.executable)} -m tpu_info --watch --rate 0.5\n"
                          "sleep 60\n")
        pane = Pane(tmux_bin, f"sh {shlex.quote(str(script))}", width=160, height=45)
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
