"""libtpu's duty cycle, read inside the program from libtpu's monitoring SDK.

On a TPU host ``from libtpu.sdk import tpumonitoring`` imports in the
process that holds the chips, and ``tpumonitoring.get_metric(
"duty_cycle_pct").data()`` returns one value per chip (strings of percents).
Where it does, a TPU device's busy % is the chip's duty cycle, marked
``busy_source="libtpu"``; where it returns ``[]`` (the gVisor sandbox of the
TPU machine returned ``[]`` for every metric), fails, or is missing, the
hook's own estimate stays, marked ``"estimate"``. HBM is not read here:
``memory_stats()`` is exact, and the SDK's ``hbm_capacity_usage`` adds
nothing to it.

The SDK is asked at scrape time (the server's thread, never the training
thread), at most every :data:`EVERY_S` seconds; a scrape that finds another
one asking uses the last answer instead of waiting. Its answer counts for
:data:`STALE_S` seconds. Nothing is imported until a TPU device is seen; every
exception is counted (``errors``, and ``on_error``: the hook's
``HookErrors``) and swallowed.

Example:
    >>> sdk = DutyCycle(load=lambda: None)
    >>> sdk.per_chip(), sdk.why
    ((), 'libtpu.sdk.tpumonitoring is not importable here')
"""

from __future__ import annotations

import importlib
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from tpu_info.contract.model import BUSY_FROM_ESTIMATE, BUSY_FROM_LIBTPU, DeviceRecord

EVERY_S = 5.0  # the SDK is asked at most this often
STALE_S = 15.0  # an answer older than this is dropped (the estimate returns)
METRIC = "duty_cycle_pct"
MAX_CHIPS = 4096  # a longer answer is not a host's chips


def load_monitoring() -> Any | None:
    """libtpu's monitoring module (``tpumonitoring``, older ``monitoring``), or
    None where libtpu has no SDK."""
    try:
        sdk = importlib.import_module("libtpu.sdk")
    except ImportError:
        return None
    return getattr(sdk, "tpumonitoring", None) or getattr(sdk, "monitoring", None)


class DutyCycle:
    """libtpu's duty cycle per chip, asked of its SDK at most every ``every_s``.

    Args:
        every_s: seconds between asks.
        clock: a monotonic clock (tests step it).
        load: returns the SDK's monitoring module or None (tests inject one).
        on_error: ``on_error(where, exception)`` for each failure (the
            recorder's ``hook_failed``); failures are counted in
            :attr:`errors` either way.
    """

    def __init__(self, every_s: float = EVERY_S, *, clock: Callable[[], float] = time.monotonic,
                 load: Callable[[], Any | None] = load_monitoring,
                 on_error: Callable[[str, BaseException], None] | None = None) -> None:
        self.every_s = every_s
        self.clock = clock
        self._load = load
        self.on_error = on_error
        self.errors = 0
        self.asks = 0  # times the SDK was asked (a test's and a bench's count)
        self.why = ""  # why the last ask gave no duty cycle ("" when it gave one)
        self._module: Any | None = None
        self._gone = False  # no SDK here: never asked again
        self._values: tuple[float, ...] = ()
        self._read_at = -math.inf
        self._asked_at = -math.inf
        self._lock = threading.Lock()

    def per_chip(self) -> tuple[float, ...]:
        """The duty cycle of each chip (percent, libtpu's order), or () when the
        SDK gave none lately. Asks the SDK when due and no other thread is."""
        now = self.clock()
        if not self._gone and now - self._asked_at >= self.every_s \
                and self._lock.acquire(blocking=False):
            try:
                self._asked_at = now
                self._ask(now)
            finally:
                self._lock.release()
        return self._values if now - self._read_at <= STALE_S else ()

    def _ask(self, now: float) -> None:
        try:
            if self._module is None:
                self._module = self._load()
                if self._module is None:
                    self._gone, self.why = True, "libtpu.sdk.tpumonitoring is not importable here"
                    return
            self.asks += 1
            data = self._module.get_metric(METRIC).data()
            values = _percents(data)
        except Exception as e:  # noqa: BLE001 - the SDK must never hurt the program
            self.errors += 1
            self.why = f"libtpu's SDK failed: {e!r}"[:200]
            self._values = ()
            if self.on_error is not None:
                try:
                    self.on_error("jax.libtpu_sdk", e)
                except Exception:  # noqa: BLE001
                    pass
            return
        if values is None:
            self._values, self.why = (), f"libtpu's SDK returned no usable {METRIC} ({_show(data)})"
            return
        self._values, self._read_at, self.why = values, now, ""


def _show(data: object) -> str:
    return repr(data)[:60]


def _percents(data: object) -> tuple[float, ...] | None:
    """``data()``'s strings or numbers as percents; None when empty or when any
    is not a finite number in 0..100 (then none of them is trusted)."""
    if not isinstance(data, Sequence) or isinstance(data, str | bytes) \
            or not 0 < len(data) <= MAX_CHIPS:
        return None
    out = []
    for x in data:
        try:
            v = float(x)
        except (TypeError, ValueError):
            return None
        if not (math.isfinite(v) and 0.0 <= v <= 100.0):
            return None
        out.append(v)
    return tuple(out)


def with_duty_cycle(records: list[DeviceRecord], per_chip: Sequence[float]) -> list[DeviceRecord]:
    """``records`` with each TPU device's busy % from its chip's duty cycle.

    libtpu's k-th value is its k-th chip; chips hold the TPU devices in id
    order, the same number each (one on v4 and later, two cores on v2/v3).
    Where the counts do not divide, which device is which chip cannot be
    told and every record keeps its estimate. Records whose busy % stays the
    hook's estimate are marked so.
    """
    tpus = sorted((r for r in records if r.platform == "tpu"), key=lambda r: r.id)
    per = len(tpus) // len(per_chip) if per_chip and tpus else 0
    duty: dict[int, float] = {}
    if per and per * len(per_chip) == len(tpus):
        duty = {r.id: per_chip[k // per] for k, r in enumerate(tpus)}
    out = []
    for r in records:
        if r.platform == "tpu" and r.id in duty:
            out.append(replace(r, busy_percent=duty[r.id], busy_reason="",
                               busy_source=BUSY_FROM_LIBTPU))
        elif r.busy_percent is not None and not r.busy_source:
            out.append(replace(r, busy_source=BUSY_FROM_ESTIMATE))
        else:
            out.append(r)
    return out
