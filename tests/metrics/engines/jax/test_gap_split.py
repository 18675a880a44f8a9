"""Two kinds of periodic work in the same gaps: an accuracy every 10 steps
(a jitted call read with float()) and, every 50 steps, a "sheet" (a
``jax.device_get`` of the weights and 150 ms of host work) right after it,
before the next step (ais_vizmetrics, evaluation of JAX programs s11: a
test-sheet image every 500 steps inside the accuracy every 10; the accuracy
said as 16 ms each where it took 5, the 1.5 s sheets unsaid). The sheet's
time is its own line's gaps, the accuracy keeps its usual one. Real JAX on
the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by

PROGRAM = """
import json, time
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp, numpy as np
rng = np.random.default_rng(0)
N = 128

@jax.jit
def step(w, x):
    l, g = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    return w - 1e-3 * g, l

@jax.jit
def accuracy(w, x):
    return jnp.mean(jnp.tanh(x @ w) > 0)

xs = rng.standard_normal((8, 64, N), np.float32)
w = jnp.asarray(rng.standard_normal((N, N), np.float32) / N ** 0.5)
for i in range(300):
    w, loss = step(w, xs[i % 8])
    if i % 10 == 0:
        a = float(accuracy(w, xs[0]))  # LINE accuracy
    if i % 50 == 0:
        sheet = jax.device_get(w)  # LINE sheet
        time.sleep(0.15)
""" + PRINT_SNAPSHOT


@pytest.mark.slow
def test_a_sheet_every_50_steps_inside_the_accuracy_gaps_is_its_own(tmp_path: Path) -> None:
    lines = {text.rsplit("# LINE ", 1)[1]: n
             for n, text in enumerate(PROGRAM.splitlines(), start=1) if "# LINE " in text}
    s = snapshot_printed_by(tmp_path, PROGRAM)
    at = {k: [x for x in s.sites if x.gaps and x.location.endswith(f":{n}")]
          for k, n in lines.items()}
    (acc,), (sheet,) = at["accuracy"], at["sheet"]
    # Six sheets: the first (step 0, the lead's first gap, with nothing to tell
    # it by) stays the accuracy's; the others are the sheet's own gaps.
    assert sheet.gaps >= 4, sheet
    assert 0.1 <= sheet.gap_seconds / sheet.gaps <= 0.4, sheet
    assert acc.gaps >= 25 and acc.gap_seconds < 0.35, acc  # (one 0.15 s sheet at most)
