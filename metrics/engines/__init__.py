"""Engine adapters: one module per engine, loaded only when needed.

``import metrics`` never imports an engine: :func:`load` imports the adapter
(and thereby the engine) only when ``metrics.install()`` finds the engine
already imported by the program or is asked for it by name.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Protocol

from tpu_info.model import DeviceRecord

# engine name -> (adapter module, the top-level module whose presence means
# the program uses that engine)
ENGINES: dict[str, tuple[str, str]] = {
    "jax": ("metrics.engines.jax", "jax"),
}


class Engine(Protocol):
    """What ``install()`` and the snapshot builder need of an adapter."""

    name: str
    degraded: list[str]

    def install(self) -> None: ...
    def uninstall(self) -> None: ...
    def devices(self) -> list[DeviceRecord]: ...
    def versions(self) -> dict[str, str]: ...


def valid_names() -> list[str]:
    return sorted(ENGINES)


def detect() -> list[str]:
    """Engines whose library the program has already imported."""
    return [name for name, (_, module) in ENGINES.items() if module in sys.modules]


def load(name: str) -> Any:
    """The adapter module for ``name``; imports the engine itself."""
    module, _ = ENGINES[name]
    return importlib.import_module(module)
