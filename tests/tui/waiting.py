"""Waiting for the app to draw what a test reads.

One ``pilot.pause()`` lets the app handle what is queued, which is enough on
a quiet machine; under the loaded suite (``tools/loaded_suite.py``) a mount's
first draw or a pushed screen can land some pauses later.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tests.conftest import patient


async def until_drawn(pilot: Any, cond: Callable[[], object], timeout: float = 30.0,
                      why: Callable[[], str] = lambda: "") -> None:
    """Pauses ``pilot`` until ``cond()`` is true; fails after ``timeout``
    seconds (stretched by the load) with ``why()``."""
    end = time.monotonic() + patient(timeout)
    while True:
        await pilot.pause(0.05)
        if cond():
            return
        if time.monotonic() > end:
            raise AssertionError(f"not drawn within {patient(timeout):.0f} s {why()}")
