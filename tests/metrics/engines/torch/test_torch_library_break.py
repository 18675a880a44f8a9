"""A graph break inside torch's own code under the user's line: the
compiled function calls ``opt.step()``, and torch's Optimizer wrapper breaks
its own graph on purpose (``torch._dynamo.graph_break()`` in
``torch/optim/optimizer.py``). pytorch/tutorials' compiling_optimizer
recipe: said as a warning "User-inserted graph break ... Rewrite that line
so it can be traced" at ``opt.step()``, which cannot be rewritten; all its
steps cost ~1 % of the run. It must name torch's own line and never tell
the user to rewrite theirs."""

from __future__ import annotations

import pytest

from tests.lines import line_of

torch = pytest.importorskip("torch")


def test_torch_s_own_break_is_not_the_user_s_to_rewrite():
    import metrics
    from tpu_info.views.findings import find

    rec = metrics.install(engines=["torch_compile"], serve=False)
    rec.reset()
    torch._dynamo.reset()
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.ones(4, 8)).sum().backward()

    @torch.compile(backend="eager")
    def step():
        opt.step()  # the user's line

    for _ in range(3):
        step()
    breaks = [f for f in find(metrics.snapshot()) if f.kind == "graph_break"]
    assert breaks, "no graph break seen"
    line = line_of(__file__, "opt.step()  # the user's line")
    for f in breaks:
        assert f.location and f.location.endswith(f":{line}"), f.location
        assert "inside torch's own code at optimizer.py:" in f.message, f.message
        assert "Rewrite that line" not in f.message and f.severity == "info", f.message
