"""Periodic work in the step loop's gaps named as what it is (issue 41 items 2
and 5): an evaluation every N steps and a checkpoint every 25 steps in
programs that mark no step, each with its line, how often and its measured
time (never above the run); the evaluation's batches periodic and the
training loop's NamedTuple numpy batch per step, counted per leaf as JAX's
transfer guard logs them. Real JAX on the CPU; the A/B wall times are in
bench/tpu_costs.py (``--program eval``, ``--program checkpoint``), not asserted
here (the machine is shared)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by
from tpu_info.contract.model import Phase, SiteReading, Snapshot, StepsReading
from tpu_info.views.breakdown import breakdown
from tpu_info.views.findings import find

ROOT = Path(__file__).resolve().parents[3]

HEAD = '''
import io, json, pickle, sys
from typing import NamedTuple
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp, numpy as np
rng = np.random.default_rng(0)
N = 256
'''
TAIL = PRINT_SNAPSHOT

# A training step fed a NamedTuple of numpy arrays; every 30 steps an
# evaluation (a jitted function whose name does not say so) over 60 numpy
# batches, more calls and about as much time as the training itself.
EVAL = HEAD + '''
class Batch(NamedTuple):
    x: np.ndarray
    y: np.ndarray

@jax.jit
def train_step(w, batch):
    def loss_fn(w):
        return jnp.mean((jnp.tanh(batch.x @ w) @ w - batch.y) ** 2)
    loss, g = jax.value_and_grad(loss_fn)(w)
    return w - 1e-3 * g, loss

@jax.jit
def apply_model(w, x, y):
    return jnp.mean((jnp.tanh(x @ w) @ w - y) ** 2)

w = jnp.asarray(rng.standard_normal((N, N), np.float32) / N ** 0.5)
xs = rng.standard_normal((8, 128, N), np.float32)
ex = rng.standard_normal((60, 128, N), np.float32)
for i in range(300):
    w, loss = train_step(w, Batch(xs[i % 8], xs[(i + 1) % 8]))  # LINE train
    if i % 30 == 29:
        tot = 0.0
        for k in range(60):
            tot = tot + apply_model(w, ex[k], ex[(k + 1) % 60])  # LINE eval
        print(f"eval {float(tot)}", file=sys.stderr)  # LINE evalread
w.block_until_ready()
''' + TAIL

# No mark_step: device_get of the parameters and host work every 25 steps.
CHECKPOINT = HEAD + '''
@jax.jit
def train_step(params, x):
    def loss_fn(p):
        h = x
        for k in sorted(p):
            h = jnp.tanh(h @ p[k])
        return jnp.mean(h ** 2)
    loss, g = jax.value_and_grad(loss_fn)(params)
    return {k: params[k] - 1e-3 * g[k] for k in params}, loss

params = {f"l{i}": jnp.asarray(rng.standard_normal((N, N), np.float32) / N ** 0.5)
          for i in range(8)}
x = jnp.asarray(rng.standard_normal((128, N), np.float32))
for i in range(300):
    params, loss = train_step(params, x)
    if i % 25 == 24:
        host = jax.device_get(params)  # LINE checkpoint
        buf = io.BytesIO()
        for _ in range(15):
            pickle.dump({k: np.array(v) * 1.0 for k, v in host.items()}, buf)
jax.block_until_ready(params)
''' + TAIL

# The checkpoint's loop, but every 25 steps it device_gets the loss (4 bytes)
# and logs it, as dm-haiku's vae example does after its evaluation.
LOSS_GET = CHECKPOINT.split("        host = ")[0] + (
    "        print(jax.device_get(loss).item(), file=sys.stderr)  # LINE log\n"
    "jax.block_until_ready(params)\n") + TAIL


def _run(tmp_path: Path, source: str) -> tuple[Snapshot, dict[str, int]]:
    s = snapshot_printed_by(tmp_path, source)
    lines = {text.rsplit("# LINE ", 1)[1]: n
             for n, text in enumerate(source.splitlines(), start=1) if "# LINE " in text}
    return s, lines


def _at(s: Snapshot, line: int, kind: str) -> SiteReading:
    (site,) = [x for x in s.sites if x.kind == kind and x.location.endswith(f":{line}")]
    return site


@pytest.mark.slow
def test_an_evaluation_every_30_steps_is_named_with_its_line_and_the_batches_phases_are_right(
        tmp_path):
    # Before: steps inferred as jit(apply_model) (more calls), the evaluation's
    # batches "2 times every step ... on the step's critical path", the training
    # batch counted once (at set-up), no evaluation finding.
    s, lines = _run(tmp_path, EVAL)
    assert s.steps is not None and s.steps.count == 300 and "train_step" in s.steps.basis
    train = _at(s, lines["train"], "implicit_to_device")
    assert train.phase == Phase.STEP.value and abs(train.occurrences - 300) <= 1
    assert train.count >= 2 * 300 - 1  # x and y of the NamedTuple: two transfers a step
    batches = _at(s, lines["eval"], "implicit_to_device")
    assert batches.phase == Phase.PERIODIC.value and batches.occurrences < 30
    found = find(s)
    (ev,) = [f for f in found if f.kind == "periodic_evaluation"]
    assert ev.location.endswith(f":{lines['eval']}")
    assert ev.every_steps == pytest.approx(30.0)
    assert 0 < ev.seconds_lost <= s.uptime_seconds and 0 < (ev.share_of_run or 0) <= 1.0
    # its batches and its read are the evaluation's, not findings of their own
    for f in found:
        assert not (f.location or "").endswith((f":{lines['eval']}", f":{lines['evalread']}")) \
            or f.kind == "periodic_evaluation", f.message
    (per_step,) = [f for f in found if f.kind == "per_step_implicit_transfer"]
    assert per_step.location.endswith(f":{lines['train']}") and per_step.per_step == \
        pytest.approx(2.0, abs=0.01)


@pytest.mark.slow
def test_a_checkpoint_every_25_steps_without_mark_step_is_named(tmp_path):
    # Before: "no problems" (slow-step attribution reads only marked steps).
    s, lines = _run(tmp_path, CHECKPOINT)
    assert s.steps is not None and s.steps.source == "inferred"
    (ck,) = [f for f in find(s) if f.kind == "periodic_checkpoint"]
    assert ck.location.endswith(f":{lines['checkpoint']}")
    assert ck.every_steps == pytest.approx(25.0) and ck.count >= 10
    assert 0 < ck.seconds_lost <= s.uptime_seconds


def test_the_views_never_say_more_than_the_run():
    # A hook that measured more gap time than the run (clock trouble, a long
    # stall): the finding is capped at the run.
    ev = SiteReading("call", "/w/train.py:90", 10, detail="jit(apply_model)",
                     phase="periodic", occurrences=10, steps_spanned=270,
                     work="evaluation", gaps=9, gap_seconds=50.0)
    read = SiteReading("sync", "/w/train.py:91", 10, seconds=0.1, detail="float()",
                       phase="periodic", occurrences=10, steps_spanned=270,
                       within="/w/train.py:90", drain_seconds=0.1)
    steps = StepsReading(300, "inferred", "jit(train_step): ...", 1.0, 100.0, 101.0)
    found = find(Snapshot(101.0, uptime_seconds=2.0, sites=(ev, read), steps=steps))
    (f,) = [f for f in found if f.kind == "periodic_evaluation"]
    assert f.seconds_lost == 2.0 and f.share_of_run == 1.0 and f.every_steps == 30.0
    assert "train.py:91" in f.message  # its read is named in it...
    assert not [g for g in found if g.location == read.location]  # ...not on its own


@pytest.mark.slow
def test_a_device_get_of_the_loss_every_25_steps_is_no_checkpoint(tmp_path):
    # Before: "periodic_checkpoint" and "checkpoint" in the time breakdown
    # (hk_vae: "checkpoint 22 ms" in a program that saves nothing). A
    # checkpoint copies bytes of the order of the state the step carries.
    s, lines = _run(tmp_path, LOSS_GET)
    assert s.steps is not None and s.steps.count == 300
    found = find(s)
    assert not [f for f in found if f.kind.endswith("_checkpoint")]
    (get,) = [x for x in s.sites if x.kind == "device_get"
              and x.location.endswith(f":{lines['log']}")]
    assert get.work != "checkpoint" and get.bytes == 4 * get.count
    b = breakdown(s)
    assert b is not None and "checkpoint" not in [p.name for p in b.parts]


def test_an_eager_torch_evaluation_is_not_told_about_recompiles():
    # word_language_model, mnist, makemore, minGPT and ng-video-lecture (issue
    # 41 re-run) compile nothing, yet their evaluation was told "and with the
    # model compiled for it once: an evaluation at another batch size or grad
    # mode recompiles". Said only where torch.compile compiled something.
    from dataclasses import replace

    from tpu_info.contract.model import GraphRecord, ProcessRecord

    ev = SiteReading("eval_mode", "/w/main.py:145", 3, detail="RNNModel.eval()",
                     phase="periodic", occurrences=3, steps_spanned=286,
                     work="evaluation", gaps=3, gap_seconds=1.4)
    steps = StepsReading(429, "inferred", "backward(): 429 calls", 27.8, 100.0, 130.0)
    eager = Snapshot(131.0, ProcessRecord(1, "main.py", engine="torch_compile"),
                     uptime_seconds=30.6, sites=(ev,), steps=steps)
    (f,) = [f for f in find(eager) if f.kind == "periodic_evaluation"]
    assert "Evaluate less often" in f.message and "recompile" not in f.message, f.message
    graph = GraphRecord("a" * 64, "compile(GPT.forward)", "torch_compile", 100.0, 130.0,
                        compiles=2, compile_seconds_total=2.9, executions=461)
    (g,) = [f for f in find(replace(eager, graphs=(graph,)))
            if f.kind == "periodic_evaluation"]
    assert "compiled for it once" in g.message, g.message
    # makemore's evaluate() is @torch.inference_mode() already: not told to add it.
    assert "inference_mode" in f.message and "inference_mode" in g.message
    ran = replace(ev, detail="RNNModel.eval() under inference_mode")
    for snap in (replace(eager, sites=(ran,)), replace(eager, sites=(ran,), graphs=(graph,))):
        (h,) = [f for f in find(snap) if f.kind == "periodic_evaluation"]
        assert "torch.inference_mode()" not in h.message, h.message
        assert "Evaluate less often or on fewer batches" in h.message


def test_the_count_beside_each_gaps_time_is_the_gaps_and_the_one_after_the_loop_apart():
    # jax_mnist (issue 41 re-run): an evaluation after each of 10 epochs, the
    # last after the loop's last step, in no gap: "10 times, 225 ms each ...
    # over 9 gap(s)" (the 9 gaps' time over 9, the count 10). The count said
    # beside each gap's time is the gaps'; the occurrence after the loop apart.
    ev = SiteReading("sync", "/w/prog.py:96", 10, detail="format()/f-string",
                     phase="periodic", occurrences=10, steps_spanned=423,
                     work="evaluation", gaps=9, gap_seconds=2.0,
                     first_seen_unix=1002.0, last_seen_unix=1019.5)
    steps = StepsReading(470, "inferred", "jit(update): ...", 9.6, 1000.0, 1019.0)
    (f,) = [f for f in find(Snapshot(1020.0, uptime_seconds=20.0, sites=(ev,), steps=steps))
            if f.kind == "periodic_evaluation"]
    # The one after the loop is in the run's share at the timed ones' mean
    # (ais_textcls: 2 evaluations, 1 in a gap, ~30 % of its loop: 4.7 % said).
    assert "(9 times, 222 ms each, 11% of run time, and once more after the last step, in no " \
        "gap to time (in the share at 222 ms each); measured: " in f.message, f.message
    assert "10 times" not in f.message and f.count == 9
    assert f.seconds_lost == pytest.approx(2.0 / 9 * 10)
    assert f.every_steps == pytest.approx(47.0)
    # Every occurrence in a gap: nothing said apart.
    inside = SiteReading("sync", "/w/prog.py:96", 9, detail="format()/f-string",
                         phase="periodic", occurrences=9, steps_spanned=376,
                         work="evaluation", gaps=9, gap_seconds=2.0, last_seen_unix=1018.0)
    (g,) = [f for f in find(Snapshot(1020.0, uptime_seconds=20.0, sites=(inside,),
                                     steps=steps)) if f.kind == "periodic_evaluation"]
    assert "(9 times, 222 ms each, " in g.message and "more" not in g.message.split(".")[0]
