"""A numpy batch passed straight into a jitted function each step: JAX moves
it in C++, so the jit wrapper counts every copy and times a sample of them
itself (its first 64, then one in 256: issue 41 item 4), and the cost is that
sample scaled to every copy, saying what it stands on ("timed 64 of 200
transfers: ... GB/s to the device"; a copy that compiled is
no sample), never an assumed rate; named with its
line, per-step count, bytes per step and share of step in the findings, the
report, the CLI table and the JSON; a one-off copy stays quiet. Real JAX on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpu_info.views.cost import size_words

ROOT = Path(__file__).resolve().parents[2]

# A batch whose copy (3.2 MB, strided so the CPU backend cannot alias it) stands
# clear of the calls' noise on a loaded machine (128 contiguous rows, which the CPU
# may use in place, measured 1-27 us a step, and 1 run in 4 none at all at load 5).
BATCH = 1024
PROGRAM = '''
import json, sys
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp, numpy as np
from tpu_info.outputs.jsonview import to_json
from tpu_info.outputs.render import render_text
from tpu_info.outputs.textreport import metrics_report
from tpu_info.views.findings import find
from tpu_info.views.values import Header, TargetView

@jax.jit
def update(w, batch):
    x, y = batch
    return w - 0.01 * jnp.mean((x @ w - y) ** 2)

@jax.jit
def once(a):
    return a.sum()

BATCH = int(sys.argv[2])
w = jnp.ones((784, 10))
x = np.ones((BATCH, 800), np.float32)[:, :784]  # a strided view: JAX copies it (a
y = np.ones((BATCH, 10), np.float32)          # contiguous array the CPU may alias)
once(np.ones((2048, 1024), np.float32)).block_until_ready()  # the one-off copy
for i in range(200):
    w = update(w, (x, y))  # the per-step copy
w.block_until_ready()
if sys.argv[1] == "timed":  # explicit, timed puts give this program's own rate
    for i in range(20):  # as many as a rate needs (views.sites.MIN_TIMED_TRANSFERS)
        jax.device_put(np.ones((512, 1024), np.float32)).block_until_ready()

def show(f):
    return {k: getattr(f, k) for k in ("kind", "location", "count", "per_step",
            "bytes_per_step", "seconds_per_step", "share_of_step", "cost_estimated",
            "message")}

s = metrics.snapshot()
view = [TargetView("127.0.0.1:1", s)]
head = Header(host="h", time_unix=0.0)
print(json.dumps({
    "findings": [show(f) for f in find(s) if f.kind == "per_step_implicit_transfer"],
    "report": metrics_report(s),
    "cli": render_text(view, 400, header=head),
    "json": [f for f in to_json(view, header=head)["targets"][0]["findings"]
             if f["kind"] == "per_step_implicit_transfer"],
}))
'''


def _run(tmp_path: Path, mode: str) -> tuple[dict, int]:
    prog = tmp_path / "numpy_batch.py"
    prog.write_text(PROGRAM)
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
               TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"))
    r = subprocess.run([sys.executable, str(prog), mode, str(BATCH)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(n for n, text in enumerate(PROGRAM.splitlines(), start=1)
                if "# the per-step copy" in text)
    return json.loads(r.stdout.splitlines()[-1]), line


def _check(out: dict, line: int, rate_words: str) -> dict:
    (f,) = out["findings"]  # the per-step copy only: the one-off stays quiet
    assert f["location"].endswith(f"numpy_batch.py:{line}"), f
    # x and y: two transfers a step, as JAX's transfer guard logs them (the
    # compiling call's two JAX moves in one batch: counted once)
    assert f["count"] == 2 * 200 - 1 and f["per_step"] == pytest.approx(2.0, abs=0.01)
    assert f["bytes_per_step"] == BATCH * (784 + 10) * 4
    assert not f["cost_estimated"] and f["seconds_per_step"] > 0 and f["share_of_step"] > 0
    msg = f["message"]
    assert f"numpy argument of jit(update) at numpy_batch.py:{line} copies " in msg
    # the two arrays' sum a step (3.2 MB and 41.0 KB), not their mean
    assert f"copies {size_words(BATCH * (784 + 10) * 4)} in 2 arrays to the device every step " \
        f"(399 times, 2.0 per step, " in msg and "of step time, " in msg
    assert "assumed" not in msg
    assert rate_words in msg, msg
    assert "jax.device_put the whole data set once if it fits" in msg
    assert "double-buffer" not in msg and "Pad or bucket" not in msg
    assert f"  - [per_step_implicit_transfer] {msg[:300]}" in out["report"]  # cut at 500
    cli = "".join(out["cli"].split())  # the table wraps long words over lines
    assert f"numpy_batch.py:{line}copies" in cli and "".join(msg.split())[:200] in cli
    (j,) = out["json"]
    assert j["message"] == msg and j["bytes_per_step"] == f["bytes_per_step"]
    assert not j["cost"].startswith("~") and j["cost_estimated"] is False
    return f


@pytest.mark.slow
def test_numpy_batch_every_step_is_costed_on_its_timed_copies(tmp_path: Path):
    for mode in ("untimed", "timed"):  # the program's own explicit puts change nothing
        out, line = _run(tmp_path, mode)
        # The first 20 calls' copies, then one call's per 20 ms: two leaves a
        # call, a copy that compiled is no sample (40 here)
        _check(out, line, "measured; timed ")
