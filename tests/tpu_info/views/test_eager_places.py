"""Where a finding goes and how loud (issue 41). Eager ops are put at the place
most of their compiles came from (optax's reduce_on_plateau example ran its
un-jitted ``transform.update`` at the module's level in its second training
loop, 14 op compiles with no user function between, and a plot() call's 2
compiles of argmin/argmax took the finding, with the advice to jit plot());
a cheap read every step is information."""

from __future__ import annotations

from dataclasses import replace

from tests.tpu_info.views.test_findings_cost import _eager_with_step, _one


def test_the_line_with_most_compiles_wins_over_a_call_with_fewer() -> None:
    s = _eager_with_step()
    plot = "called from plot() at /src/mnist.py:278"
    details = [""] * 30 + [plot] * 10  # 30 at the op lines themselves (no user call between)
    s = replace(s, events=tuple(replace(e, detail=d) for e, d in zip(s.events, details,
                                                                      strict=True)))
    f = _one(s, "eager_ops")
    assert f.location != "/src/mnist.py:278" and "plot()" not in f.message, f.message
    assert f"eager, un-jitted code at {f.location.rsplit('/', 1)[1]}" in f.message
    # The other way round, the call is the place.
    details = [""] * 10 + [plot] * 30
    s = replace(s, events=tuple(replace(e, detail=d) for e, d in zip(s.events, details,
                                                                      strict=True)))
    f = _one(s, "eager_ops")
    assert f.location == "/src/mnist.py:278" and "jit plot()" in f.message, f.message


def test_a_read_every_step_under_two_percent_of_the_step_is_information() -> None:
    # pytorch/examples' actor_critic reads each sampled action for the
    # environment (0.77 % of its step) and was warned to log every N steps.
    from tests.tpu_info.views.test_findings_cost import _snap, _sync

    f = _one(_snap(_sync(seconds=1.3)), "per_step_sync")  # 0.8 % of the step
    assert f.severity == "info" and "It is cheap on this CPU" in f.message, f.message
    assert _one(_snap(_sync()), "per_step_sync").severity == "warning"  # 3 %: said loud
