"""Attribute patches of engine internals, checked before and undone after.

Each adapter owns one :class:`Patches`: ``apply`` replaces an attribute only
when it exists and, if asked, its parameters start as expected (otherwise the
feature degrades and the reason is kept in ``degraded``); ``restore`` undoes
every patch in reverse order.

Example:
    >>> import types
    >>> mod = types.SimpleNamespace(f=lambda x: x)
    >>> p = Patches([])
    >>> p.apply(mod, "f", lambda orig: (lambda x: orig(x) + 1))
    True
    >>> mod.f(1), p.restore(), mod.f(1)
    (2, None, 1)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


class Patches:
    """Patches applied by one engine adapter; reasons for skipped ones go to
    ``degraded`` (the adapter's list, shared)."""

    def __init__(self, degraded: list[str]) -> None:
        self.degraded = degraded
        # (owner, attribute, original), in the order applied.
        self._applied: list[tuple[object, str, object]] = []

    def apply(self, owner: object, attr: str, make: Callable[[Any], Any],
              params: tuple[str, ...] = ()) -> bool:
        """Replaces ``owner.attr`` with ``make(original)`` (its ``__wrapped__``
        set to the original); False when skipped."""
        if isinstance(owner, type):  # a method defined on that very class
            original = owner.__dict__.get(attr)
        else:
            original = getattr(owner, attr, None)
        if original is None:
            self.degraded.append(f"{getattr(owner, '__name__', owner)}.{attr} missing")
            return False
        if params:
            try:
                have = tuple(inspect.signature(original).parameters)
            except (TypeError, ValueError):
                have = ()
            if have[: len(params)] != params:
                self.degraded.append(f"{attr} has an unexpected signature")
                return False
        wrapper = make(original)
        if not hasattr(wrapper, "__wrapped__"):  # what inspect and debuggers unwrap
            try:
                wrapper.__wrapped__ = original
            except (AttributeError, TypeError):
                pass
        setattr(owner, attr, wrapper)
        self._applied.append((owner, attr, original))
        return True

    def add(self, owner: object, attr: str, original: object) -> None:
        """Records a patch the adapter applied itself, so restore undoes it."""
        self._applied.append((owner, attr, original))

    def has(self, attr: str) -> bool:
        return any(a == attr for _, a, _ in self._applied)

    def restore(self) -> None:
        """Undoes every patch, newest first."""
        for owner, attr, original in reversed(self._applied):
            setattr(owner, attr, original)
        self._applied.clear()
