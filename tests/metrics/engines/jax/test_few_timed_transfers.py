"""The issue's program on real JAX: a few timed device_puts (the first one
slow) among 1,618 numpy arguments of a jitted step (counted, not timed). The
views show no host->device percentile from 5 timed samples, and say so."""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")
np = pytest.importorskip("numpy")


def test_five_timed_host_to_device_transfers_of_1623_have_no_percentile():
    import metrics
    from tpu_info.views.values import transfer_stats

    rec = metrics.install(engines=["jax"], serve=False)
    rec.reset()
    x = np.ones((64, 64), np.float32)
    step = jax.jit(lambda a: a * 2)
    for _ in range(5):
        jax.device_put(x).block_until_ready()
    for _ in range(1618):
        y = step(x)  # a numpy argument: an implicit transfer, counted with its bytes
    y.block_until_ready()
    h2d, _ = transfer_stats(metrics.snapshot())
    assert h2d.count == 1623 and h2d.timed == 5, h2d
    assert h2d.p50_ns is None and h2d.p999_ns is None
    assert "only 5 timed samples (< 20)" in h2d.reasons["p50_ns"]
