"""A JAX training loop with six classic mistakes, for the tpu-info clinic.

    python examples/clinic_jax.py                    # metrics.install() first
    python examples/clinic_jax.py --install after    # after `import jax`
    tpu-info run -- python examples/clinic_jax.py --install none

Each mistake is marked ``# MISTAKE(kind)`` on the line that makes it; the
tests (tests/system/test_clinic_jax.py) check that tpu-info names each one with that
line and its cost, and gives advice that fits. The program itself calls
neither ``metrics.track`` nor ``metrics.mark_step``: the hook must see what
it does on its own.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--install", choices=("first", "after", "none"), default="first",
                    help="when to call metrics.install() (none: under `tpu-info run`)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--report", action="store_true", help="print metrics_report() at the end")
    ap.add_argument("--hold", action="store_true",
                    help="stay alive after the loop until a line arrives on stdin "
                         "(for `tpu-info` to read the running program)")
    return ap.parse_args(argv)


ARGS = _parse(sys.argv[1:])
MODE = ARGS.install
if MODE == "first":  # the hook before the engine: hooked when jax's import finishes
    import metrics

    metrics.install()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

if MODE == "after":
    import metrics

    metrics.install()

ROWS, BATCH, FEATURES = 1000, 64, 32  # 1000 = 15 x 64 + 40: a short last batch


def init(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (FEATURES, 64)) * 0.1, "b1": jnp.zeros(64),
            "w2": jax.random.normal(k2, (64, 1)) * 0.1, "b2": jnp.zeros(1)}


def predict(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


@jax.jit
def train_step(params, x, y):  # type: ignore[no-untyped-def]
    def loss_fn(p):  # type: ignore[no-untyped-def]
        return jnp.mean((predict(p, x) - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), loss


@partial(jax.jit, static_argnames="epoch")
def augment(x, epoch):  # type: ignore[no-untyped-def]
    return x * (1.0 + 0.01 * epoch)


@jax.jit
def decay(params, factor):  # type: ignore[no-untyped-def]
    return jax.tree.map(lambda p: p * factor, params)


def accuracy(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> float:
    # Not jitted: every operation below compiles on its own the first time.
    pred = predict(params, x)
    err = jnp.abs(pred - y)
    close = jnp.where(err < 0.5, 1.0, 0.0)
    return float(jnp.mean(close))


def main() -> int:
    rng = np.random.default_rng(0)
    x_all = rng.standard_normal((ROWS, FEATURES), dtype=np.float32)
    y_all = (x_all[:, :1] * 0.5).astype(np.float32)
    x_test = jnp.asarray(x_all[:200])
    y_test = jnp.asarray(y_all[:200])
    params = init(jax.random.PRNGKey(0))
    total = 0.0
    for epoch in range(ARGS.epochs):
        for start in range(0, ROWS, BATCH):
            xb = jnp.asarray(x_all[start:start + BATCH])  # MISTAKE(implicit_transfer)
            yb = y_all[start:start + BATCH]
            xb = augment(xb, epoch=epoch)  # MISTAKE(static_argument)
            params, loss = train_step(params, xb, yb)  # MISTAKE(short_last_batch) numpy yb
            total += float(loss)  # MISTAKE(per_step_sync)
        factor = 0.999 if epoch == 0 else jnp.float32(0.999)
        params = decay(params, factor)  # MISTAKE(weak_type)
        acc = accuracy(params, x_test, y_test)  # MISTAKE(eager_ops)
        print(f"epoch {epoch}: mean loss {total / (epoch + 1) / 16:.4f} accuracy {acc:.2f}",
              file=sys.stderr)
    if ARGS.report:
        import metrics

        print(metrics.metrics_report(), flush=True)
    if ARGS.hold:
        print("holding: press Enter to exit", file=sys.stderr, flush=True)
        sys.stdin.readline()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
