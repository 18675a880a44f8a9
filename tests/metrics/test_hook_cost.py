"""What the JAX hook's hot paths cost, counted in Python bytecode executed
inside ``metrics/`` per call (deterministic, unlike wall time on a shared
machine). The budgets hold the overhead bench's figures in place: a change
that adds work to a hot path shows here first.

Measured on CPython 3.11 / JAX 0.10.2 (before the overhead passes -> after):
float(x) 146 -> 90 -> 84 (92 at 26a32f9), a jitted call 86 -> 76 -> 74, jax.device_put of
numpy 95 -> 83 (a device_put wrapper and the numpy shard handler) -> 60 (the
handler alone: one hook per put).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

pytestmark = pytest.mark.skipif(sys.version_info[:2] != (3, 11),
                                reason="bytecode counts are CPython 3.11's")


def _opcodes_in_metrics(fn: Callable[[], object]) -> dict[str, int]:
    """Opcodes run in metrics/ code during one call of ``fn`` (after a warm-up
    call), by function name; no journal fold happens inside (emptied first)."""
    import metrics

    root = os.path.dirname(metrics.__file__) + os.sep
    counts: dict[str, int] = {}

    def local(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "opcode":
            counts[frame.f_code.co_name] = counts.get(frame.f_code.co_name, 0) + 1
        return local

    def tracer(frame, event, arg):  # type: ignore[no-untyped-def]
        if not frame.f_code.co_filename.startswith(root):
            return None
        frame.f_trace_opcodes = True
        return local

    fn()
    metrics.recorder().flush()  # nothing waits: this call folds nothing
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return counts


def test_float_of_an_array_costs_no_frame_walk(fresh_metrics):
    scalar = jnp.float32(3.0) * 2
    counts = _opcodes_in_metrics(lambda: float(scalar))
    assert set(counts) == {"_value"}, counts  # no call out of the hook
    assert sum(counts.values()) <= 86, counts


def test_a_jitted_call_stays_within_budget(fresh_metrics):
    step = jax.jit(lambda x: x + 1)  # after install: the hook's wrapper counts it
    x = jnp.ones(4)
    counts = _opcodes_in_metrics(lambda: step(x))
    assert set(counts) == {"call"} and counts["call"] <= 75, counts


def test_a_device_put_runs_one_hook(fresh_metrics):
    """An explicit device_put of a batch is counted in the numpy shard
    handler, which every put of host data runs anyway: no device_put
    wrapper on top of it (two hooks and a frame check per put, before)."""
    batch = np.ones((32, 784), np.float32)
    counts = _opcodes_in_metrics(lambda: jax.device_put(batch))
    assert set(counts) == {"shard_np_array"}, counts
    assert sum(counts.values()) <= 62, counts
    assert fresh_metrics.registry.metric_data("OutboundData")[:2] == (2, 2 * batch.nbytes)
