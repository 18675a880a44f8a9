"""Parameters whose gradients ``backward()`` computes but no optimizer steps:
a frozen network left with ``requires_grad`` on (a style transfer's or a
perceptual loss's VGG, a frozen feature extractor whose head alone is
optimized).

yunjey's neural_style_transfer optimizes one image through a VGG19 whose 20 M
weights still require grad: every ``backward()`` computes their gradients,
which nothing reads; ``vgg.requires_grad_(False)`` saved 50-55 % of the loop
by A/B (s11's evaluation round), and the tool said nothing.

How: once, at the :data:`CHECK_AT`-th ``backward()`` after the first
optimizer's step (the wrapper :mod:`metrics.engines.torch.optim` puts on
``torch.autograd.backward``), the autograd graph just run is walked from its
roots (``grad_fn`` and ``next_functions``, at most :data:`MAX_NODES` nodes)
to its ``AccumulateGrad`` nodes: the leaves that got gradients. The
``nn.Parameter`` leaves that are in no optimizer's ``param_groups`` (every
optimizer that stepped until then) are the unused ones; plain tensors (an
input whose gradient the program reads: FGSM's) are never counted. Read out
as one ``unused_gradients`` site at the user's line that called
``backward()``. Nothing on the hot path but a countdown per ``backward()``
until the check (and a set insert per optimizer step until then).
"""

from __future__ import annotations

import weakref
from typing import Any

from metrics.engines._frames import frames_for, skip_prefixes
from tpu_info.contract.model import Phase, SiteKind, SiteReading

CHECK_AT = 5  # the backward() after the first optimizer step that is walked
MAX_NODES = 200_000  # autograd nodes walked, at most


class UnusedGrads:
    """The one check and its result."""

    def __init__(self) -> None:
        self.left = CHECK_AT  # backward() calls after the first step until the check
        self.optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        self.result: SiteReading | None = None

    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any], now_unix: float) -> None:
        """Walks the graph ``torch.autograd.backward(*args, **kwargs)`` ran."""
        import torch

        tensors = args[0] if args else kwargs.get("tensors")
        roots = tensors if isinstance(tensors, (list, tuple)) else [tensors]
        stack = [t.grad_fn for t in roots if isinstance(t, torch.Tensor)]
        seen: set[int] = set()
        leaves: dict[int, torch.Tensor] = {}
        while stack and len(seen) < MAX_NODES:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            v = getattr(node, "variable", None)
            if v is not None:  # AccumulateGrad: a leaf that gets a gradient
                leaves[id(v)] = v
                continue
            stack.extend(n for n, _ in getattr(node, "next_functions", ()))
        held = {id(p) for o in list(self.optimizers) for g in o.param_groups for p in g["params"]}
        unused = [v for k, v in leaves.items()
                  if k not in held and isinstance(v, torch.nn.Parameter)]
        if not unused or not held:
            return
        mine = [v for k, v in leaves.items() if k in held]
        used = sum(v.numel() for v in mine)
        n = sum(v.numel() for v in unused)
        shapes = ", ".join(str(list(v.shape)) for v in sorted(unused, key=lambda v: -v.numel())[:2])
        line = frames_for(skip_prefixes()).user_line(depth=3)
        self.result = SiteReading(
            kind=SiteKind.UNUSED_GRADIENTS.value,
            location=line.location if line is not None else "<backward>:0",
            count=len(unused), bytes=sum(v.numel() * v.element_size() for v in unused),
            detail=f"{n:,} elements, the largest {shapes}; the optimizers' own: {used:,}",
            timed_bytes=sum(v.numel() * v.element_size() for v in mine),
            first_seen_unix=now_unix, last_seen_unix=now_unix, phase=Phase.STEP.value,
            occurrences=1)

    def sites(self) -> list[SiteReading]:
        """The check's ``unused_gradients`` site, if it found any."""
        return [self.result] if self.result is not None else []
