"""The work between a torch program's steps told by what BASE did not note
(found by the evaluation on unchanged pytorch/examples and tutorials):

- pytorch/examples' super_resolution evaluates every epoch under
  ``torch.no_grad()`` with no ``model.eval()``, then ``torch.save``s: the
  gap was led by the save (``periodic_checkpoint``, "Save less often", 5.1 s
  each where the save takes 2-10 ms) and the evaluation was missed. The
  user's ``no_grad`` (or ``inference_mode``) block is an evaluation's note,
  its exit noted by time;
- a checkpoint is its own span (``torch.save`` to its return), never the
  work before it in the same interval;
- pytorch/tutorials' trainingyt validates after ``model.train(False)`` (not
  ``model.eval()``): missed before;
- a ``no_grad`` block entered between every two steps (a hand-written SGD
  update, an EMA) is no evaluation.
"""

from __future__ import annotations

import textwrap

import pytest

torch = pytest.importorskip("torch")


def _noting():
    """A StepGaps with its hooks on torch (restored by the caller's ``patches.restore()``)."""
    from metrics.engines.torch.context import TorchContext
    from metrics.engines.torch.gaps import StepGaps
    from metrics.recording.recorder import Recorder

    ctx = TorchContext("torch_compile", Recorder(), skip=(str(torch.__path__[0]),))
    gaps = StepGaps()
    gaps.install(ctx.patches, ctx)
    return gaps, ctx


def _line(fn, text: str) -> str:
    """``file:line`` of the line of ``fn``'s source holding ``text``."""
    import inspect

    src, first = inspect.getsourcelines(fn)
    (n,) = [first + i for i, s in enumerate(src) if s.rstrip().endswith(f"# {text}")]
    return f"{inspect.getsourcefile(fn)}:{n}"


def test_the_users_train_false_is_an_evaluations_start_noted_once():
    from metrics.engines.torch.gaps import EVAL, TRAIN

    gaps, ctx = _noting()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.ReLU()))
    try:
        model.train(False)  # user
        model.train(True)
        model.eval()  # (its own train(False) is not a second note)
        notes = [(n.kind, n.detail) for n in gaps.notes]
        assert notes == [(EVAL, "Sequential.train(False)"), (TRAIN, ""),
                         (EVAL, "Sequential.eval()")], notes
        assert gaps.notes[0].location == _line(
            test_the_users_train_false_is_an_evaluations_start_noted_once, "user")
        assert not model.training and not any(m.training for m in model.modules())
    finally:
        ctx.patches.restore()


@torch.no_grad()
def _decorated(model, x):
    return model(x)


def test_the_users_no_grad_block_is_noted_at_its_line_and_its_exit_by_time():
    from metrics.engines.torch.gaps import GRAD_ON, NOGRAD

    gaps, ctx = _noting()
    model = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    here = test_the_users_no_grad_block_is_noted_at_its_line_and_its_exit_by_time
    try:
        with torch.no_grad():  # with
            with torch.no_grad():  # (inside another: not noted)
                model(x)
        assert [(n.kind, n.location) for n in gaps.notes] == [
            (NOGRAD, _line(here, "with")), (GRAD_ON, _line(here, "with"))]
        gaps.notes.clear()
        _decorated(model, x)  # decorated
        with torch.inference_mode():  # inference
            pass
        with torch.inference_mode(False):  # (no evaluation)
            pass
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # a library's: free
        model.to(torch.float32)
        notes = [(n.kind, n.location, n.detail) for n in gaps.notes if n.kind == NOGRAD]
        assert notes == [(NOGRAD, _line(here, "decorated"), "torch.no_grad()"),
                         (NOGRAD, _line(here, "inference"),
                          "torch.inference_mode()")], notes
        assert [n.kind for n in gaps.notes].count(GRAD_ON) == 2
        assert torch.is_grad_enabled() and model(x).requires_grad
    finally:
        ctx.patches.restore()


def test_a_no_grad_block_inside_a_compiled_function_keeps_its_graph():
    gaps, ctx = _noting()
    try:
        torch._dynamo.reset()

        def f(x):
            with torch.no_grad():
                y = x * 2
            return y + x

        x = torch.randn(8, requires_grad=True)
        explained = torch._dynamo.explain(f)(x)
        assert explained.graph_break_count == 0, explained.break_reasons
        assert not gaps.notes
    finally:
        ctx.patches.restore()
        torch._dynamo.reset()


