"""Steps inferred from torch.compile's compiled graphs when the program
marks none (real torch on the CPU, the "eager" backend)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture
def rec():
    import metrics

    r = metrics.install(engines=["torch_compile"], serve=False)
    r.reset()
    torch._dynamo.reset()
    yield r
    r.reset()


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)

    def forward(self, x):
        return self.fc(x).tanh()


def test_unmarked_loop_infers_steps_from_the_dominant_graph(rec):
    import metrics

    model = torch.compile(Net(), backend="eager")
    small = torch.compile(lambda t: t.sum(), backend="eager")
    x = torch.ones(64, 32)
    for i in range(25):
        out = model(x)
        if i % 5 == 0:
            small(out)
    steps = metrics.snapshot().steps
    assert steps is not None and steps.source == "inferred" and steps.count == 25
    assert steps.basis == ("compile(Net.forward): the compiled graph with the most time "
                           "(25 calls)")
    metrics.mark_step()
    assert metrics.snapshot().steps.source == "marked"  # a marked step wins
