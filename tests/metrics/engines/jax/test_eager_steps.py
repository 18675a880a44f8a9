"""An eager-op line's steps survive a fold that also holds records from
before the step function was known (issue 42: under load a fold mid-loop
left a line of a not-jitted step only the later batch's 14 of 40 steps, and
its ops were said to be periodic)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jax")

from metrics.engines.jax.sites import Steps, known_steps  # noqa: E402


def test_a_record_before_the_step_was_known_hides_none_of_the_batchs_steps():
    # site 0: the loop's first step (-1), then steps 0..24 in the same batch;
    # site 1: only records before the step was known; site 2: steps 3, 3, 4.
    steps = np.array([-1, *range(25), -1, -1, 3, 3, 4], np.int64)
    inv = np.array([0] * 26 + [1, 1] + [2] * 3, np.int64)
    assert known_steps(steps, inv, 3) == [Steps(25, 0, 24), None, Steps(2, 3, 4)]
    assert known_steps(np.array([-1, -1], np.int64), np.array([0, 1], np.int64), 2) == [
        None, None]