def test_a_checkpoint_is_its_own_span_never_the_work_before_it():
    from metrics.engines.torch.gaps import CHECKPOINT, SAVED, Note, StepGaps

    gaps = StepGaps()
    # Steps every 10 us; after step 5, 30 us of work no note tells, then a
    # 1 us save: main before charged the save 30 us (the interval less the step).
    gaps.intervals([10_000 * k for k in range(1, 6)], 1)
    gaps.notes.extend([Note(CHECKPOINT, "/w/t.py:12", "", "torch.save", 50_000 + 31_000),
                       Note(SAVED, "", "", "", 50_000 + 32_000)])
    gaps.intervals([50_000, 90_000], 5)
    (save,) = gaps.sites(None)
    assert save.work == "checkpoint" and save.gaps == 1, save
    assert save.gap_seconds == pytest.approx(1_000 / 1e9), save


# The programs, each in its own process (read as the CLI reads it).

# super_resolution's shape: Adam, loss.item() every step; after each epoch
# test() under torch.no_grad() with no model.eval(), then a small torch.save.
NO_EVAL = textwrap.dedent('''
    import io, json, time
    import metrics
    metrics.install(engines=["torch_compile"], serve=False)
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Tanh(),
                                torch.nn.Linear(256, 128))
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    x, big = torch.randn(32, 128), torch.randn(512, 128)
    spent = []


    def test():
        with torch.no_grad():  # LINE test
            for _ in range(60):
                model(big).pow(2).mean().item()


    for epoch in range(3):
        for batch in range(30):
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            loss.item()
        t = time.perf_counter()
        test()
        spent.append(time.perf_counter() - t)
        torch.save(model, io.BytesIO())  # LINE save
    from tpu_info.wire.fillers import snapshot_to_proto
    print(json.dumps({"proto": snapshot_to_proto(metrics.snapshot()).SerializeToString().hex(),
                      "spent": spent}))
''')

# trainingyt's shape: SGD with momentum; every epoch model.train(True), the
# epoch's steps, then model.train(False) and a validation with autograd on,
# and a torch.save when the validation loss improves.
TRAIN_FALSE = NO_EVAL.replace('''def test():
    with torch.no_grad():  # LINE test
        for _ in range(60):
            model(big).pow(2).mean().item()
''', '''def test():
    model.train(False)  # LINE test
    vloss = 0.0
    for _ in range(60):
        vloss += model(big).pow(2).mean()
    return vloss
''').replace("for batch in range(30):", "model.train(True)\n    for batch in range(30):")


assert "train(False)" in TRAIN_FALSE

# A checkpoint after work no note tells (an evaluation with autograd on and
# neither model.eval() nor no_grad: its time stays in the steps): the save
# is 1-2 ms of it. Main before charged the save the whole work.
AFTER_WORK = NO_EVAL.replace('''def test():
    with torch.no_grad():  # LINE test
        for _ in range(60):
            model(big).pow(2).mean().item()
''', '''def test():
    for _ in range(60):  # LINE test
        model(big).pow(2).mean().item()
''')
assert "no_grad" not in AFTER_WORK


def _evaluation(s, kind="periodic_evaluation"):
    from tpu_info.views.findings import find

    return [f for f in find(s) if f.kind == kind]


@pytest.mark.slow
@pytest.mark.parametrize("source", [NO_EVAL, TRAIN_FALSE], ids=["no_grad", "train_false"])
def test_an_evaluation_without_model_eval_leads_its_gap_and_the_save_sits_in_it(
        tmp_path, source):
    from tests.metrics.engines.torch.test_torch_eager_gaps import _run

    live, saved, lines, spent = _run(tmp_path, source)
    assert live.steps.basis.startswith("optimizer.step(): 90 calls"), live.steps.basis
    # Main before: super_resolution's gap was the save's (periodic_checkpoint,
    # the whole evaluation's time); trainingyt's, nothing.
    assert not _evaluation(live, "periodic_checkpoint") and not _evaluation(
        saved, "periodic_checkpoint")
    (ev,) = _evaluation(live)
    assert ev.location.endswith(f"train.py:{lines['test']}"), ev.message
    assert ev.count == 2 and ev.every_steps == pytest.approx(30.0), ev.message
    assert 0.7 * sum(spent[:2]) <= ev.seconds_lost <= 1.3 * sum(spent[:2]), (ev.message, spent)
    (save,) = [x for x in saved.sites if x.kind == "save"]
    assert save.within == ev.location, save
    (end,) = _evaluation(saved)
    assert end.count == 3 and end.seconds_lost <= 1.3 * sum(spent), (end.message, spent)


