"""Work after every optimizer step (pytorch/examples' gcn: two evaluations,
``model.eval()`` and a forward pass under ``no_grad`` each, after every step,
then ``model.train()`` at the next step's start; 42 % of its loop by A/B, and
the hook said nothing): with the work in every interval there is no usual
step to take out of it, so the user's ``model.train()`` after it is noted
and ends it, and the evaluation's time is its own span; and its notes (three
a step) fold the steps instead of going unfolded."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


class _Timeline:
    """A compile timeline with one compile span (ns)."""

    def __init__(self, first: int, last: int) -> None:
        self.span = (first, last)

    def within(self, first: int, last: int) -> int:
        a, b = max(first, self.span[0]), min(last, self.span[1])
        return max(0, b - a)


def _noting():
    """A StepGaps with its hooks on torch (restored by the caller's ``patches.restore()``)."""
    from metrics.engines.torch.context import TorchContext
    from metrics.engines.torch.gaps import StepGaps
    from metrics.recording.recorder import Recorder

    ctx = TorchContext("torch_compile", Recorder(), skip=(str(torch.__path__[0]),))
    gaps = StepGaps()
    gaps.install(ctx.patches, ctx)
    return gaps, ctx


def test_only_the_users_model_train_after_a_note_is_noted():
    from metrics.engines.torch.gaps import EVAL, TRAIN

    gaps, ctx = _noting()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.ReLU()))
    try:
        model.train()  # nothing noted before it: a loop that never evaluates adds no note
        assert not gaps.notes
        model.eval()  # its own train(False) on every module is no train() note
        assert [n.kind for n in gaps.notes] == [EVAL]
        model.train()  # the user's call: one note, not one per child module
        model.train()  # and not again after it
        kinds = [n.kind for n in gaps.notes]
        assert kinds == [EVAL, TRAIN], kinds
        assert gaps.notes[-1].location == "" and gaps.notes[-1].ns >= gaps.notes[0].ns
        assert model.training and all(m.training for m in model.modules())
        with torch.inference_mode():  # (makemore's @torch.inference_mode() evaluate)
            model.eval()
        with torch.no_grad():
            model.eval()
        details = [n.detail for n in gaps.notes if n.kind == EVAL]
        assert details == ["Sequential.eval()", "Sequential.eval() under inference_mode",
                           "Sequential.eval() under no_grad"], details
    finally:
        ctx.patches.restore()


def test_work_after_every_step_ended_by_model_train_is_its_own_span_less_compiles():
    from metrics.engines.torch.gaps import EVAL, TRAIN, Note, StepGaps

    gaps = StepGaps()
    # Steps end every 10 us; after each, an evaluation from +1 us to the
    # next step's model.train() at +5 us: no interval without work (no usual step).
    marks = [10_000 * k for k in range(1, 6)]
    for a in marks[:-1]:
        gaps.notes.extend([Note(EVAL, "/w/gcn.py:80", "", "GCN.eval()", a + 1_000),
                           Note(EVAL, "/w/gcn.py:80", "", "GCN.eval()", a + 3_000),
                           Note(TRAIN, "", "", "", a + 5_000)])
    gaps.timeline = _Timeline(20_000 + 2_000, 20_000 + 3_000)  # 1 us compiled in the second
    gaps.intervals(marks, 1)
    (site,) = gaps.sites(None)
    # Main before: no time at all (nothing beyond a usual step that was never seen).
    assert site.work == "evaluation" and site.gaps == 4 and site.count == 8
    assert site.gap_seconds == pytest.approx((4 * 4_000 - 1_000) / 1e9)
    # The rest of each interval is the step (the first step's interval is no usual step).
    assert gaps.usual_ns() == pytest.approx(6_000)


