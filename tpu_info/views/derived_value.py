"""A value an output shows, or why it cannot: :class:`Derived`, and :class:`Row`,
which builds one row's values and lists the ``(where, reason)`` of each N/A.

Every row of :mod:`tpu_info.views.derived` and :mod:`tpu_info.views.device_rows`
is made of these, so an N/A says the same why in every output.

Example:
    >>> r = Row("devices/tpu0")
    >>> r.get("busy", None, "libtpu did not answer").text()
    'N/A'
    >>> r.na
    [('devices/tpu0/busy', 'libtpu did not answer')]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from tpu_info.views.values import NA

T = TypeVar("T")
U = TypeVar("U")


@dataclass(frozen=True, slots=True)
class Derived(Generic[T]):
    """A value an output shows, or why it cannot.

    ``value`` None with a ``reason`` is an N/A; None without one means the
    value does not apply (tables show ``-``).
    """

    value: T | None = None
    reason: str = ""

    @classmethod
    def of(cls, value: T | None, reason: str) -> Derived[T]:
        """``value``, or the missing value with ``reason``."""
        return cls(value) if value is not None else cls(None, reason)

    def text(self, fmt: Callable[[T], str] = str) -> str:  # type: ignore[assignment]
        """``fmt(value)``, ``N/A`` when missing, ``-`` when it does not apply."""
        if self.value is not None:
            return fmt(self.value)
        return NA if self.reason else "-"


class Row:
    """Builds one row's values and the ``(where, reason)`` of each N/A in it."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.na: list[tuple[str, str]] = []

    def get(self, name: str, value: U | None, reason: str, applies: bool = True) -> Derived[U]:
        """``value``; else an N/A for ``reason`` (listed in :attr:`na`), or,
        when it does not ``apply``, a ``-``."""
        if value is not None:
            return Derived(value)
        if not applies:
            return Derived()
        self.na.append((f"{self.where}/{name}" if name else self.where, reason))
        return Derived(None, reason)
