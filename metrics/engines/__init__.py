"""Engine adapters: one module per engine, loaded only when needed.

``import metrics`` never imports an engine: :func:`load` imports the adapter
(and thereby the engine) only when ``metrics.install()`` finds the engine
already imported by the program or is asked for it by name.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from tpu_info.model import DeviceRecord

# engine name -> (adapter module, the module whose presence in sys.modules
# means the program uses that engine)
#
# Auto-detection for PyTorch: ``torch`` imported -> ``torch_compile`` (its
# hooks cost nothing until torch.compile runs); ``torch._lazy.ts_backend``
# imported (the program called ``torch._lazy.ts_backend.init()``) ->
# ``torch_lazy``; ``torch_xla`` imported -> ``torch_xla``, which then
# replaces ``torch_lazy``: both read the same lazy-tensor counters.
ENGINES: dict[str, tuple[str, str]] = {
    "jax": ("metrics.engines.jax", "jax"),
    "torch_compile": ("metrics.engines.torch_compile", "torch"),
    "torch_lazy": ("metrics.engines.torch_lazy", "torch._lazy.ts_backend"),
    "torch_xla": ("metrics.engines.torch_xla", "torch_xla"),
}

# engine -> engines that, when detected too, make it redundant
SUPERSEDED_BY: dict[str, tuple[str, ...]] = {
    "torch_lazy": ("torch_xla",),
}


class Engine(Protocol):
    """What ``install()`` and the snapshot builder need of an adapter."""

    name: str
    degraded: list[str]

    def install(self) -> None: ...
    def uninstall(self) -> None: ...
    def devices(self) -> list[DeviceRecord]: ...
    def versions(self) -> dict[str, str]: ...

    # Optional: engines that keep their own counters (torch._lazy, torch_xla)
    # also define ``extra_readings() -> (counters, distributions)``, read at
    # scrape time and merged into the snapshot (see ``metrics.snapshot``),
    # and ``clear_readings()``, called by ``metrics.clear_*``.
    # Optional diagnosis, read at scrape time (see ``metrics.snapshot.diagnosis``):
    # ``sites() -> list[SiteReading]`` (lines of the user's code that synced or
    # moved data implicitly, locations resolved now), ``steps() ->
    # StepsReading | None`` (steps inferred when the program marks none) and
    # ``blind_spots() -> list[str]`` (what the engine's hook cannot see here).


def valid_names() -> list[str]:
    return sorted(ENGINES)


def _imported(module: str) -> bool:
    """``module`` is imported and its body finished: one still importing (torch
    finishing inside ``import torch_xla``) is waited for, never half-loaded.
    A module whose post-import callback is running (its body ran, importlib
    still marks it initializing) counts as imported."""
    from metrics import importwatch

    return importwatch.ready(module)


def detect() -> list[str]:
    """Engines whose library the program has already imported."""
    found = [name for name, (_, module) in ENGINES.items() if _imported(module)]
    return [n for n in found if not any(s in found for s in SUPERSEDED_BY.get(n, ()))]


def load(name: str) -> Any:
    """The adapter module for ``name``; imports the engine itself."""
    module, _ = ENGINES[name]
    return importlib.import_module(module)
