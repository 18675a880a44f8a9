"""A graph break Dynamo cannot resume from in programs shaped like real
ones: an ``nn.LSTM`` after other layers inside a module, trained with an
optimizer, compiled as ``model = torch.compile(model)`` and as
``@torch.compile`` on a function that calls the module. Dynamo compiles
the frame up to the LSTM and runs the rest eagerly ("cannot resume from
..., skipping the rest of the function"); that must read as
``graph_break_unresumable`` with the measured eager time and Dynamo's hint,
never as an ordinary break to "rewrite"."""

from __future__ import annotations

import time

import pytest

from tests.lines import line_of

torch = pytest.importorskip("torch")

STEPS = 12
REST_SLEEP_S = 0.004  # in the eager rest of forward, so its measured time has a floor


class Tagger(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Linear(8, 16)
        self.lstm = torch.nn.LSTM(16, 32, batch_first=True)
        self.head = torch.nn.Linear(32, 1)

    def forward(self, x):
        h = torch.relu(self.emb(x))
        out, _ = self.lstm(h)  # the LSTM after a compiled part
        time.sleep(REST_SLEEP_S)
        return self.head(out[:, -1])


def _line_of(text: str) -> int:
    return line_of(__file__, text)


def _run(shape: str):
    import metrics
    from tpu_info.views import findings

    rec = metrics.install(engines=["torch_compile"], serve=False)
    rec.reset()
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Tagger()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 6, 8), torch.randn(4, 1)
    if shape == "module":
        model = torch.compile(model, backend="eager")

        def loss_of(x, y):
            return torch.nn.functional.mse_loss(model(x), y)
    else:
        @torch.compile(backend="eager")
        def loss_of(x, y):
            return torch.nn.functional.mse_loss(model(x), y)
    for _ in range(STEPS):
        loss = loss_of(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    snap = metrics.snapshot()
    out = snap, list(findings.find(snap)), rec.registry.metric_data("EagerFallbackTime")
    rec.reset()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["module", "function"])
def test_lstm_after_a_compiled_part_is_unresumable_with_measured_eager_time(shape):
    snap, found, eager = _run(shape)
    where = f"test_torch_unresumable.py:{_line_of('# the LSTM after a compiled part')}"
    assert [f.kind for f in found if where in (f.location or "")] == [
        "graph_break_unresumable"], found
    (f,) = [f for f in found if f.kind == "graph_break_unresumable"]
    assert "compiles the function up to that line and runs the rest of it eagerly" in f.message
    assert "allow_rnn=True" in f.message and "Rewrite that line" not in f.message
    assert "measured" in f.message and "[unresumable" not in f.message
    # Every call after the first (which compiled) is timed; its eager rest
    # holds the sleep, and not the compiled graphs.
    count, total_ns = eager[0], eager[1]
    assert count == STEPS - 1
    assert total_ns / count >= REST_SLEEP_S * 1e9
    # The first call's rest compiled, so it is not timed: STEPS - 1 rests over STEPS steps.
    assert f.seconds_per_step is not None
    assert f.seconds_per_step >= REST_SLEEP_S * (STEPS - 1) / STEPS
    assert f.seconds_per_step <= snap.steps.seconds_per_step
