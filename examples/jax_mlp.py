"""A small JAX MLP training loop with the tpu-info hook installed.

    python examples/jax_mlp.py --steps 200

The last batch of each epoch is one row short, as with a data set whose size
is not a multiple of the batch: the hook sees the recompile it causes, names
the argument and the source line, and says what to do.
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

import metrics


def init(key: jax.Array, sizes: tuple[int, ...]) -> list[tuple[jax.Array, jax.Array]]:
    params = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        key, sub = jax.random.split(key)
        params.append((jax.random.normal(sub, (n_in, n_out)) * n_in**-0.5, jnp.zeros(n_out)))
    return params


def loss_fn(params, x, y):  # type: ignore[no-untyped-def]
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return jnp.mean((x @ w + b - y) ** 2)


@jax.jit
def train_step(params, x, y):  # type: ignore[no-untyped-def]
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return [(w - 0.01 * gw, b - 0.01 * gb) for (w, b), (gw, gb) in zip(params, grads)], loss


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps-per-epoch", type=int, default=50)
    ap.add_argument("--report", choices=("full", "short", "none"), default="full")
    args = ap.parse_args(argv)

    metrics.install()
    step = metrics.track(train_step)
    rng = np.random.default_rng(0)
    params = init(jax.random.PRNGKey(0), (64, 128, 128, 1))
    loss = None
    for i in range(args.steps):
        last_of_epoch = (i + 1) % args.steps_per_epoch == 0
        n = args.batch - 1 if last_of_epoch else args.batch
        x = jax.device_put(rng.standard_normal((n, 64), dtype=np.float32))
        y = jax.device_put(rng.standard_normal((n, 1), dtype=np.float32))
        params, loss = step(params, x, y)
        metrics.mark_step()
    print(f"final loss {float(jax.device_get(loss)):.4f} after {args.steps} steps", file=sys.stderr)
    if args.report == "full":
        print(metrics.metrics_report())
    elif args.report == "short":
        print(metrics.short_metrics_report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
