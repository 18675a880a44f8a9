"""The torch_xla clinic (examples/clinic_xla.py) in torch_xla's own venv.

Run with the hook installed before ``import torch_xla``, after it, and
unchanged under ``tpu-info run`` (the venv's python runs our CLI from the
source tree); each marked mistake must be named with its line (where the
engine can see one) and a cost, the warm-up stays "not a problem", and the
evaluation at another batch size is not called a short last batch.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import patient
from tests.metrics.engines.torch.test_torch_xla import xla_python
from tests.system.test_clinic_torch import findings_of, mistake_lines

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "clinic_xla.py"
LINES = mistake_lines(EXAMPLE)

pytestmark = pytest.mark.slow


def _run(mode: str, tmp: Path) -> list[tuple[str, str]]:
    py = xla_python()
    env = dict(os.environ, PJRT_DEVICE="CPU", PYTHONPATH=str(ROOT), TPU_INFO_PORT="0",
               TPU_INFO_RUNTIME_DIR=str(tmp))
    for var in ("PT_XLA_DEBUG_LEVEL", "PT_XLA_DEBUG_FILE", "PT_XLA_DEBUG"):
        env.pop(var, None)
    args = [str(EXAMPLE), "--report", "--epochs", "1"]
    cmd = ([py, "-m", "tpu_info", "run", "--", py, *args, "--install", "none"]
           if mode == "run" else [py, *args, "--install", mode])
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=patient(240))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "could not install" not in r.stderr, r.stderr[-2000:]
    return findings_of(r.stdout)


@pytest.fixture(scope="module", params=["first", "after", "run"])
def clinic(request, tmp_path_factory):
    return _run(request.param, tmp_path_factory.mktemp(f"xla-{request.param}"))


def _at(found: list[tuple[str, str]], kind: str, line: int) -> list[str]:
    return [m for k, m in found if k == kind and f"clinic_xla.py:{line}" in m]


def test_every_mistake_is_marked():
    assert set(LINES) == {"short_last_batch", "value_before_sync", "per_step_transfer",
                          "cpu_fallback", "eval_shape"}


def test_value_reads_before_sync_named_with_their_lines(clinic):
    for line in (LINES["value_before_sync"], LINES["cpu_fallback"]):  # .item(), nonzero
        (msg,) = _at(clinic, "value_access_before_sync", line)
        assert "extra graph" in msg and "Move the .item()" in msg
    assert not any("warm-up" in m and "not a problem" in m and
                   f"clinic_xla.py:{LINES['value_before_sync']}" in m for _, m in clinic)


def test_short_last_batch_is_a_new_shape_at_the_sync_line(clinic):
    # torch_xla compiles at the sync after the line that built the graph.
    lines = EXAMPLE.read_text().splitlines()
    sync_line = next(n for n in range(LINES["short_last_batch"], len(lines))
                     if "torch_xla.sync()" in lines[n - 1])
    (msg,) = _at(clinic, "recompile_new_input_shapes", sync_line)
    assert "short last batch" in msg and "at sync 7" in msg and "ms/step" in msg
    assert "drop_last=True" in msg and "warm-up" not in msg


def test_warm_up_stays_normal(clinic):
    (msg,) = [m for k, m in clinic if k == "warm_up"]
    assert "not a problem" in msg and "1 new graph" in msg


def test_per_step_transfers_counted_and_attributed_honestly(clinic):
    (msg,) = [m for k, m in clinic if k == "per_step_sync"]
    assert "per step" in msg and "carry no source lines" in msg
    assert f"clinic_xla.py:{LINES['value_before_sync']}" in msg  # the reads it can place
    assert f"clinic_xla.py:{LINES['per_step_transfer']}" not in msg  # .cpu(): no line seen


def test_cpu_fallback_named(clinic):
    (msg,) = [m for k, m in clinic if k == "cpu_fallback"]
    assert "aten::nonzero" in msg and "7 times" in msg


def test_eval_batch_size_is_not_a_short_last_batch(clinic):
    eval_lines = (LINES["eval_shape"], LINES["eval_shape"] + 1)  # the call and its sync
    for _kind, msg in clinic:
        if any(f"clinic_xla.py:{n}" in msg for n in eval_lines):
            assert "short last batch" not in msg and "Pad" not in msg, msg
        assert "no cause recorded" not in msg, msg


ANALYSIS_RACE = r"""
import os, torch, torch_xla
import metrics
metrics.install()
(eng,) = [e for e in metrics.installed_engines() if e.name == "torch_xla"]
dev = torch_xla.device()
x = torch.ones(4, device=dev) * 2
torch_xla.sync()
metrics.snapshot()
# torch_xla writes a block before it compiles: one whose CompileTime sample is not there yet.
early = '''Compilation Analysis: ================================================================================
Compilation Analysis: Compilation Cause
Compilation Analysis:   user torch_xla.sync
Compilation Analysis: Graph Info:
Compilation Analysis:   Graph Hash: 00000000000000000000000000000abc
Compilation Analysis:   Number of Graph Inputs: 1
Compilation Analysis:   Number of Graph Outputs: 1
Compilation Analysis: Python Frame Triggered Execution:
Compilation Analysis:   <module> (/home/me/train.py:9)
Compilation Analysis: --------------------------------------------------------------------------------
Compilation Analysis: ================================================================================
'''
with open(os.environ["PT_XLA_DEBUG_FILE"], "a") as f:
    f.write(early)
waiting = [g.hash for g in metrics.snapshot().graphs]
y = torch.ones(8, device=dev) + 3
torch_xla.sync()
g = {g.hash: g for g in metrics.snapshot().graphs}
print("waited", "00000000000000000000000000000abc" not in waiting)
print("timed", g["00000000000000000000000000000abc"].compile_seconds_total > 0)
"""


def test_analysis_waits_for_its_compile_time_sample(tmp_path):
    """A compile analysis read before torch_xla recorded that compile's time waits
    for it (read at once it got 0 s and no sync, so a graph's warm-up read as new
    shapes in pytorch/xla's test_train_mp_mnist.py under a 1 s scrape)."""
    env = dict(os.environ, PJRT_DEVICE="CPU", PYTHONPATH=str(ROOT), TPU_INFO_PORT="0",
               TPU_INFO_RUNTIME_DIR=str(tmp_path))
    for var in ("PT_XLA_DEBUG_LEVEL", "PT_XLA_DEBUG_FILE", "PT_XLA_DEBUG"):
        env.pop(var, None)
    r = subprocess.run([xla_python(), "-c", ANALYSIS_RACE], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=patient(120))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "waited True" in r.stdout and "timed True" in r.stdout, r.stdout
