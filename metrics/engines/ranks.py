"""Which rank of its job this process is: read from the engine at scrape time.

A host exporter labels every series with ``process_index`` so a fleet query
can name the rank that differs. Each engine says it its own way:
``jax.process_index()`` / ``jax.process_count()``, ``torch.distributed``'s
rank and world size once a process group exists, torch_xla's global
ordinal and world size; ``$RANK`` / ``$WORLD_SIZE`` (set by torchrun and
most launchers) is the fallback when no engine knows. Every probe is a
few attribute reads and calls, made only when a snapshot is built, and
never raises (a failing probe is "unknown").

Example:
    >>> from_environment({"RANK": "3", "WORLD_SIZE": "8"})
    Rank(index=3, count=8, source='env')
    >>> from_environment({}) is None
    True
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import NamedTuple


class Rank(NamedTuple):
    """A process's rank among ``count`` processes (None: not said), and who said it."""

    index: int
    count: int | None
    source: str


def _int(text: str | None) -> int | None:
    if text is None or not text.strip().isdigit():
        return None
    return int(text)


def from_environment(environ: Mapping[str, str] | None = None) -> Rank | None:
    """``$RANK`` (else ``$LOCAL_RANK`` only when it is the whole world:
    ``$WORLD_SIZE`` == ``$LOCAL_WORLD_SIZE``) with ``$WORLD_SIZE``."""
    env = os.environ if environ is None else environ
    count = _int(env.get("WORLD_SIZE"))
    index = _int(env.get("RANK"))
    if index is None and count is not None and count == _int(env.get("LOCAL_WORLD_SIZE")):
        index = _int(env.get("LOCAL_RANK"))
    if index is None:
        return None
    return Rank(index, count if count is not None and count > index else None, "env")


def from_jax() -> Rank | None:
    """``jax.process_index()`` of an imported jax (0 of 1 without
    ``jax.distributed.initialize``: that is the truth for one process)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    try:
        return Rank(int(jax.process_index()), int(jax.process_count()), "jax")
    except Exception:  # noqa: BLE001 - no backend yet, or a plugin that refuses
        return None


def from_torch_distributed() -> Rank | None:
    """``torch.distributed``'s rank once the program made a process group."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        return Rank(int(dist.get_rank()), int(dist.get_world_size()), "torch.distributed")
    except Exception:  # noqa: BLE001
        return None


def from_torch_xla() -> Rank | None:
    """torch_xla's global ordinal (``torch_xla.runtime``), where it is loaded."""
    runtime = sys.modules.get("torch_xla.runtime")
    try:
        if runtime is None:
            return None
        return Rank(int(runtime.global_ordinal()), int(runtime.world_size()), "torch_xla")
    except Exception:  # noqa: BLE001 - no PJRT client yet
        return None
