"""A torch program's DataLoader batches, timed at the user's ``for`` line
(:mod:`metrics.engines.torch.loader`): pytorch/examples' vae decodes and
transforms each sample in the training process (``num_workers=0``), 24-25 %
of its loop by A/B, and nothing timed it.

In this process: the main thread's batches are sites at the ``for`` line,
on the recorder's journal (folded before a read, cleared at a reset, a
fold's error counted); another thread's loader is not timed. As a program
(real torch on the CPU, its own process): the finding's cost per step is
the loader's time measured unhooked in the same program, within a loose
factor; a loader with two worker processes runs under the hook and says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tests.hooked import ROOT

torch = pytest.importorskip("torch")


class Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int):
        return torch.full((4,), float(i))


def _line_of(text: str) -> int:
    with open(__file__) as f:
        for i, line in enumerate(f, 1):
            if text in line and "_line_of" not in line:
                return i
    raise AssertionError(text)


@pytest.fixture
def rec():
    import metrics

    r = metrics.install(engines=["torch_compile"], serve=False)
    r.reset()
    yield r
    r.reset()


def _loaders(snap):
    return [x for x in snap.sites if x.kind == "data_loader"]


def test_the_main_threads_batches_are_timed_at_its_for_line(rec):
    import metrics

    loader = torch.utils.data.DataLoader(Squares(), batch_size=4)
    for _ in range(2):
        for batch in loader:  # LINE main-for
            assert batch.shape == (4, 4)
    (site,) = _loaders(metrics.snapshot())
    assert site.location == f"{__file__}:{_line_of('# LINE main-for')}"
    assert site.count == 10 and site.detail.startswith("num_workers=0") and site.seconds > 0
    assert site.first_seen_unix <= site.last_seen_unix
    # Main before: no data_loader site at all (nothing timed the DataLoader).


def test_a_loader_iterated_from_another_thread_is_not_timed(rec):
    import metrics

    got = []
    loader = torch.utils.data.DataLoader(Squares(), batch_size=4)
    t = threading.Thread(target=lambda: got.extend(loader))
    t.start()
    t.join()
    assert len(got) == 5
    assert not _loaders(metrics.snapshot())


def test_batches_fold_on_the_recorders_journal(rec):
    import metrics
    from metrics.engines.torch.compile.context import ACTIVE

    engine = next(e for e in metrics.installed_engines() if hasattr(e, "loader"))
    times = engine.loader
    assert ACTIVE.ctx is engine.ctx and times.journal in rec._journals
    loader = torch.utils.data.DataLoader(Squares(), batch_size=5)
    assert len(list(loader)) == 4
    assert len(times.queue) == 12  # three fields a batch, waiting for a read
    assert [x.count for x in _loaders(metrics.snapshot())] == [4]
    assert not times.queue
    rec.reset()  # forgets the batches; the iterators' sites stay, zeroed
    assert not _loaders(metrics.snapshot())
    errors = rec.registry.counter_value("HookErrors") or 0
    times.queue.extend((object(), 1, 2))  # a record the fold cannot take
    assert not _loaders(metrics.snapshot())  # counted by the journal's guard, not raised
    assert rec.registry.counter_value("HookErrors") == errors + 1


# A vae-shaped program: a Dataset whose __getitem__ does per-sample Python
# work (a transform in pure Python), num_workers=0, a small model trained on
# it, and tested after every epoch (model.eval(), a test loader of 5
# batches). An epoch is drawn unhooked before and after, to time the loader
# alone (their mean: on a loaded machine one epoch's time drifts).
PROGRAM = textwrap.dedent('''
    import json, sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset

    torch.manual_seed(0)
    torch.set_num_threads(1)
    WORKERS = int(sys.argv[1])


    class Digits(Dataset):
        def __len__(self):
            return 32 * 30

        def __getitem__(self, i):
            row = [((i * 31 + j * 17) % 255) / 255.0 for j in range(784)]  # per-sample work
            row = [min(1.0, max(0.0, (v - 0.5) * 1.2 + 0.5)) for v in row]
            return torch.tensor(row), i % 10


    loader = DataLoader(Digits(), batch_size=32, shuffle=True, num_workers=WORKERS)


    def unhooked_epoch():
        t = time.perf_counter()
        n = sum(1 for _ in loader)
        return (time.perf_counter() - t) / n, n


    before, n = unhooked_epoch()
    test_loader = DataLoader(torch.utils.data.Subset(Digits(), range(320)), batch_size=64)

    import metrics
    metrics.install(engines=["torch_compile"], serve=False)
    model = torch.nn.Sequential(torch.nn.Linear(784, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), 1e-3)


    def test():
        model.eval()
        with torch.no_grad():
            for x, y in test_loader:  # LINE test
                model(x)
        model.train()


    for epoch in range(2):
        for x, y in loader:  # LINE for
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        test()
    from tpu_info.wire.fillers import snapshot_to_proto
    proto = snapshot_to_proto(metrics.snapshot()).SerializeToString().hex()
    metrics.uninstall()
    after, _ = unhooked_epoch()
    print(json.dumps({"proto": proto, "unhooked": (before + after) / 2, "batches": n}))
''')


def _run(tmp: Path, workers: int):
    from tpu_info.proto import tpu_info_v1_pb2 as pb
    from tpu_info.wire.codec import snapshot_from_proto

    prog = tmp / "train.py"
    prog.write_text(PROGRAM)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(tmp / "rt"),
               OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, str(prog), str(workers)], capture_output=True,
                       text=True, env=env, cwd=tmp, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    lines = {text.rsplit("# LINE ", 1)[1]: f"{prog}:{n}"
             for n, text in enumerate(PROGRAM.splitlines(), start=1) if "# LINE " in text}
    snap = snapshot_from_proto(pb.Snapshot.FromString(bytes.fromhex(out["proto"])))
    return snap, lines, out


@pytest.mark.slow
def test_per_sample_loading_in_the_training_process_is_a_finding(tmp_path):
    from tpu_info.views.breakdown import breakdown
    from tpu_info.views.data_loading import not_raised
    from tpu_info.views.findings import find

    snap, lines, out = _run(tmp_path, 0)
    line = lines["for"]
    site, test = sorted(_loaders(snap), key=lambda x: x.location != line)
    assert site.location == line and site.detail.startswith("num_workers=0"), site
    assert site.count == 2 * out["batches"] and site.phase == "step", site
    [f] = [f for f in find(snap) if f.kind == "per_step_data_loading"]
    assert f.location == line, f.message
    # Main before: no finding (nothing timed the DataLoader). Its cost per
    # step is the loader's own time per batch, measured unhooked here.
    unhooked = out["unhooked"]
    assert 0.4 * unhooked <= (f.seconds_per_step or 0) <= 2.5 * unhooked, (f.message, unhooked)
    assert (f.share_of_step or 0) >= 0.2, f.message  # the loop is mostly loading
    b = breakdown(snap)
    assert b is not None and "data loading" in {p.name for p in b.step_parts}, b.lines()
    # The test loader's batches are the evaluation's, not the step's.
    assert test.location == lines["test"] and test.count == 10, test
    assert not_raised(snap, test), test


@pytest.mark.slow
def test_a_loader_with_worker_processes_runs_under_the_hook(tmp_path):
    snap, lines, out = _run(tmp_path, 2)
    (site,) = [x for x in _loaders(snap) if x.location == lines["for"]]
    assert site.detail == f"num_workers=2, cores={len(os.sched_getaffinity(0))}", site
    assert site.count == 2 * out["batches"], site
    assert snap.counter("HookErrors") == 0
