"""A recompile met once in the step loop is advised as a one-off, not as a
size that varies (the s10 evaluation's diffrax examples): the neural ODE's
curriculum grows its series 10 -> 100 once, told to "pad or bucket batches";
the latent ODE's sampling compiles its own size in the loop's first step,
told to pad evaluation batches, where calling it once before the loop saves
the loop's wait."""

from __future__ import annotations

from tpu_info.contract.diagnosis import Phase
from tpu_info.views.causes import CauseAdvice
from tpu_info.views.recompile_groups import once_advice

VARIES = CauseAdvice("batch size varies", "", "", "Pad or bucket batches to a few fixed sizes.")
SECOND = CauseAdvice("second batch size, e.g. evaluation vs training", "", "",
                     "Expected once per size.", True)


def test_a_size_grown_once_in_the_loop_is_a_one_off_compile():
    said = once_advice(VARIES, Phase.ONCE)
    assert said.startswith("Once, not every step") and "curriculum" in said
    assert once_advice(VARIES, Phase.PERIODIC) == VARIES.advice  # recurring: pad or bucket


def test_a_second_callers_size_met_in_the_loop_is_told_to_warm_it_up_before():
    said = once_advice(SECOND, Phase.ONCE)
    assert said.startswith(SECOND.advice) and "once at that size before the loop" in said
    assert once_advice(SECOND, Phase.SETUP) == SECOND.advice
