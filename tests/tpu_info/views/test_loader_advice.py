"""Advice for eager ops chosen from what the hook knew of their line (issue
41): in a generator (``SiteReading.in_generator``: a data loader, which jit
cannot hold) indexing a jax.Array, keep the data set as numpy or gather in
the jitted step; in a generator doing other work, do it in the step or in
numpy; anywhere else, the old advice (move them into the jitted step)."""

from __future__ import annotations

from dataclasses import replace

from tpu_info.contract.model import SiteReading, Snapshot, StepsReading
from tpu_info.views.findings import find

LOOP = StepsReading(100, "marked", seconds_total=10.0, first_unix=1000.0, last_unix=1010.0)
LOADER = SiteReading("eager_op", "/w/prog.py:21", 100, 0, 0.9, first_seen_unix=1000.1,
                     last_seen_unix=1009.9, function="dataloader.<locals>.<genexpr>",
                     detail="add, select_n, broadcast_in_dim, gather", in_generator=True)


def _said(site: SiteReading, steps: StepsReading = LOOP) -> str:
    (f,) = [f for f in find(Snapshot(1011.0, uptime_seconds=11.0, steps=steps, sites=(site,)))
            if f.location == site.location]
    return f.message


def test_a_gather_in_a_generator_loader_is_told_to_index_on_the_host_or_in_the_step():
    m = _said(LOADER)
    assert ("The data loader there, dataloader() (a generator, which jit cannot hold), "
            "indexes a jax.Array from Python each step") in m, m
    assert "np.asarray once" in m and "pass the indices into the jitted step" in m, m
    assert "Move them into the jitted step" not in m, m
    # The step not jitted (a library's jitted functions counted): still the loader.
    m = _said(LOADER, replace(LOOP, step_line="/w/prog.py:98"))
    assert "np.asarray once" in m and "jit the function that holds" not in m, m


def test_other_work_in_a_generator_is_not_told_to_jit_it():
    m = _said(replace(LOADER, function="batches", detail="reshape, convert_element_type"))
    assert "They run in a generator, batches(), which jit cannot hold" in m, m
    assert "np.asarray once" not in m and "Move them into the jitted step" not in m, m


def test_indexing_outside_a_generator_keeps_the_jitted_step_advice():
    m = _said(replace(LOADER, in_generator=False, function="main"))
    assert "Move them into the jitted step" in m and "generator" not in m, m


def test_a_loader_that_runs_every_n_steps_is_told_each_time_not_each_step():
    evaluation = replace(LOADER, count=5, occurrences=5, steps_spanned=80, seconds=0.5)
    m = _said(evaluation)
    assert "indexes a jax.Array from Python each time:" in m and "each step" not in m, m


def test_eager_ops_on_numpy_each_epoch_are_told_to_put_the_data_on_the_device_once():
    """jax spmd: a numpy data set resharded eagerly every epoch was told "jit
    the function"; jit would copy it each time too."""
    epoch = replace(LOADER, in_generator=False, function="main", detail="sharding_constraint",
                    count=5, occurrences=5, steps_spanned=80, seconds=0.5,
                    bytes=5 * 4_000_000)
    m = _said(epoch)
    assert "4.0 MB copied to the device each time" in m, m
    assert "put the data on the device once, before the loop (jax.device_put" in m, m
    assert "jit the function" not in m, m
    m = _said(replace(epoch, count=100, occurrences=100, steps_spanned=0))  # every step
    assert "copied to the device each step" in m and "Move them into" not in m, m
    small = _said(replace(epoch, bytes=5 * 60_000))  # under 64 KB a time: not the copy
    assert "put the data on the device once" not in small, small
