"""The ``torch_xla`` adapter: PyTorch/XLA on PJRT, read at scrape time.

:func:`create` makes the :class:`TorchXlaEngine` (``metrics.install()``
calls it): :mod:`.engine` reads torch_xla's counters, metrics and devices;
:mod:`.analyses` turns the compile analyses torch_xla writes with
``PT_XLA_DEBUG_LEVEL=1`` (parsed by :mod:`.debug`) into the graph ledger,
each placed in its step.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from metrics.engines.torch.xla.engine import ENGINE, TorchXlaEngine, create, graph_hash

__all__ = ["ENGINE", "TorchXlaEngine", "create", "graph_hash"]

# torch_xla is imported with the engine, on first use of these names: the
# debug parser (:mod:`.debug`) stays importable where torch_xla is not installed.


def __getattr__(name: str) -> object:
    if name in __all__:
        return getattr(importlib.import_module("metrics.engines.torch.xla.engine"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
