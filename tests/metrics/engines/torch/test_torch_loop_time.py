"""Where a torch.compile'd training loop's time goes (issue 41), on real
torch with Inductor on the CPU: a step during which Dynamo compiled (an
evaluation's first call under ``no_grad`` recompiles the model) is a compile
step, never part of the steady step, as the JAX engine tells it; and the
evaluation (``model.eval()``) and checkpoint (``torch.save``) every N
optimizer steps are named with their line, how often and their time beyond
the usual step, as JAX's periodic work is.

The program runs in its own process (a fresh Dynamo) and is read through the
wire as the CLI reads it; Dynamo's own compilation metrics are the truth.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.hooked import ROOT
from tpu_info.contract.model import Snapshot

pytest.importorskip("torch")

# A training loop (the compiled model, optimizer steps inferred) with an
# evaluation every 50 steps through the same compiled model under no_grad, and
# a checkpoint every 40; the program times both itself.
LOOP = textwrap.dedent('''
    import io, json, time
    import metrics
    metrics.install(engines=["torch_compile"], serve=False)
    import torch
    from torch._dynamo import utils as dynamo_utils

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 64))
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    data = torch.randn(4096, 64)
    state = {"model": model.state_dict(), "extra": torch.randn(32_000_000)}
    spent = {"evaluation": 0.0, "checkpoint": 0.0}  # the work, timed
    walls = {"evaluation": 0.0, "checkpoint": 0.0}  # the intervals between steps it ran in
    ends, ran = [], {}


    def evaluate():
        model.eval()  # LINE eval
        with torch.no_grad():
            for j in range(400):  # ~0.1 s: well above 1 % of the run (the finding's floor)
                k = j % 64
                compiled(data[k * 64:(k + 1) * 64]).pow(2).mean()  # LINE evalcall
        model.train()


    before_loop = 0
    for i in range(200):
        x = data[(i * 64) % 4096:(i * 64) % 4096 + 64]
        loss = compiled(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ends.append(time.perf_counter())
        if i == 0:  # the first step's compiles are set-up: the loop starts after them
            before_loop = len(dynamo_utils.get_compilation_metrics())
        if i % 50 == 25:
            t = time.perf_counter()
            evaluate()
            spent["evaluation"] += time.perf_counter() - t
            ran[i] = "evaluation"
        if i % 40 == 39 and i < 199:  # the last one no later step closes: left out
            t = time.perf_counter()
            torch.save(state, io.BytesIO())  # LINE checkpoint
            spent["checkpoint"] += time.perf_counter() - t
            ran[i] = "checkpoint"
    for i, work in ran.items():
        walls[work] += ends[i + 1] - ends[i]
    in_loop = [m for m in dynamo_utils.get_compilation_metrics()[before_loop:]
               if not m.is_runtime]
    truth = [(m.end_time_us - m.start_time_us) / 1e6 for m in in_loop]
    from tpu_info.wire.fillers import snapshot_to_proto
    print(json.dumps({"proto": snapshot_to_proto(metrics.snapshot()).SerializeToString().hex(),
                      "truth": truth, "spent": spent, "walls": walls}))
''')


# The same loop whose evaluation calls no model.eval(): only torch.no_grad().
NO_EVAL_MODE = LOOP.replace("    model.eval()  # LINE eval\n", "").replace(
    "    model.train()\n", "")


def _run(tmp: Path, source: str) -> tuple[Snapshot, list[float], dict, dict, dict]:
    """The snapshot of ``source``, Dynamo's in-loop compile times, its lines,
    the seconds it timed its evaluations and checkpoints, and the intervals
    between steps they ran in."""
    from tpu_info.proto import tpu_info_v1_pb2 as pb
    from tpu_info.wire.codec import snapshot_from_proto

    prog = tmp / "train.py"
    prog.write_text(source)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(tmp / "rt"))
    r = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True, env=env,
                       cwd=tmp, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    lines = {text.rsplit("# LINE ", 1)[1]: n
             for n, text in enumerate(source.splitlines(), start=1) if "# LINE " in text}
    return (snapshot_from_proto(pb.Snapshot.FromString(bytes.fromhex(out["proto"]))),
            out["truth"], lines, out["spent"], out["walls"])


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[Snapshot, list[float], dict, dict, dict]:
    """What :func:`_run` says of :data:`LOOP`."""
    return _run(tmp_path_factory.mktemp("torch_loop"), LOOP)


@pytest.mark.slow
def test_a_step_that_compiled_is_a_compile_step_not_the_steady_step(loop):
    from tpu_info.views.cost import steady_step_words, steps_of

    s, truth, _, _, _ = loop
    steps = steps_of(s)
    assert steps is not None and steps.count == 200 and "optimizer.step()" in steps.basis
    # The evaluation's first call recompiled the model for no_grad inside the
    # loop: one step held it, and its time is Dynamo's (main before: no
    # compile step, its seconds spread over the 200 steps' "steady" step).
    assert truth and steps.compile_steps == 1, steps
    assert steps.compile_seconds == pytest.approx(sum(truth), rel=0.05, abs=0.005)
    assert steps.steady_seconds_total == pytest.approx(
        steps.seconds_total - steps.compile_seconds - steps.periodic_seconds)
    words = steady_step_words(steps)  # the summary's "steady step X, compiles: Y in 1 step"
    assert words.startswith("compiles: ") and words.endswith(" in 1 step"), words


@pytest.mark.slow
def test_evaluation_and_checkpoint_between_optimizer_steps_are_named(loop):
    from tpu_info.views.cost import steps_of
    from tpu_info.views.findings import find

    s, truth, lines, spent, walls = loop
    found = find(s)
    # Main before: neither was named; their time was the steady step's.
    (ev,) = [f for f in found if f.kind == "periodic_evaluation"]
    (ck,) = [f for f in found if f.kind == "periodic_checkpoint"]
    assert ev.location.endswith(f":{lines['eval']}") and ev.every_steps == pytest.approx(50.0)
    assert ck.location.endswith(f":{lines['checkpoint']}") and ck.every_steps == \
        pytest.approx(40.0)
    assert ev.count == 4 and ck.count == 4 and ev.phase == ck.phase == "periodic"
    # Their time beyond the usual step: at least most of the work as the
    # program timed it, at most the intervals between steps it ran in (the
    # evaluation's recompile is a compile step, not the evaluation's).
    compiled = sum(truth)
    assert 0.8 * (spent["evaluation"] - compiled) <= ev.seconds_lost <= \
        walls["evaluation"] - compiled, (ev.message, spent, walls)
    assert 0.8 * spent["checkpoint"] <= ck.seconds_lost <= walls["checkpoint"], (
        ck.message, spent, walls)
    for f in (ev, ck):
        assert 0 < (f.share_of_run or 0) <= 1.0 and f.seconds_lost <= s.uptime_seconds
    # The steady step leaves them out, and slow_steps does not claim them again.
    steps = steps_of(s)
    assert steps.periodic_seconds == pytest.approx(ev.seconds_lost + ck.seconds_lost)
    for f in found:
        if f.kind == "slow_steps":
            assert "eval()" not in f.message and "torch.save" not in f.message, f.message


@pytest.mark.slow
def test_an_evaluation_under_no_grad_alone_is_named_at_its_call(tmp_path):
    from tpu_info.views.findings import find

    s, truth, lines, spent, walls = _run(tmp_path, NO_EVAL_MODE)
    assert "eval" not in lines
    (ev,) = [f for f in find(s) if f.kind == "periodic_evaluation"]
    # No model.eval(): the compiled model's first call with gradients off after
    # a step leads the gap, at the user's call of it (main before: no finding).
    assert ev.location.endswith(f":{lines['evalcall']}"), ev.message
    assert ev.every_steps == pytest.approx(50.0) and ev.count == 4
    assert 0.8 * (spent["evaluation"] - sum(truth)) <= ev.seconds_lost <= \
        walls["evaluation"] - sum(truth), (ev.message, spent, walls)


# An evaluation that reads each batch's loss (loss.item()) every 50 steps.
READS = textwrap.dedent('''
    import json
    import metrics
    metrics.install(engines=["torch_compile"], serve=False)
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(256, 256))
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    x = torch.ones(256, 256)


    def evaluate():
        model.eval()  # LINE eval
        with torch.no_grad():
            for j in range(200):
                v = compiled(x).pow(2).mean().item()  # LINE evalread
        model.train()


    for i in range(200):
        loss = compiled(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i % 50 == 25:
            evaluate()
    from tpu_info.wire.fillers import snapshot_to_proto
    print(json.dumps({"proto": snapshot_to_proto(metrics.snapshot()).SerializeToString().hex(),
                      "truth": [], "spent": {}, "walls": {}}))
''')


@pytest.mark.slow
def test_an_evaluations_reads_are_its_own(tmp_path):
    from tpu_info.views.findings import find

    s, _, lines, _, _ = _run(tmp_path, READS)
    (read,) = [x for x in s.sites if x.kind == "sync"
               and x.location.endswith(f":{lines['evalread']}")]
    # Main before: the reads were a line of their own, their time in the
    # evaluation's gaps counted twice where a read costs (a GPU's drain).
    assert read.within.endswith(f":{lines['eval']}"), read
    found = find(s)
    (ev,) = [f for f in found if f.kind == "periodic_evaluation"]
    assert f"train.py:{lines['evalread']} ran in it" in ev.message, ev.message
    assert not [f for f in found if f.kind.endswith("_sync")  # (its recompile is its own)
                and (f.location or "").endswith(f":{lines['evalread']}")]
