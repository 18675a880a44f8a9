"""An implicit host->device copy the hook counted but did not time (the
jax.jit wrapper's numpy arguments it did not sample): its cost stands on timed
transfers, never on an assumed rate (issue 41 item 4): the line's own sample
when it has 20 timed copies, else this program's own timed transfers that way,
else no figure, and the finding says which; a per-step copy of a batch is
named whatever its share, a one-off or a scalar is not. Real JAX runs:
tests/system/test_untimed_transfer_cost.py, tests/tpu_info/views/test_steady_steps.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.tpu_info.views.test_findings_cost import RATE, _h2d, _one, _snap
from tpu_info.contract.model import DistributionReading, Snapshot, StepsReading, Unit
from tpu_info.views.findings import find


def test_implicit_transfer_at_the_program_rate_is_estimated_and_says_so():
    f = _one(_snap(_h2d(), distributions=RATE), "per_step_implicit_transfer")
    assert f.message.startswith(
        "numpy argument of jit(step) at train.py:80 copies 32.0 MB to the device every step "
        "(1,200 times, 1.0 per step, ~3.2 ms/step, 2.3% of step time, estimated at 10 GB/s "
        "to the device, measured on this program's 20 timed transfers)")
    # Advice as measured on a TPU v5e (bench/RESULTS-TPU.md): the data set put
    # once saved the copy; a put per batch ahead of the step cost more.
    assert "jax.device_put the whole data set once if it fits" in f.message
    assert "only moves the copy" in f.message
    assert "double-buffer" not in f.message and "prefetch_to_device" not in f.message
    assert f.cost_estimated and f.seconds_lost == pytest.approx(3.84)
    assert f.bytes_per_step == 32e6 and f.severity == "warning"
    # The same copy in steps 20x longer (0.12% of step time) is still named:
    # it is on every step's critical path; as info, saying it is cheap here.
    slow = StepsReading(1200, "marked", "metrics.mark_step", seconds_total=3300.0)
    f = _one(_snap(_h2d(), steps=slow, distributions=RATE), "per_step_implicit_transfer")
    assert f.severity == "info" and "0.12% of step time" in f.message
    assert "cheap at this step time" in f.message


def test_a_line_with_20_timed_copies_costs_its_own_sample_scaled_to_all():
    site = replace(_h2d(), timed=40, timed_bytes=40 * 32_000_000, seconds=40 * 0.004)
    f = _one(_snap(site, distributions=RATE), "per_step_implicit_transfer")
    assert not f.cost_estimated and f.seconds_lost == pytest.approx(0.004 * 1200)
    assert "measured; timed 40 of 1,200 transfers: 8 GB/s to the device" in f.message


def test_nothing_timed_gives_no_figure_and_says_why():
    f = _one(_snap(_h2d()), "per_step_implicit_transfer")
    assert "assumed" not in f.message and f.seconds_lost == 0 and f.severity == "info"
    assert "(1,200 times, 1.0 per step, not timed: none and fewer than 20" in f.message
    # 5 timed copies at the line: still too few to stand on.
    few = replace(_h2d(), timed=5, timed_bytes=5 * 32_000_000, seconds=0.02)
    assert "not timed: 5 of its 1,200 transfers" in _one(
        _snap(few), "per_step_implicit_transfer").message


def test_one_off_or_small_implicit_transfers_are_not_findings():
    one_off = _h2d(count=1, nbytes=400_000_000)
    scalar = replace(_h2d(nbytes=8 * 1200), location="/src/train.py:81")  # lr as a numpy scalar
    rare = replace(_h2d(count=100, nbytes=100 * 32_000_000), location="/src/train.py:82")
    assert not [f for f in find(_snap(one_off, scalar, rare))
                if f.kind == "per_step_implicit_transfer"]


def _rate_snap(timed_count: int, timed_bytes: float, timed_ns: float) -> Snapshot:
    site = _h2d()
    timed = DistributionReading("TransferToDeviceTime", Unit.TIME_NS, timed_count, timed_ns,
                                1e8, 1e8)
    # OutboundData holds every host->device copy: the timed ones and the jit
    # wrapper's untimed numpy arguments.
    sent = DistributionReading("OutboundData", Unit.BYTES, timed_count + site.count,
                               timed_bytes + site.bytes, 2e8, 2e8)
    return _snap(site, distributions=(timed, sent))


def test_implicit_transfer_estimated_from_the_process_own_transfer_rate():
    f = _one(_rate_snap(20, 2e9, 1e9), "per_step_implicit_transfer")
    assert ("estimated at 2 GB/s to the device, measured on this program's 20 timed "
            "transfers") in f.message
    assert f.seconds_lost == pytest.approx(32_000_000 * 1200 / 2e9)
    # Too few or too small timed transfers measure latency, not bandwidth: the
    # 4 or 5 timed transfers of a real program gave 0.05 to 43 GB/s.
    for few in (_rate_snap(5, 2e9, 1e9), _rate_snap(20, 5e6, 1e6)):
        f = _one(few, "per_step_implicit_transfer")
        assert "not timed" in f.message and f.seconds_lost == 0


def test_small_shares_keep_two_digits():
    from tpu_info.views.cost import share_words

    assert [share_words(x) for x in (0.5, 0.03, 0.004, 0.00031, 3e-7)] == [
        "50%", "3.0%", "0.4%", "0.031%", "<0.001%"]
