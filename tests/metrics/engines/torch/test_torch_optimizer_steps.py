"""A PyTorch program's training step is its optimizer's step: a nanoGPT-shaped
loop under torch.compile (four micro-steps of gradient accumulation per
optimizer step, evaluation every few steps, ``loss.item()`` every iteration)
and an eager loop with no compiled graph at all (real torch on the CPU, the
"eager" backend)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

STEPS, ACCUM, EVAL_EVERY, EVAL_BATCHES = 24, 4, 8, 2
EAGER_STEPS, SLOW_EVERY, SLOW_S = 40, 10, 0.25


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 256)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def _line_of(text: str) -> int:
    with open(__file__) as f:
        for i, line in enumerate(f, 1):
            if text in line and "_line_of" not in line:
                return i
    raise AssertionError(text)


def _site(snap, text: str):
    (site,) = [s for s in snap.sites if s.kind == "sync"
               and s.location == f"{__file__}:{_line_of(text)}"]
    return site


def _gpt_loop() -> None:
    torch.manual_seed(0)
    model = torch.compile(Net(), backend="eager")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32), torch.randn(16, 256)
    for it in range(STEPS):
        if it % EVAL_EVERY == 0:  # nanoGPT's estimate_loss(): no_grad, model.eval()
            model.eval()
            with torch.no_grad():
                for _ in range(EVAL_BATCHES):
                    model(x).mean().item()  # estimate_loss: losses[k] = loss.item()
            model.train()
        for _ in range(ACCUM):
            loss = torch.nn.functional.mse_loss(model(x), y) / ACCUM
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        lossf = loss.item() * ACCUM  # nanoGPT: log every iteration
    assert lossf > 0


def _eager_loop() -> None:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x, y = torch.randn(128, 32), torch.randn(128, 256)
    total = 0.0
    for _ in range(EAGER_STEPS):
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += loss.item()  # word_language_model: total_loss += loss.item()
        rows = out.detach().tolist()  # every prediction read back each batch
    assert len(rows) == 128 and total > 0


def _run(loop):
    import metrics
    from tpu_info.views import findings

    rec = metrics.install(engines=["torch_compile"], serve=False)
    rec.reset()
    torch._dynamo.reset()
    threads = torch.get_num_threads()
    # One thread: on a loaded machine, a parallel region waits for its other
    # thread to be scheduled, so steps slow down many times and reads do not.
    torch.set_num_threads(1)
    try:
        loop()
    finally:
        torch.set_num_threads(threads)
    snap = metrics.snapshot()
    rec.reset()
    return snap, list(findings.find(snap))


@pytest.fixture(scope="module")
def gpt():
    return _run(_gpt_loop)


@pytest.fixture(scope="module")
def eager():
    return _run(_eager_loop)


def test_steps_are_optimizer_steps_not_micro_steps(gpt):
    steps = gpt[0].steps
    # Before: 96, one per micro-step (the compiled graph's calls with gradients on).
    assert steps.source == "inferred" and steps.count == STEPS
    assert steps.basis.startswith(f"optimizer.step(): {STEPS} calls (AdamW)")
    assert (f"the compiled model (compile(Net.forward)) ran {STEPS * ACCUM} times, "
            f"{ACCUM:.1f} per step (gradient accumulation)") in steps.basis
    evals = (STEPS + EVAL_EVERY - 1) // EVAL_EVERY * EVAL_BATCHES
    assert steps.excluded_calls == evals
    assert f"its {evals} calls with gradients off (evaluation) are not steps" in steps.basis
    assert 0 < steps.seconds_total and steps.first_unix < steps.last_unix
    assert steps.seconds_total == pytest.approx(steps.last_unix - steps.first_unix, rel=1e-4)


def test_a_read_every_iteration_is_once_per_step(gpt):
    from tpu_info.views.sites import not_raised

    snap, _ = gpt
    site = _site(snap, "# nanoGPT: log every iteration")
    assert site.count == STEPS and site.count / snap.steps.count == pytest.approx(1.0)
    assert site.phase == "step"  # before: "periodic" (24 reads over 96 "steps")
    # A few microseconds a read on a CPU, but every step: named as info for what
    # it costs where the device runs ahead (before: counted, not raised).
    assert not_raised(snap)[snap.sites.index(site)] == ""
    (f,) = [f for f in gpt[1] if f.kind == "per_step_sync" and f.location == site.location]
    assert f.severity in ("info", "warning") and "every step" in f.message


def test_reads_in_each_evaluation_are_periodic_not_per_step(gpt):
    # nanoGPT's estimate_loss() reads each evaluation batch's loss: 2 reads in
    # each of 3 evaluations over 24 steps. Before, 6 reads of 24 steps... and
    # with more batches (10 a time, as nanoGPT) "2 times every step".
    snap, found = gpt
    site = _site(snap, "# estimate_loss")
    evals = (STEPS + EVAL_EVERY - 1) // EVAL_EVERY
    assert site.count == evals * EVAL_BATCHES and site.occurrences == evals
    assert site.phase == "periodic"
    assert not [f for f in found if f.location == site.location and f.kind == "per_step_sync"]


def test_an_eager_program_has_its_optimizer_steps(eager):
    snap, _ = eager
    steps = snap.steps  # before: None (no compiled graph, no mark_step)
    assert steps is not None and steps.count == EAGER_STEPS and steps.excluded_calls == 0
    assert steps.basis.startswith(f"optimizer.step(): {EAGER_STEPS} calls (SGD)")
    first_read = _site(snap, "# word_language_model").first_seen_unix
    assert steps.first_unix < first_read < steps.last_unix + 1e-3


def test_eager_reads_every_batch_are_per_step(eager):
    snap, found = eager
    assert _site(snap, "# word_language_model").phase == "step"
    line = _line_of("# every prediction read back each batch")
    (f,) = [f for f in found if f.kind == "per_step_sync"
            and f.location == f"{__file__}:{line}"]
    assert f.per_step == pytest.approx(1.0) and "every step" in f.message


SLOW_PROGRAM = f"""
import json, time
import metrics
metrics.install(engines=["torch_compile"], serve=False)
import torch
from tpu_info.views import findings
torch.set_num_threads(1)
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
for it in range({EAGER_STEPS}):
    model(torch.ones(2, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    if (it + 1) % {SLOW_EVERY} == 0:
        time.sleep({SLOW_S})  # a checkpoint every {SLOW_EVERY} steps
s = metrics.snapshot()
d = s.distribution("StepTime")
print(json.dumps({{"count": d.count if d else None, "basis": s.steps.basis,
                  "slow": [f.count for f in findings.find(s) if f.kind == "slow_steps"]}}))
"""


@pytest.mark.slow
def test_slow_steps_from_optimizer_intervals_when_none_is_marked():
    # Its own process: whether anything else marks steps (torch._lazy's backend
    # loaded by another test) must not decide it.
    import json

    from tests.conftest import run_python

    r = run_python(SLOW_PROGRAM, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["count"] == EAGER_STEPS - 1
    assert out["basis"].endswith("; the time between steps is StepTime (the program "
                                 "marks no step)")
    (slow,) = out["slow"]
    assert slow >= EAGER_STEPS // SLOW_EVERY - 1  # the last one ends the loop


def test_marked_steps_win_and_keep_step_time_their_own():
    import metrics

    rec = metrics.install(engines=["torch_compile"], serve=False)
    rec.reset()
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x = torch.randn(8, 32)
    for _ in range(12):
        for _ in range(2):
            model(x).sum().backward()
            opt.step()
        metrics.mark_step()
    snap = metrics.snapshot()
    assert snap.steps.source == "marked" and snap.steps.count == 12
    assert snap.distribution("StepTime").count == 11  # the marks' intervals only
    rec.reset()


def test_a_compiled_optimizer_step_is_not_broken_by_the_hook():
    """Dynamo traces the step's post hooks: the hook must not put a graph
    break into a compiled optimizer step (it returns while compiling)."""
    import metrics

    rec = metrics.install(engines=["torch_compile"], serve=False)
    rec.reset()
    torch._dynamo.reset()
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)

    @torch.compile(backend="eager")
    def step():
        opt.step()

    for _ in range(12):
        model(torch.ones(2, 32)).sum().backward()
        step()
    snap = metrics.snapshot()
    assert not [e for e in snap.events if e.kind == "graph_break" and "monotonic" in e.detail]
    assert snap.steps is None or not snap.steps.basis.startswith("optimizer.step()")
    rec.reset()


def test_uninstall_removes_the_optimizer_hook():
    from torch.optim import optimizer

    import metrics

    def ours():
        return [h for h in optimizer._global_optimizer_post_hooks.values()
                if getattr(h, "__module__", "") == "metrics.engines.torch.optim"]

    metrics.install(engines=["torch_compile"], serve=False)
    assert len(ours()) == 1
    assert hasattr(torch.autograd.backward, "__wrapped__")  # backward() counted
    metrics.uninstall()
    assert ours() == []
    assert not hasattr(torch.autograd.backward, "__wrapped__")
    rec = metrics.install(engines=["torch_compile"], serve=False)
    assert len(ours()) == 1
    rec.reset()


def test_weights_updated_by_hand_take_their_steps_from_backward():
    """pytorch/examples' word_language_model updates its weights by hand and
    reads loss.item() every batch: no optimizer steps, so backward() calls
    are the steps, and the read is per step."""
    import metrics
    from tpu_info.views import findings

    rec = metrics.install(engines=["torch_compile"], serve=False)
    rec.reset()
    model = torch.nn.Linear(256, 256)
    x = torch.randn(64, 256)
    total = 0.0
    for _ in range(30):
        model.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.01)
        total += loss.item()  # by hand: read every batch
    snap = metrics.snapshot()
    rec.reset()
    assert snap.steps.count == 30 and snap.steps.basis.startswith("backward(): 30 calls"), \
        snap.steps
    (site,) = [x for x in snap.sites if x.kind == "sync" and x.detail == "item()"]
    assert site.phase == "step"
    assert not [f for f in findings.find(snap) if "steps are not known" in f.message]


def _lbfgs_loop(steps: int) -> None:
    """pytorch/examples' time_sequence_prediction: LBFGS.step(closure), its
    closure calling backward() (and reading the loss) up to 20 times a step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.8)
    x, y = torch.randn(64, 16), torch.randn(64, 1)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.item()
        loss.backward()
        return loss

    for _ in range(steps):
        opt.step(closure)


def test_a_closure_optimizers_backward_calls_are_not_steps():
    """Main before: 'backward(): 60 calls (no torch.optim optimizer stepped:
    the weights are updated by hand)', while LBFGS stepped 3 times."""
    import metrics

    rec = metrics.install(engines=["torch_compile"], serve=False)
    rec.reset()
    _lbfgs_loop(3)
    snap = metrics.snapshot()
    rec.reset()
    assert snap.steps.count == 3, snap.steps
    basis = snap.steps.basis
    assert basis.startswith("optimizer.step(): 3 calls (LBFGS; backward() ran "), basis
    inner = int(basis.split("backward() ran ")[1].split()[0].replace(",", ""))
    assert 3 < inner <= 3 * 25, basis  # up to max_iter (20) + 1 evaluations a step
    assert "by hand" not in basis


def test_an_optimizer_that_stepped_too_few_times_is_named_not_denied():
    """Backward() calls outside any step are the steps when the optimizer
    stepped fewer than 10 times (20 micro-steps of gradient accumulation a
    step): the basis says it stepped, and how often."""
    import metrics

    rec = metrics.install(engines=["torch_compile"], serve=False)
    rec.reset()
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for _ in range(3):
        for _ in range(20):
            model(torch.ones(2, 32)).sum().backward()
        opt.step()
        opt.zero_grad()
    snap = metrics.snapshot()
    rec.reset()
    assert snap.steps.basis.startswith(
        "backward(): 60 calls (SGD stepped 3 times, fewer than the 10 a step loop is inferred "
        "from)"), snap.steps.basis


def _layer_after_layer(interleaved: bool) -> tuple[float, float]:
    """pytorch/examples' mnist_forward_forward: each layer its own Adam, layer
    1's 20 steps all done, then layer 2's (``interleaved``: a GAN's two, in
    turn every iteration). The unix times the loop began and ended."""
    import time

    torch.manual_seed(0)
    layers = [torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)]
    opts = [torch.optim.Adam(layer.parameters(), lr=1e-3) for layer in layers]
    x = torch.randn(16, 32)
    order = [0, 1] * 20 if interleaved else [0] * 20 + [1] * 20
    start = time.time()
    for k in order:
        opts[k].zero_grad()
        layers[k](x).pow(2).mean().backward()
        opts[k].step()
    return start, time.time()


def test_optimizers_that_stepped_one_after_another_are_all_the_steps():
    """Main before: 'optimizer.step(): 20 calls (Adam, the most stepped of 2
    optimizers)', the loop from layer 2's first step (the Time line's
    "steps 22 %" in mnist_forward_forward)."""
    import metrics

    rec = metrics.install(engines=["torch_compile"], serve=False)
    rec.reset()
    start, end = _layer_after_layer(interleaved=False)
    seq = metrics.snapshot().steps
    rec.reset()
    _layer_after_layer(interleaved=True)
    gan = metrics.snapshot().steps
    rec.reset()
    assert seq.count == 40, seq
    assert seq.basis.startswith(
        "optimizer.step(): 40 calls (Adam, Adam: 2 optimizers, one after another)"), seq.basis
    # the loop from layer 1's first step to layer 2's last
    assert start - 0.05 <= seq.first_unix < seq.last_unix <= end + 1e-3, (seq, start, end)
    assert seq.seconds_total >= 0.8 * (seq.last_unix - seq.first_unix)
    # stepped in the same span: one optimizer's steps, as before
    assert gan.count == 20 and "the most stepped of 2 optimizers" in gan.basis, gan.basis
