"""The issue's program on real JAX: a few timed device_puts (the first one
slow) among 1,618 numpy arguments of a jitted step. Five timed samples give
no host->device percentile, and the views say so; the jit wrapper times a
sample of the numpy arguments' copies (issue 41 item 4: its first 20 samples,
then one per 50 ms at most), so the 1,623 transfers stand on enough timed ones."""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")
np = pytest.importorskip("numpy")


def test_five_timed_host_to_device_transfers_have_no_percentile_numpy_arguments_add_some():
    import metrics
    from tpu_info.views.values import transfer_stats

    rec = metrics.install(engines=["jax"], serve=False)
    rec.reset()
    x = np.ones((64, 64), np.float32)
    step = jax.jit(lambda a: a * 2)
    for _ in range(5):
        jax.device_put(x).block_until_ready()
    h2d, _ = transfer_stats(metrics.snapshot())
    assert h2d.count == 5 and h2d.timed == 5, h2d
    assert h2d.p50_ns is None and h2d.p999_ns is None
    assert "only 5 timed samples (< 20)" in h2d.reasons["p50_ns"]
    for _ in range(1618):
        y = step(x)  # a numpy argument: an implicit transfer, a sample of them timed
    y.block_until_ready()
    h2d, _ = transfer_stats(metrics.snapshot())
    # 5 puts and the jit wrapper's samples once each way stands on 4 calls
    assert h2d.count == 1623 and 20 <= h2d.timed < 200, h2d
    assert h2d.p50_ns is not None
