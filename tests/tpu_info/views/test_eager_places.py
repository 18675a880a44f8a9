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


def test_eager_set_up_beside_larger_compiled_work_with_no_steps_known_is_not_the_loop() -> None:
    # numpyro's CVAE example: svi.init runs the model and guide eagerly (81
    # single-op graphs, 5.1 s) and its training runs as eager lax loops
    # compiled into jit(scan) graphs (20 s), no step known: "Wrap the loop
    # body in jax.jit" warned of a loop these ops are not in.
    from tpu_info.contract.model import GraphRecord

    base = _eager_with_step()
    ops = tuple(g for g in base.graphs if g.name != "jit(train_step)")
    scan = GraphRecord("a" * 64, "jit(scan)", "jax", 1.0, 1.0, compiles=2,
                       compile_seconds_total=20.0, compile_seconds_last=10.0)
    f = _one(replace(base, steps=None, graphs=(*ops, scan)), "eager_ops")
    assert f.severity == "info", f.message
    assert "Wrap the loop body" not in f.message
    assert "compiled into larger graphs (jit(scan))" in f.message, f.message
    # A fully eager program (nothing larger compiled) is still told to jit its loop.
    f = _one(replace(base, steps=None, graphs=ops), "eager_ops")
    assert f.severity == "warning" and "Wrap the loop body in jax.jit" in f.message, f.message


def test_a_copy_or_eager_ops_every_step_under_two_percent_of_the_step_are_information() -> None:
    # jax's advi example copies a 4 B PRNG key to the device every step (0.5-1 %
    # of its step) and was warned to device_put its data set; eager ops every
    # step at that share likewise.
    from tests.tpu_info.views.test_findings_cost import _h2d, _snap
    from tpu_info.contract.model import SiteReading

    small = _snap(_h2d(nbytes=4 * 1200, seconds=1.3))  # 1.3 s of a 164 s loop: 0.8 %
    assert _one(small, "per_step_implicit_transfer").severity == "info"
    assert _one(_snap(_h2d(nbytes=4 * 1200, seconds=4.9)), "per_step_implicit_transfer"
                ).severity == "warning"  # 3 %
    eager = SiteReading("eager_op", "/src/train.py:70", 1200, seconds=1.3, function="train",
                        detail="random_split")
    assert _one(_snap(eager), "per_step_eager_ops").severity == "info"
    assert _one(_snap(replace(eager, seconds=4.9)), "per_step_eager_ops").severity == "warning"
