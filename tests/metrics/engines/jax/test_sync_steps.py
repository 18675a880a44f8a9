"""Which step a device->host read belongs to, in JAX (real JAX on CPU, a real
loop): a burst of reads in one evaluation every N steps is one occurrence of
its line (periodic work, costed per time it ran), a read every step is per
step, and an evaluation function's own calls are not steps."""

from __future__ import annotations

import pytest

from tests.lines import line_of

jax = pytest.importorskip("jax")
jnp = jax.numpy

STEPS, EVAL_EVERY, EVAL_BATCHES = 100, 20, 10


def _here(text: str) -> str:
    return f"{__file__}:{line_of(__file__, text)}"


def train_step(w, x):
    return w - 0.01 * x, jnp.sum(w * x)


def eval_step(w, x):
    return jnp.sum(w * x)


def _train(jit, read_every_step: bool, mark=None, scrape=None,
           eval_batches: int = EVAL_BATCHES) -> float:
    """100 training steps; every 20, an evaluation over 10 batches that reads
    each batch's loss on the host (float(), as an evaluation loop does)."""
    train, evaluate = jit(train_step), jit(eval_step)
    w, x = jnp.ones(8), jnp.arange(8.0)
    batches = [jnp.full(8, float(i)) for i in range(eval_batches)]
    total = 0.0
    for step in range(STEPS):
        w, loss = train(w, x)
        if read_every_step:
            total += float(loss)  # the training read
        if mark is not None:
            mark()
        if step == 1 and scrape is not None:
            scrape()  # a dashboard's first scrape (or the saved run's first checkpoint)
        if (step + 1) % EVAL_EVERY == 0:
            for b in batches:
                total += float(evaluate(w, b))  # the evaluation read
    return total


def _site(snapshot, text: str):
    return next(s for s in snapshot.sites if s.kind == "sync" and s.location == _here(text))


# 30 batches: eval_step is called more often than train_step by step 20; its
# name says evaluation, so its calls are never the step.
@pytest.mark.parametrize("eval_batches", [EVAL_BATCHES, 30])
def test_an_evaluation_read_per_batch_every_20_steps_is_periodic_not_per_step(fresh_metrics,
                                                                             eval_batches):
    import metrics
    from tpu_info.views.findings import find

    _train(jax.jit, read_every_step=False, eval_batches=eval_batches)
    s = metrics.snapshot()
    assert s.steps is not None and s.steps.count == STEPS  # the eval calls are not steps
    read = _site(s, "total += float(evaluate(w, b))  # the evaluation read")
    assert read.count == 5 * eval_batches
    assert read.occurrences == 5  # five evaluations, not fifty steps
    assert read.phase == "periodic"
    assert not [f for f in find(s) if f.kind == "per_step_sync"
                and f.location == read.location]


def test_a_read_every_step_beside_the_evaluation_is_still_per_step(fresh_metrics):
    import metrics

    _train(jax.jit, read_every_step=True)
    s = metrics.snapshot()
    train = _site(s, "total += float(loss)  # the training read")
    assert (train.count, train.occurrences, train.phase) == (STEPS, STEPS, "step")
    evaluation = _site(s, "total += float(evaluate(w, b))  # the evaluation read")
    assert (evaluation.count, evaluation.occurrences, evaluation.phase) == (50, 5, "periodic")


def _profiled_at(step: int, every: int = 0):
    """A ``mark`` for :func:`_train` that sets a profile function (as the
    hook's host-line sampling and any profiler do) for the step ``step``'s
    host work, and for every ``every``-th step's if given."""
    import sys

    seen = [0]

    def mark() -> None:
        seen[0] += 1
        on = seen[0] == step or (every and seen[0] % every == step % every)
        sys.setprofile((lambda *a: None) if on else None)

    return mark


@pytest.mark.parametrize("every", [0, 19])
def test_a_read_made_while_a_profile_function_is_set_is_the_same_instruction(fresh_metrics,
                                                                              every):
    # CPython 3.11 runs float(x) in its specialized PRECALL; while a profile
    # function is set (host_lines.py samples the loop's host work with one)
    # the generic CALL four bytes on runs it instead. That read was another
    # instruction of the line, its step inside the other's span: the line
    # took the busier one's occurrences (99 of 100; CI failed on it).
    import sys

    import metrics

    try:
        _train(jax.jit, read_every_step=True, mark=_profiled_at(21, every))
    finally:
        sys.setprofile(None)
    s = metrics.snapshot()
    train = _site(s, "total += float(loss)  # the training read")
    assert (train.count, train.occurrences, train.phase) == (STEPS, STEPS, "step")
    evaluation = _site(s, "total += float(evaluate(w, b))  # the evaluation read")
    assert (evaluation.count, evaluation.occurrences, evaluation.phase) == (50, 5, "periodic")
    assert evaluation.seconds >= 0 and train.seconds >= 0


