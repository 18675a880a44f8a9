"""Cost of counting reads of tensor values (``.item()``, ``.tolist()``,
``.cpu()``) in torch (CPU), side by side.

    python bench/torch_syncs.py [--smoke]

Three contenders in alternating rounds, one process: torch as it is, a
bare pass-through Python wrapper in the same place (``torch.Tensor.item =
lambda self: original(self)``: the floor any Python hook pays), and the
hook (:mod:`metrics.engines.torch_syncs`, past its first 1,000 reads, which
are each recorded: its steady state, one read in 64 recorded). Prints ns
per call of each and the ratios hooked / unhooked and hooked / bare
wrapper, for ``t.item()`` of a scalar, ``t.tolist()`` of 16 floats and a
compiled MLP step (the "eager" backend) followed by ``loss.item()``.
Target: hooked <= 1.5x the bare wrapper per call.
"""

from __future__ import annotations

import os
import timeit

import torch
from _common import median, parser, verdict

import metrics
from metrics.engines import torch_syncs

NAMES = ("item", "tolist", "cpu")


def contenders() -> list[dict[str, object]]:
    """(unhooked, bare wrapper, hooked) methods of torch.Tensor, by name."""
    hooked = {n: getattr(torch.Tensor, n) for n in NAMES}
    plain = {n: hooked[n].__wrapped__ for n in NAMES}

    def bare(name: str, original: object) -> object:
        # The cheapest pass-through of the same signature as the hook's.
        if name == "cpu":
            def method(self, *args, **kwargs):  # type: ignore[no-untyped-def]
                return original(self, *args, **kwargs)  # type: ignore[operator]
        else:
            def method(self):  # type: ignore[no-untyped-def]
                return original(self)  # type: ignore[operator]
        return method

    return [plain, {n: bare(n, plain[n]) for n in NAMES}, hooked]


def use(places: list[dict[str, object]], which: int) -> None:
    for name, method in places[which].items():
        setattr(torch.Tensor, name, method)


def main() -> int:
    args = parser(__doc__).parse_args()
    rounds, n = (3, 2_000) if args.smoke else (15, 40_000)
    metrics.install(engines=["torch_compile"], serve=False)
    torch_syncs._hook.exact_left = 0  # the steady state: past the first 1,000 reads
    places = contenders()
    scalar, small = torch.tensor(3.0), torch.arange(16.0)
    model = torch.compile(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                              torch.nn.Linear(64, 1)), backend="eager")
    x = torch.randn(64, 32)

    def step() -> None:
        model(x).mean().item()

    cases = {"t.item()": (lambda: scalar.item(), n),
             "t.tolist() (16 floats)": (lambda: small.tolist(), n // 2),
             "compiled step + loss.item()": (step, n // 100)}
    for fn, _ in cases.values():
        fn()
    per: dict[str, list[tuple[float, float, float]]] = {k: [] for k in cases}
    for _ in range(rounds):
        for name, (fn, reps) in cases.items():
            got = [0.0, 0.0, 0.0]
            for which in (0, 1, 2, 2, 1, 0):  # each order once per round
                use(places, which)
                got[which] += timeit.timeit(fn, number=reps) / reps / 2 * 1e9
            per[name].append((got[0], got[1], got[2]))
    use(places, 2)
    load = os.getloadavg()[0]
    for name, rows in per.items():
        plain, bare = median([r[0] for r in rows]), median([r[1] for r in rows])
        hooked = median([r[2] for r in rows])
        print(f"{name}: unhooked {plain:.0f} ns, bare wrapper {bare:.0f} ns, "
              f"hooked {hooked:.0f} ns (load average {load:.2f})")
    for name, rows in per.items():
        vs_plain = median([r[2] / r[0] for r in rows])
        vs_bare = median([r[2] / r[1] for r in rows])
        print(f"{name}: hooked / unhooked {vs_plain:.3f}")
        verdict(f"torch_syncs {name} hooked / bare wrapper", vs_bare, "<= 1.5", vs_bare <= 1.5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
