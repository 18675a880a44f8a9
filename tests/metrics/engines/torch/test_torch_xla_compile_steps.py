"""torch_xla programs written as torch_xla's own examples are (its venv, PJRT_DEVICE=CPU).

``examples/train_decoder_only_base.py`` in pytorch/xla: ``torch_xla.compile(step_fn)``
under an ``MpDeviceLoader`` (three syncs a step: the loader's, and before and
after the step), Adam (the first step makes its state, so the second step is
a new graph once), and the loss read every N steps in a step closure
(``xm.add_step_closure``, run after the sync: ``torch.isnan(loss).item()``
compiles a small graph of its own). Under ``tpu-info run`` the
hook must count the steps (not the syncs), call the second graph warm-up,
and not tell a read in a step closure to move after the sync.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, patient
from tests.metrics.engines.torch.test_torch_xla import xla_python

pytestmark = pytest.mark.slow

STEPS = 12

PROGRAM = r'''
import itertools, json, os, sys
import torch, torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.utils.utils as xu

STEPS, MODE = int(sys.argv[1]), sys.argv[2]
if MODE != "compiled":  # pytorch/xla's examples/eager/: eager mode, the step compiled or not
    torch_xla.experimental.eager_mode(True)
device = torch_xla.device()
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                            torch.nn.Linear(32, 4)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = torch.nn.CrossEntropyLoss()
data = xu.SampleGenerator(data=(torch.zeros(8, 16), torch.zeros(8, dtype=torch.int64)),
                          sample_count=1000)
loader = pl.MpDeviceLoader(data, device)


def step_fn(x, y):
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def log(step, loss):
    print("step", step, "loss", float(loss))
    assert not torch.isnan(loss).item()  # read in a step closure (a small graph of its own)


compiled = torch_xla.compile(step_fn, full_graph=True, name="step_fn") if MODE != "eager" \
    else step_fn
for step, (x, y) in enumerate(itertools.islice(loader, STEPS)):
    loss = compiled(x, y)  # step line
    if step % 4 == 0:
        xm.add_step_closure(log, args=(step, loss))
xm.wait_device_ops()

import metrics
from tpu_info.views import findings
s = metrics.snapshot()
with open(os.environ["OUT"], "w") as f:
    json.dump({"steps": s.steps.count if s.steps else None,
               "basis": s.steps.basis if s.steps else None,
               "graphs": [[g.name, g.compiles, g.compile_seconds_total] for g in s.graphs],
               "findings": [[x.kind, str(x.severity), x.location, x.message]
                            for x in findings.find(s)]}, f)
'''


def _lines(marker: str) -> int:
    return next(i for i, t in enumerate(PROGRAM.splitlines(), 1) if marker in t)


def _run(tmp_path, mode: str) -> dict:
    prog, out = tmp_path / "train.py", tmp_path / "out.json"
    prog.write_text(PROGRAM)
    env = dict(os.environ, PJRT_DEVICE="CPU", PYTHONPATH=str(ROOT), OUT=str(out),
               TPU_INFO_PORT="0", TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"))
    for var in ("PT_XLA_DEBUG_LEVEL", "PT_XLA_DEBUG_FILE", "PT_XLA_DEBUG"):
        env.pop(var, None)
    r = subprocess.run([sys.executable, "-m", "tpu_info", "run", "--", xla_python(), str(prog),
                        str(STEPS), mode], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=patient(300))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


def test_torch_xla_compile_under_a_device_loader_counts_steps_not_syncs(tmp_path):
    doc = _run(tmp_path, "compiled")
    # Three syncs a step; the steps are the optimizer's (torch_xla's MarkStep reads ~3x).
    assert doc["steps"] == STEPS, doc
    found = {f[0]: f for f in doc["findings"]}
    step_line, read_line = _lines("# step line"), _lines("# read in a step closure")
    warm = found.get("warm_up")
    assert warm is not None and warm[1] == "info" and "not a problem" in warm[3], doc["findings"]
    assert f"train.py:{step_line}" in warm[3]
    # Every compile has its time: none was read before torch_xla recorded it.
    assert all(seconds > 0 for _, _, seconds in doc["graphs"]), doc["graphs"]
    closure = found.get("value_read_in_step_closure")
    assert closure is not None and closure[1] == "info", doc["findings"]
    assert closure[2].endswith(f"train.py:{read_line}") and "Nothing to change" in closure[3]
    for kind, _, _, message in doc["findings"]:
        assert kind not in ("value_access_before_sync", "recompile_new_input_shapes"), message
        assert "Move the .item()" not in message and "drop_last" not in message, message


RACE = r'''
import sys, time
import torch, torch_xla
import torch_xla.debug.metrics as met
from metrics.engines.torch.xla.analyses import CompileAnalyses
from metrics.recording.recorder import Recorder

path = sys.argv[1]
rec = Recorder()
analyses = CompileAnalyses(rec, [], (), {"PT_XLA_DEBUG_FILE": path, "PT_XLA_DEBUG_LEVEL": "1"})
analyses.capture()
assert met.metric_data("CompileTime") is None  # nothing compiled yet
# torch_xla writes a compile's analysis before it compiles: read mid-compile.
with open(path, "a") as f:
    f.write("""Compilation Analysis: ================================================
Compilation Analysis: Compilation Cause
Compilation Analysis:   user mark_step
Compilation Analysis: Graph Info:
Compilation Analysis:   Graph Hash: 00112233
Compilation Analysis:   Number of Graph Inputs: 1
Compilation Analysis:   Number of Graph Outputs: 1
Compilation Analysis: Python Frame Triggered Execution:
Compilation Analysis:   step (/tmp/train.py:7)
Compilation Analysis: ================================================
""")
early = analyses.poll()
x = torch.ones(4, device=torch_xla.device()) * 3
torch_xla.sync()  # the compile the analysis was for
later = analyses.poll()
(g,) = rec.ledger.snapshot()
print(early, later, g.compile_seconds_total > 0)
'''


def test_an_analysis_read_before_its_compile_time_waits_for_it(tmp_path):
    """A scrape in the middle of the first compile reads its analysis before
    torch_xla has any ``CompileTime``: the analysis waits (it used to be taken
    at once, with no compile time and no step, and the next graph at that
    line was then judged by a guess)."""
    env = dict(os.environ, PJRT_DEVICE="CPU", PYTHONPATH=str(ROOT))
    for var in ("PT_XLA_DEBUG_LEVEL", "PT_XLA_DEBUG_FILE", "PT_XLA_DEBUG"):
        env.pop(var, None)
    debug = tmp_path / "debug.txt"
    debug.write_text("")
    r = subprocess.run([xla_python(), "-c", RACE, str(debug)], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=patient(240))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-3:] == ["0", "1", "True"], r.stdout


@pytest.mark.parametrize("mode, severity", [("eager", "warning"), ("eager+compile", "info")])
def test_eager_mode_is_told_to_compile_the_step_only_where_the_step_runs_eagerly(
        tmp_path, mode, severity):
    """pytorch/xla's examples/eager/: the step run op by op is told to compile
    it; the step compiled with eager mode around it is told nothing to change."""
    doc = _run(tmp_path, mode)
    assert doc["steps"] == STEPS, doc
    (eager,) = [f for f in doc["findings"] if f[0] == "xla_eager_mode"]
    assert eager[1] == severity, eager
    assert ("torch_xla.compile(step_fn)" in eager[3]) == (severity == "warning"), eager
    assert not any(f[0] == "value_access_before_sync" for f in doc["findings"]), doc["findings"]