def test_with_marked_steps_a_read_belongs_to_the_marked_step(fresh_metrics):
    # The step is jitted where the hook does not count its calls (JAX's own
    # jit, as a function jitted before install): the marks are the steps,
    # named at the first scrape.
    import metrics

    _train(jax.jit.__wrapped__, read_every_step=True, mark=metrics.mark_step,
           scrape=metrics.snapshot)
    s = metrics.snapshot()
    assert s.steps is not None and s.steps.count == STEPS and s.steps.source == "marked"
    train = _site(s, "total += float(loss)  # the training read")
    evaluation = _site(s, "total += float(evaluate(w, b))  # the evaluation read")
    assert (train.occurrences, train.phase) == (STEPS, "step")
    assert (evaluation.count, evaluation.occurrences, evaluation.phase) == (50, 5, "periodic")


def test_periodic_reads_say_how_many_steps_apart_by_the_steps_counted(fresh_metrics):
    # A one-off stall in the loop (a first compile, a checkpoint) makes the
    # loop's mean step slower than its steps; "every N steps" from time
    # would shrink. The hook counts the steps between the evaluations.
    import time

    import metrics
    from tpu_info.views.sites import site_cost

    _train(jax.jit, read_every_step=False, scrape=lambda: time.sleep(1.0))
    s = metrics.snapshot()
    read = _site(s, "total += float(evaluate(w, b))  # the evaluation read")
    assert (read.occurrences, read.steps_spanned) == (5, 80)
    cost = site_cost(s, read)
    assert cost.every_steps == 20 and "every 20 steps" in cost.tail(), cost.tail()


def test_logging_in_a_dict_comprehension_every_50_steps_says_every_50(fresh_metrics):
    # haiku's transformer example logs {k: float(v) for k, v in metrics.items()}
    # every 50 steps. CPython specializes the comprehension's float() call
    # after a few runs, and the read then comes from another instruction of
    # the same line: two sites, one for the early logs and one for the rest.
    # Their line took the busier one's occurrences (10 of 12: "every 61
    # steps"); those of instructions one after the other add up.
    import metrics

    step = jax.jit(train_step)
    w, x = jnp.ones(8), jnp.arange(8.0)
    logs = 0
    for i in range(601):
        w, loss = step(w, x)
        if i % 50 == 0:
            logs += len({k: float(v) for k, v in {"loss": loss, "w0": w[0]}.items()})  # log
    read = _site(metrics.snapshot(), "logs += len({k: float(v) for k, v in")
    assert read.count == 2 * 13
    assert read.steps_spanned / (read.occurrences - 1) == 50, (read.occurrences,
                                                              read.steps_spanned)


def test_an_evaluation_of_two_splits_every_50_steps_from_step_0_says_every_50(fresh_metrics):
    # dm-haiku's rnn example: at step 0 (and every 50) loss_fn runs on the
    # train and the test split, float() after each. At step 0 loss_fn has
    # more calls than the step and is guessed the step for a moment, so the
    # second read's step index moves: one evaluation read as two occurrences
    # by the instruction it ran at (the other instruction, specialized,
    # holds the rest). Occurrences closer than the line's interval are one.
    import metrics

    step = jax.jit(train_step)
    loss_fn = jax.jit(lambda w, b: jnp.sum(w * b))
    w, x = jnp.ones(8), jnp.arange(8.0)
    splits = {"train": jnp.ones(8), "test": jnp.zeros(8)}
    total = 0.0
    for i in range(201):
        w, _ = step(w, x)
        if i % 50 == 0:
            for b in splits.values():
                total += float(loss_fn(w, b))  # the split's loss
    read = _site(metrics.snapshot(), "total += float(loss_fn(w, b))  # the split's loss")
    assert read.count == 10
    assert (read.occurrences, read.steps_spanned) == (5, 200)


def test_a_print_every_20_steps_after_an_evaluation_that_hands_its_state_back(fresh_metrics):
    # optax's mlp_mnist notebook: nnx.jit's eval_step hands the model's state
    # back (its output feeds its next call), and the test-set evaluation
    # before the loop (40 batches) had the most time at a scrape then: it was
    # named the step, so the loop's reads took its call count (40) as their
    # step until the next scrape named train_step: a two-line f-string print
    # every 20 steps read "10 times, every 27 steps" (15 ran, every 20). A
    # scrape in the loop's first steps (train_step under MIN_CALLS calls)
    # must not name the evaluation again.
    import metrics

    def evaluate(w, b):  # (its name says evaluation)
        return w, jnp.sum(w * b)

    step, eval_step = jax.jit(train_step), jax.jit(evaluate)
    w, x = jnp.ones(8), jnp.arange(8.0)
    for i in range(40):
        w, _ = eval_step(w, jnp.full(8, float(i)))
        if i == 30:
            metrics.snapshot()  # a scrape (the saved run's checkpoint)
    printed = []
    for i in range(300):
        w, loss = step(w, x)
        if i == 0:
            metrics.snapshot()  # train_step under MIN_CALLS calls: the evaluation leads
        if i % 20 == 0:
            printed.append(
                f"Step {i}, loss: {loss:.4f}, w:"  # the print's f-string
                f" {w[0]:.2f}")
    read = _site(metrics.snapshot(), "f\"Step {i}, loss: {loss:.4f}, w:\"  # the print's")
    assert read.count == 30
    assert (read.occurrences, read.steps_spanned) == (15, 280)
