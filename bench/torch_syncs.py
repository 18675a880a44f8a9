"""Cost of counting reads of tensor values (``.item()``, ``.tolist()``,
``.cpu()``) in torch (CPU), side by side.

    python bench/torch_syncs.py [--smoke]

Three contenders in alternating rounds, one process: torch as it is, a
bare pass-through Python wrapper in the same place (``torch.Tensor.item =
lambda self: original(self)``: the floor any Python hook pays), and the
hook (:mod:`metrics.engines.torch.syncs`, past its first 1,000 reads, which
are each recorded: its steady state, one read in 64 recorded). Prints ns
per call of each and the ratios hooked / unhooked and hooked / bare
wrapper, for ``t.item()`` of a scalar, ``t.tolist()`` of 16 floats and a
compiled MLP step (the "eager" backend) followed by ``loss.item()``.
Target: hooked <= 1.5x the bare wrapper per call.
"""

from __future__ import annotations

import torch
from _common import parser, three_way_report, three_ways

import metrics
from metrics.engines.torch import syncs as torch_syncs

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
    per = three_ways(cases, rounds, lambda which: use(places, which))
    three_way_report("torch_syncs", per, against_bare=True, target=lambda _: 1.5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
