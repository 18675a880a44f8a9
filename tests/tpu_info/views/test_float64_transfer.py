"""Advice chosen from the facts (issue 41 item 12): a numpy batch the host
sends as float64 into a jitted step (JAX, x64 off, turns it into float32 on
every call) is told to be made float32 once; a float32 batch is not, nor one
whose first call only sent float64 (numpy parameters, on the device after it:
mnist_classifier_fromscratch's init_random_params)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by
from tpu_info.views.findings import find

PROGRAM = '''
import json
import numpy as np
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp
data = np.random.default_rng(0).standard_normal((33, 256, 128)){astype}
w = {w}

@jax.jit
def step(w, batch):
    x, y = batch
    return w - 1e-3 * jnp.mean((jnp.tanh(x @ w) - y) ** 2) * w

for i in range(300):
    w = step(w, (data[i % 32], data[i % 32 + 1]))  # the batch
w.block_until_ready()
''' + PRINT_SNAPSHOT


@pytest.mark.slow
@pytest.mark.parametrize(("astype", "w"), [("", "jnp.eye(128)"),
                                           (".astype(np.float32)", "jnp.eye(128)"),
                                           (".astype(np.float32)", "np.eye(128)")])
def test_a_float64_batch_is_told_to_be_made_float32_once(tmp_path: Path, astype: str,
                                                          w: str) -> None:
    program = PROGRAM.replace("{astype}", astype).replace("{w}", w)
    s = snapshot_printed_by(tmp_path, program, "f64.py")
    (site,) = [x for x in s.sites if x.kind == "implicit_to_device"]
    (f,) = [f for f in find(s) if f.kind == "per_step_implicit_transfer"]
    sent64 = astype == ""
    # Nested leaves (an (x, y) batch): the label learnt at the compile.
    assert ("float64" in site.detail) == sent64, site.detail
    assert ("converts to float32 on every call" in f.message) == sent64, f.message
    assert "jax.device_put the whole data set once if it fits" in f.message
