"""What the snapshot reads from an engine: :class:`Source`, declared here,
below the engines, so recording never imports them.

Engines feed recording: an engine's adapter (:class:`metrics.engines.base.Engine`
extends this protocol) is handed to :func:`metrics.recording.snapshot.build`
by its caller (``metrics.install()``'s list of installed engines), and the
snapshot calls these methods at scrape time, on the server's (or report's)
thread. Any object with these members is a source: a test can pass one of
its own without an engine.

Example:
    >>> class Quiet:
    ...     name, keeps_readings = "quiet", False
    ...     def devices(self): return []
    ...     def versions(self): return {}
    ...     def extra_readings(self): return (), ()
    ...     def clear_readings(self, counters=True, metrics=True): return None
    ...     def sites(self): return []
    ...     def steps(self): return None
    ...     def blind_spots(self): return []
    ...     def rank(self): return None
    >>> isinstance(Quiet(), Source)
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from metrics.recording.ranks import Rank
from tpu_info.contract.model import (
    CounterReading,
    DeviceRecord,
    DistributionReading,
    SiteReading,
    StepsReading,
)

__all__ = ["Readings", "Source"]

# A source's own counters and distributions, read now.
Readings = tuple[Sequence[CounterReading], Sequence[DistributionReading]]


@runtime_checkable
class Source(Protocol):
    """One engine as the snapshot reads it; every method may raise (the
    snapshot counts the failure in ``HookErrors`` and skips the source)."""

    name: str
    # Whether extra_readings() can return anything (callers skip the merge
    # when no source keeps readings of its own).
    keeps_readings: bool

    def devices(self) -> list[DeviceRecord]:
        """The devices the engine sees, with memory read now."""

    def versions(self) -> dict[str, str]:
        """Library name -> version, for the process record."""

    def extra_readings(self) -> Readings:
        """Counters and distributions the engine keeps itself (torch._lazy,
        torch_xla), merged with the registry's by name (:mod:`metrics.recording.snapshot`)."""

    def clear_readings(self, counters: bool = True, metrics: bool = True) -> None:
        """``metrics.clear_*``: forget the engine's own readings from now on."""

    def sites(self) -> list[SiteReading]:
        """Lines of the user's code that synced or moved data implicitly."""

    def steps(self) -> StepsReading | None:
        """Steps inferred when the program marks none."""

    def blind_spots(self) -> list[str]:
        """What the engine's hook cannot see in this process."""

    def rank(self) -> Rank | None:
        """This process's rank in its job as the engine knows it
        (:mod:`metrics.recording.ranks`)."""
