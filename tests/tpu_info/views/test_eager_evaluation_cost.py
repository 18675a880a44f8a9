"""An un-jitted evaluation of the whole training set after each epoch, then
a print of its result (jax examples' mnist_classifier.py and
mnist_classifier_fromscratch.py: ``accuracy()`` of 60,000 rows, eager). Their
evaluation held 24% and 33% of the loop (A/B without it, steps timed from
epoch 1, in the second evaluation of third-party programs). Nothing was
said per epoch: the eager ops JAX runs in C++ after their first call are not
counted, so the gap's lead is the print's read (``work=logging``), and that
read waits for the evaluation's own device work, which its drain counts as
the steps' queued work "which runs either way" (mnist_classifier: 4.5 s of
waiting, 2.8 ms of drain). What is asked: a periodic finding at the
evaluation's or the print's line, costed near the evaluation's own time.
Real JAX on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by
from tpu_info.views.findings import find

EPOCHS = 8

# mnist_classifier_fromscratch's shape, smaller: a numpy data set, a jitted
# update on numpy batches, an eager accuracy() of the whole set each epoch.
PROGRAM = """
import json, sys, time
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp, numpy as np
from jax.scipy.special import logsumexp
rng = np.random.default_rng(0)
D, H, N, B = 256, 512, 4000, 128
train_x = rng.standard_normal((N, D)).astype(np.float32)
train_y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, N)]

def predict(params, x):
    (w1, b1), (w2, b2) = params
    h = jnp.tanh(jnp.dot(x, w1) + b1)
    logits = jnp.dot(h, w2) + b2
    return logits - logsumexp(logits, axis=1, keepdims=True)

def loss(params, batch):
    x, y = batch
    return -jnp.mean(jnp.sum(predict(params, x) * y, axis=1))

def accuracy(params, batch):
    x, y = batch
    return jnp.mean(jnp.argmax(predict(params, x), axis=1) == jnp.argmax(y, axis=1))

@jax.jit
def update(params, batch):
    grads = jax.grad(loss)(params, batch)
    return [(w - 1e-3 * dw, b - 1e-3 * db) for (w, b), (dw, db) in zip(params, grads)]

params = [(rng.standard_normal((D, H)).astype(np.float32) * 0.05, np.zeros(H, np.float32)),
          (rng.standard_normal((H, 10)).astype(np.float32) * 0.05, np.zeros(10, np.float32))]
params = jax.tree_util.tree_map(jnp.asarray, params)
# The evaluation's own time, nothing queued before it (its ops compiled first).
jax.block_until_ready(accuracy(params, (train_x, train_y)))
own = []
for _ in range(3):
    t = time.perf_counter()
    jax.block_until_ready(accuracy(params, (train_x, train_y)))
    own.append(time.perf_counter() - t)
with open(OWN_FILE, "w") as f:
    json.dump(sorted(own)[1], f)
for epoch in range(EPOCHS):
    for i in range(N // B):
        s = slice(i * B, (i + 1) * B)
        PER_STEP_OP
        params = update(params, (train_x[s], train_y[s]))  # LINE step
    acc = accuracy(params, (train_x, train_y))  # LINE evaluate
    print(f"epoch {epoch} accuracy {acc}", file=sys.stderr)  # LINE print
jax.block_until_ready(params)
"""


# An eager op every step that waits for nothing (the JAX docs' data-loading
# notebook: ``one_hot(y, k)`` on each numpy batch, ``jnp.arange`` in it):
# the evaluation's ops then come one step index after the last eager op, yet
# they begin the loop's gap (its accuracy() every epoch, 26 % of the run by
# A/B, was said only as its first pass's compiles).
PER_STEP_OPS = {"none": "pass", "one_hot": "labels = jnp.arange(10)"}


@pytest.mark.slow
@pytest.mark.parametrize("per_step", sorted(PER_STEP_OPS))
def test_an_eager_evaluation_each_epoch_is_said_with_its_cost(tmp_path: Path,
                                                              per_step: str) -> None:
    own_file = tmp_path / "own.json"
    source = (PROGRAM.replace("OWN_FILE", repr(str(own_file)))
              .replace("PER_STEP_OP", PER_STEP_OPS[per_step])
              .replace("EPOCHS", str(EPOCHS)) + PRINT_SNAPSHOT)
    lines = {text.rsplit("# LINE ", 1)[1]: n
             for n, text in enumerate(source.splitlines(), start=1) if "# LINE " in text}
    s = snapshot_printed_by(tmp_path, source)
    own = json.loads(own_file.read_text())
    # The evaluation is worth saying (else this test shows nothing): each one
    # takes tens of milliseconds against a step of a few.
    assert own > 0.01, own
    assert s.steps is not None and "update" in s.steps.basis, s.steps
    at = (f":{lines['evaluate']}", f":{lines['print']}")
    said = [f for f in find(s) if f.phase == "periodic" and (f.location or "").endswith(at)]
    assert said, [(f.kind, f.location, f.message[:160]) for f in find(s)]
    # Costed near the evaluation's own time (it runs EPOCHS times; generous:
    # a third of it at least, on a shared machine).
    per = max(f.seconds_lost / max(1, f.count or 0) for f in said)
    assert per >= own / 3, (per, own, [f.message[:300] for f in said])
