"""A torch.compile training loop with five classic mistakes, for the tpu-info clinic.

    python examples/clinic_torch.py                    # metrics.install() first
    python examples/clinic_torch.py --install after    # after `import torch`
    tpu-info run -- python examples/clinic_torch.py --install none

Each mistake is marked ``# MISTAKE(kind)`` on the line that makes it; the
tests (tests/system/test_clinic_torch.py) check that tpu-info names each one with that
line and its cost, and gives advice that fits. ``--backend aot_eager``
skips Inductor's code generation (what the tests use: a cold Inductor
compile takes about 20 s on a 2-core machine); ``TORCHINDUCTOR_CACHE_DIR``
shared by two runs gives the warm-cache case.
"""

from __future__ import annotations

import argparse
import sys


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--install", choices=("first", "after", "none"), default="first",
                    help="when to call metrics.install() (none: under `tpu-info run`)")
    ap.add_argument("--backend", default="inductor", help="torch.compile backend")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--report", action="store_true", help="print metrics_report() at the end")
    return ap.parse_args(argv)


ARGS = _parse(sys.argv[1:])
if ARGS.install == "first":  # the hook before the engine: hooked when torch's import finishes
    import metrics

    metrics.install()

import torch  # noqa: E402
from torch import nn  # noqa: E402

if ARGS.install == "after":
    import metrics

    metrics.install()

ROWS, BATCH, FEATURES = 200, 32, 16  # 200 = 6 x 32 + 8: a short last batch


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, 32)
        self.fc2 = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        if h.mean().item() > 10.0:  # MISTAKE(graph_break) reads a value inside the graph
            h = h / 2
        return self.fc2(h) * scale


def main() -> int:
    torch.manual_seed(0)
    x_all = torch.randn(ROWS, FEATURES)
    y_all = x_all[:, :1] * 0.5
    model, lstm = Net(), nn.LSTM(FEATURES, FEATURES, batch_first=True)
    step_fn = torch.compile(model, backend=ARGS.backend)
    encode = torch.compile(lstm, backend=ARGS.backend)  # Dynamo cannot trace an LSTM
    opt = torch.optim.SGD([*model.parameters(), *lstm.parameters()], lr=0.05)
    for epoch in range(ARGS.epochs):
        model.train()
        for i, start in enumerate(range(0, ROWS, BATCH)):
            xb, yb = x_all[start:start + BATCH], y_all[start:start + BATCH]
            xb = encode(xb.unsqueeze(1))[0].squeeze(1)  # MISTAKE(graph_break_unresumable)
            scale = 1.0 + 0.25 * (i % 3)
            out = step_fn(xb, scale)  # MISTAKE(short_last_batch) MISTAKE(python_scalar)
            loss = torch.mean((out - yb) ** 2)
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            test = step_fn(x_all[:BATCH], 1.0)  # MISTAKE(grad_mode) eval through the train graph
        print(f"epoch {epoch}: loss {loss.item():.4f} test {test.mean().item():.4f}",
              file=sys.stderr)
    if ARGS.report:
        import metrics

        print(metrics.metrics_report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
