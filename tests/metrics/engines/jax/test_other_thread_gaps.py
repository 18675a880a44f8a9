"""Calls and reads on another thread than the step's are no work in the
loop's gaps (dm-haiku's impala_lite, evaluation of JAX programs s12: two
actor threads call a jitted policy and read its action every env step, the
learner's loop takes their trajectories from a queue; the actors' calls were
"work between steps at impala_lite.py:174 (jit(step)) ... 96 % of step time",
a misleading warning beside the thread-work finding that said them right).
Real JAX on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by
from tpu_info.views.findings import find

PROGRAM = """
import json, queue, threading
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp, numpy as np
N = 64

@jax.jit
def policy(w, obs):
    return jnp.argmax(jnp.tanh(obs @ w))

@jax.jit
def update(w, batch):
    g = jax.grad(lambda w: jnp.mean(jnp.tanh(batch @ w) ** 2))(w)
    return w - 1e-3 * g

q = queue.Queue(maxsize=4)
stop = threading.Event()

def actor(seed):
    rng = np.random.default_rng(seed)
    w = jnp.ones((N, 8)) / N
    while not stop.is_set():
        traj = []
        for _ in range(8):
            obs = jnp.asarray(rng.standard_normal((1, N), np.float32))
            traj.append(int(policy(w, obs)))  # LINE actor
        try:
            q.put(np.full((16, N), sum(traj), np.float32), timeout=0.1)
        except queue.Full:
            pass

threads = [threading.Thread(target=actor, args=(i,), daemon=True) for i in range(2)]
for t in threads:
    t.start()
w = jnp.ones((N, N)) / N
for i in range(200):
    w = update(w, q.get())  # LINE learner
w.block_until_ready()
stop.set()
for t in threads:
    t.join()
""" + PRINT_SNAPSHOT


@pytest.mark.slow
def test_an_actor_threads_calls_and_reads_are_not_the_loops_gaps(tmp_path: Path) -> None:
    s = snapshot_printed_by(tmp_path, PROGRAM)
    actor = next(n for n, t in enumerate(PROGRAM.splitlines(), 1) if "# LINE actor" in t)
    assert s.steps is not None and "update" in s.steps.basis, s.steps
    at_actor = [x for x in s.sites if x.location.endswith(f":{actor}")]
    assert at_actor, s.sites  # (its reads are counted, as reads)
    assert not [x for x in at_actor if x.gaps], at_actor
    said = [f for f in find(s) if f.location and f.location.endswith(f":{actor}")
            and f.kind in ("per_step_evaluation", "periodic_evaluation")]
    assert not said, [f.message for f in said]
