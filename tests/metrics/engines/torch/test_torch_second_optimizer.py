"""A program that builds a new model and optimizer for a second run (pyg's
GAT benchmark with --runs 2, the transfer-learning tutorial's two models;
evaluation of PyTorch programs s12): the gaps followed the first optimizer
only, and at the program's end its last gap took all of the second run, "27 s
of per-step evaluation" where the evaluations took 3 s. The second optimizer
takes the loop over once it has stepped with the first one done; its
evaluations are gaps too. Real torch, each program in its own process."""

from __future__ import annotations

import textwrap

import pytest

torch = pytest.importorskip("torch")

TWO_RUNS = textwrap.dedent('''
    import json, time
    import metrics
    metrics.install(engines=["torch_compile"], serve=False)
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    x, big = torch.randn(32, 128), torch.randn(256, 128)
    spent = []

    def evaluate(model):
        model.eval()
        with torch.no_grad():  # LINE evaluate
            for _ in range(10):
                model(big).pow(2).mean().item()
        model.train()

    for run in range(2):
        model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Tanh(),
                                    torch.nn.Linear(256, 128))
        opt = torch.optim.Adam(model.parameters(), 1e-3)
        for step in range(60):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            if step % 10 == 9:
                t = time.perf_counter()
                evaluate(model)
                spent.append(time.perf_counter() - t)
    from tpu_info.wire.fillers import snapshot_to_proto
    print(json.dumps({"proto": snapshot_to_proto(metrics.snapshot()).SerializeToString().hex(),
                      "spent": spent}))
''')


@pytest.mark.slow
def test_a_second_runs_optimizer_takes_the_loop_over(tmp_path) -> None:
    from tests.metrics.engines.torch.test_torch_eager_gaps import _run
    from tpu_info.views.findings import find

    live, saved, lines, spent = _run(tmp_path, TWO_RUNS)
    for s in (live, saved):
        evals = [f for f in find(s) if f.kind in ("periodic_evaluation", "per_step_evaluation")]
        assert evals, [f.message for f in find(s)]
        cost = sum(f.seconds_lost or 0.0 for f in evals)
        # Its evaluations' own time (12, timed in the program): not the
        # second run's training with them (the first optimizer's last gap).
        assert cost <= 2.0 * sum(spent) + 0.05, ([f.message for f in evals], spent)
        assert max(f.count for f in evals) >= 9, [f.message for f in evals]
