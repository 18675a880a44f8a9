"""Device->host transfers every step that no line accounts for
(``per_step_sync`` without a location): a ``jax.device_get`` at its own line
is not one of them (dm-haiku's vqvae example: ``jax.device_get`` of the
step's whole output every step, its waits the step's compute, said "717
ms/step, 100 % of step time" where removing it saved ~1.4 % by A/B)."""

from __future__ import annotations

from tpu_info.contract.model import (
    DistributionReading,
    SiteReading,
    Snapshot,
    StepsReading,
    Unit,
)
from tpu_info.views.explicit_syncs import explicit_syncs


def _snap(*sites: SiteReading) -> Snapshot:
    d2h = DistributionReading("TransferFromDeviceTime", Unit.TIME_NS, 100, 72e9, 0.5e9, 0.9e9)
    return Snapshot(taken_at_unix=100.0, uptime_seconds=80.0,
                    steps=StepsReading(100, "inferred", "jit(train_step)", 72.0),
                    distributions=(d2h,), sites=sites)


def test_a_device_get_every_step_costs_its_wait_beyond_the_step_not_the_step():
    """Its own finding, at its line: an upper bound at information where the
    device's time per step is not measured; never the whole wait as a
    warning (before: "717 ms/step, 100 % of step time")."""
    get = SiteReading("device_get", "/w/prog.py:291", 100, bytes=983_860_800, seconds=72.0,
                      detail="jax.device_get", function="<module>")
    (f,) = explicit_syncs(_snap(get))
    assert f.location == "/w/prog.py:291" and f.severity == "info", f
    assert "9.8 MB back to the host every step" in f.message, f.message
    assert "upper bound" in f.message and "every N steps" in f.message, f.message


def test_reads_no_line_holds_are_still_said():
    (f,) = explicit_syncs(_snap())
    assert f.kind == "per_step_sync" and f.location is None, f
