"""The ``torch_compile`` adapter: torch.compile (Dynamo) watched from outside.

:func:`create` makes the :class:`TorchCompileEngine` (``metrics.install()``
calls it). Its parts share one :class:`~.context.CompileContext` (and the
installed one is :data:`.context.ACTIVE`, where the process-wide patches
find it): :mod:`.engine` (install, readings), :mod:`.dynamo` (the patches
of torch.compile and Dynamo), :mod:`.record` (what each Dynamo event
becomes in the recorder), :mod:`.graphs` (what a compiled graph reads as),
:mod:`.guards` (guard failures as typed causes), :mod:`.breaks` (graph
breaks: names, details, the Python across them), :mod:`.eager` (the time
after Dynamo gave up on a frame), :mod:`.backward` (backward graphs
compiled at ``backward()``) and :mod:`.steps` (steps from compiled calls).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from metrics.engines.torch.compile.engine import ENGINE, TorchCompileEngine, create

__all__ = ["ENGINE", "TorchCompileEngine", "create"]

# torch is imported with the engine, on first use of these names: the
# guard-failure parser (:mod:`.guards`) needs no torch.


def __getattr__(name: str) -> object:
    if name in __all__:
        return getattr(importlib.import_module("metrics.engines.torch.compile.engine"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