@pytest.mark.slow
def test_a_checkpoint_after_other_work_is_charged_its_own_time(tmp_path):
    from tests.metrics.engines.torch.test_torch_eager_gaps import _run

    live, saved, lines, spent = _run(tmp_path, AFTER_WORK)
    for s in (live, saved):
        assert not _evaluation(s, "periodic_checkpoint"), [f.message for f in _evaluation(
            s, "periodic_checkpoint")]
        (save,) = [x for x in s.sites if x.kind == "save"]
        assert save.work == "checkpoint" and save.gaps >= 2, save
        assert save.gap_seconds < 0.2 * sum(spent), (save, spent)


# Work under no_grad between every two steps: a hand-written SGD update
# (word_language_model's loop without its p.data) and an EMA of the weights
# after each optimizer step; the EMA program evaluates every 30 steps too.
BY_HAND = NO_EVAL.replace("opt.step()", '''with torch.no_grad():  # LINE update
            for p in model.parameters():
                p -= 1e-3 * p.grad''').replace("opt.zero_grad()", "model.zero_grad()")
EMA = NO_EVAL.replace("opt.step()", '''opt.step()
        with torch.no_grad():  # LINE update
            for e, p in zip(ema, model.parameters()):
                for _ in range(20):
                    e.mul_(0.99).add_(p, alpha=0.01)''').replace(
    "spent = []", "spent = []\nema = [p.detach().clone() for p in model.parameters()]").replace(
    "def test():\n", "def test():\n    model.eval()  # LINE eval\n")
assert "LINE eval" in EMA and all("LINE update" in x for x in (EMA, BY_HAND))


@pytest.mark.slow
@pytest.mark.parametrize("source", [BY_HAND, EMA], ids=["by_hand", "ema"])
def test_a_no_grad_block_between_every_two_steps_is_no_evaluation(tmp_path, source):
    from tests.metrics.engines.torch.test_torch_eager_gaps import _run
    from tpu_info.views.findings import find

    live, saved, lines, spent = _run(tmp_path, source)
    for s in (live, saved):
        found = find(s)
        assert not [f for f in found if (f.location or "").endswith(
            f"train.py:{lines['update']}")], [f.message for f in found]
        assert not [f for f in found if f.kind.startswith("per_step_")
                    and f.kind.endswith(("evaluation", "checkpoint"))]
        # The evaluation every 30 steps is still one (led by its model.eval()
        # in the EMA's program, by its no_grad block in the other).
        (ev,) = _evaluation(s)
        lead = lines.get("eval", lines["test"])
        assert ev.location.endswith(f"train.py:{lead}"), ev.message
    # No no_grad site there either (the update's own host time at its lines,
    # a few microseconds a step, is a host_work site: below the bar, no finding).
    assert not [x for x in live.sites if x.location.endswith(f"train.py:{lines['update']}")
                and x.kind != "host_work"]


def test_a_no_grad_block_leads_an_evaluation_in_words_and_inference_mode_is_not_advised_twice():
    from tpu_info.contract.model import ProcessRecord, SiteReading, Snapshot, StepsReading
    from tpu_info.views.findings import find

    steps = StepsReading(600, "inferred", "optimizer.step(): 600 calls (Adam)", 30.0, 100.0,
                         140.0)
    for detail, advised in (("torch.no_grad()", True), ("torch.inference_mode()", False)):
        ev = SiteReading("no_grad", "/w/main.py:64", 12, detail=detail, phase="periodic",
                         occurrences=12, steps_spanned=550, work="evaluation", gaps=12,
                         gap_seconds=8.0)
        snap = Snapshot(141.0, ProcessRecord(1, "main.py", engine="torch_compile"),
                        uptime_seconds=41.0, sites=(ev,), steps=steps)
        (f,) = [f for f in find(snap) if f.kind == "periodic_evaluation"]
        assert f"evaluation at main.py:64 ({detail} there)" in f.message, f.message
        assert ("torch.inference_mode()." in f.message) is advised, f.message
