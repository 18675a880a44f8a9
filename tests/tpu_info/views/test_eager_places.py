"""Eager ops are put at the place most of their compiles came from (issue 41:
optax's reduce_on_plateau example ran its un-jitted ``transform.update`` at
the module's level in its second training loop, 14 op compiles with no user
function between, and a plot() call's 2 compiles of argmin/argmax took the
finding, with the advice to jit plot())."""

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