def test_a_gap_with_work_after_model_train_keeps_its_interval_beyond_the_usual_step():
    from metrics.engines.torch.gaps import CHECKPOINT, EVAL, TRAIN, Note, StepGaps

    gaps = StepGaps()
    # Intervals 2-4 usual (10 us); the fifth (25 us) holds an evaluation, its
    # model.train() and then a save: timed over the interval, beyond the usual step.
    gaps.notes.extend([Note(EVAL, "/w/t.py:9", "", "M.eval()", 50_000 + 1_000),
                       Note(TRAIN, "", "", "", 50_000 + 2_000),
                       Note(CHECKPOINT, "/w/t.py:12", "", "torch.save", 50_000 + 3_000)])
    gaps.intervals([10_000 * k for k in range(1, 6)], 1)
    gaps.intervals([50_000, 75_000], 5)
    (ev, save) = sorted(gaps.sites(None), key=lambda x: x.kind)
    assert ev.gaps == 1 and ev.gap_seconds == pytest.approx(15_000 / 1e9)
    assert save.within == "/w/t.py:9"


STEPS = 2_100


def test_notes_past_two_thousand_fold_the_steps_and_none_is_dropped():
    """Two evaluations a step and the next step's model.train(): 3 notes a
    step, 6,300 in all before any read; main before dropped the oldest past
    4,096 (their steps then read as usual ones)."""
    import metrics

    rec = metrics.install(engines=["torch_compile"], serve=False)
    rec.reset()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4, 8)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(STEPS):
            model.train()
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            for _ in range(2):
                model.eval()
                with torch.no_grad():
                    model(x)
    finally:
        torch.set_num_threads(threads)
    snap = metrics.snapshot()
    rec.reset()
    (site,) = [x for x in snap.sites if x.kind == "eval_mode"]
    # every interval between two steps held an evaluation (the last one no step closed)
    assert site.gaps == STEPS - 1 and site.work == "evaluation", site
    assert site.count == 2 * (STEPS - 1) and site.gap_seconds > 0, site


def test_reads_in_the_open_gap_after_the_last_step_are_its_leads():
    """gcn reads each evaluation's loss (loss.item()) and evaluates after its
    last step too: the reads' last one falls in that gap, still open while
    the program runs. Main before: no lead (a per-step read of its own)."""
    from metrics.engines.torch.gaps import EVAL, TRAIN, Note, StepGaps

    gaps = StepGaps()  # to_unix 0: unix seconds are monotonic ns / 1e9
    marks = [10_000 * k for k in range(1, 5)]
    for a in marks:  # an evaluation after every step, the last one after the last step
        gaps.notes.extend([Note(EVAL, "/w/gcn.py:80", "", "GCN.eval()", a + 1_000),
                           Note(TRAIN, "", "", "", a + 5_000)][:1 if a == marks[-1] else 2])
    gaps.intervals(marks, 1)
    assert gaps.lead_around(11_500 / 1e9, 41_500 / 1e9) == "/w/gcn.py:80"
    # (a read after the last step before any work was noted there is no one's)
    assert gaps.lead_around(11_500 / 1e9, 40_500 / 1e9) == ""


def test_records_past_the_last_note_of_an_ended_programs_last_work_are_its():
    """PyG's gin evaluates on two loaders after its last step (two
    model.eval() calls); once the program has ended that work is closed at
    its last note, and the second loader's batches after it were no one's:
    a per_step_data_loading "the step waits for it" inside the evaluation."""
    from metrics.engines.torch.gaps import EVAL, TRAIN, Note, StepGaps

    gaps = StepGaps()
    marks = [10_000 * k for k in range(1, 5)]
    for a in marks:  # each epoch's evaluation: two eval() calls, the last after the last step
        gaps.notes.extend([Note(EVAL, "/w/gin.py:82", "", "GIN.eval()", a + 1_000),
                           Note(EVAL, "/w/gin.py:82", "", "GIN.eval()", a + 3_000),
                           Note(TRAIN, "", "", "", a + 5_000)][:2 if a == marks[-1] else 3])
    gaps.intervals(marks, 1)
    gaps.close_open(marks[-1], len(marks))  # the program ended
    assert gaps.lead_around(11_500 / 1e9, 43_500 / 1e9) == "/w/gin.py:82"  # past 43_000
