"""The inferred step is the training step, not a slower evaluation run as often
(issue 28, item 4: a VAE's jit(evaluate) once an epoch was taken for the step)."""

from __future__ import annotations


def test_evaluation_names() -> None:
    from metrics.recording.callstats import evaluation

    assert [evaluation(n) for n in ("jit(evaluate)", "jit(eval_step)", "jit(accuracy)",
                                    "compile(Net.predict)", "jit(train_step)", "jit(update)",
                                    "jit(run_epoch)", "jit(latest)")] == [
        True, True, True, True, False, False, False, False]


def test_a_slow_evaluation_called_as_often_is_not_the_step() -> None:
    from metrics.recording.callstats import CallTimes

    train = type("Owner", (), {"name": "jit(run_epoch)", "explicit": False})()
    evaluate = type("Owner", (), {"name": "jit(evaluate)", "explicit": False})()
    times = CallTimes("jitted function")
    owners, starts, ends = [], [], []
    for epoch in range(12):  # run_epoch dispatches in 1 ms; evaluate takes 30 ms of host
        t = epoch * 100_000_000
        owners += [train, evaluate]
        starts += [t, t + 2_000_000]
        ends += [t + 1_000_000, t + 32_000_000]
    times.fold(owners, starts, ends)
    steps = times.steps()
    assert steps is not None and steps.basis.startswith("jit(run_epoch)"), steps
    assert steps.count == 12
