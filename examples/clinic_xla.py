"""A torch_xla training loop with five classic mistakes, for the tpu-info clinic.

Runs in torch_xla's own environment (``make xla-env``), on any PJRT device:

    PJRT_DEVICE=CPU python examples/clinic_xla.py                  # metrics.install() first
    PJRT_DEVICE=CPU python examples/clinic_xla.py --install after  # after `import torch_xla`
    PJRT_DEVICE=CPU tpu-info run -- python examples/clinic_xla.py --install none

Each mistake is marked ``# MISTAKE(kind)`` on the line that makes it; the
tests (tests/system/test_clinic_xla.py) check that tpu-info names each one with that
line, and that torch_xla's normal warm-up (step 0 and step 1 compile
different graphs) is not reported as a mistake.
"""

from __future__ import annotations

import argparse
import sys


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--install", choices=("first", "after", "none"), default="first",
                    help="when to call metrics.install() (none: under `tpu-info run`)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--report", action="store_true", help="print metrics_report() at the end")
    return ap.parse_args(argv)


ARGS = _parse(sys.argv[1:])
if ARGS.install == "first":  # the hook before the engine: hooked when torch_xla's import finishes
    import metrics

    metrics.install()

import torch  # noqa: E402
import torch_xla  # noqa: E402

if ARGS.install == "after":
    import metrics

    metrics.install()

ROWS, BATCH, FEATURES = 100, 16, 8  # 100 = 6 x 16 + 4: a short last batch


def main() -> int:
    torch.manual_seed(0)
    dev = torch_xla.device()
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 1)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)  # state from step 1
    x_all, y_all = torch.randn(ROWS, FEATURES), torch.randn(ROWS, 1)
    kept = []
    for epoch in range(ARGS.epochs):
        for start in range(0, ROWS, BATCH):
            xb = x_all[start:start + BATCH].to(dev)
            yb = y_all[start:start + BATCH].to(dev)
            loss = torch.nn.functional.mse_loss(model(xb), yb)  # MISTAKE(short_last_batch)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if loss.item() > 100.0:  # MISTAKE(value_before_sync) reads before the sync
                break
            torch_xla.sync()
            kept.append(model[0].weight.cpu())  # MISTAKE(per_step_transfer)
            picked = torch.nonzero(yb > 0)  # MISTAKE(cpu_fallback) no XLA lowering
        with torch.no_grad():
            test = model(x_all[:40].to(dev))  # MISTAKE(eval_shape) another batch size
            torch_xla.sync()
        print(f"epoch {epoch}: test {test.mean().item():.4f} picked {picked.shape[0]}",
              file=sys.stderr)
    if ARGS.report:
        import metrics

        print(metrics.metrics_report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
