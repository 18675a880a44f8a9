"""JAX devices at scrape time: one record per local device with its memory
(``device.memory_stats()`` where the backend has allocator stats, else the
bytes of live arrays on it, with host RAM as the limit) and busy %: on a TPU,
libtpu's duty cycle where its SDK in this process gives one
(:mod:`metrics.engines.jax.libtpu_sdk`), else the hook's estimate, each
record saying which (``busy_source``).

Example:
    >>> DeviceMemory().records((None, "no calls yet"))[0].memory.source  # doctest: +SKIP
    'live_arrays'
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from metrics.engines._frames import host_ram
from metrics.engines.jax.libtpu_sdk import DutyCycle, with_duty_cycle
from tpu_info.contract.model import DeviceRecord, MemoryReading


def backends_started() -> bool:
    """Whether the program started JAX's backends. Until it did, the hook
    calls nothing that starts them (``jax.local_devices()``): the program may
    still have to call ``jax.distributed.initialize()``, which raises once a
    backend started, and on a TPU a backend takes the chips. Unknown (a JAX
    without the probe) counts as not started."""
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except Exception:  # noqa: BLE001 - a JAX without the probe
        return False


class DeviceMemory:
    """Reads device records; keeps the highest live bytes seen per device
    (the peak where the backend keeps none).

    Args:
        duty: libtpu's duty cycle from its SDK (asked only once a TPU device
            is seen; default: a fresh :class:`~.libtpu_sdk.DutyCycle`).
        on_error: ``on_error(where, exception)`` for a failure of the SDK
            (the recorder's ``hook_failed``: counted in ``HookErrors``).
    """

    def __init__(self, duty: DutyCycle | None = None,
                 on_error: Callable[[str, BaseException], None] | None = None) -> None:
        self._peak_live: dict[int, int] = {}
        self.duty = duty if duty is not None else DutyCycle(on_error=on_error)

    def records(self, busy: tuple[float | None, str]) -> list[DeviceRecord]:
        """One record per local device, memory read now; ``busy`` is the
        (percent, reason) every device gets."""
        busy_percent, busy_reason = busy
        live: dict[int, int] | None = None
        out: list[DeviceRecord] = []
        if not backends_started():
            return out  # no devices until the program starts a backend
        for d in jax.local_devices():
            try:
                stats = d.memory_stats()
            except Exception:  # noqa: BLE001 - some plugins raise instead of None
                stats = None
            if stats:
                mem = MemoryReading(
                    used_bytes=stats.get("bytes_in_use"),
                    peak_bytes=stats.get("peak_bytes_in_use"),
                    limit_bytes=stats.get("bytes_limit"),
                    source="memory_stats",
                )
            else:
                if live is None:
                    live = live_bytes_by_device()
                used = live.get(d.id, 0)
                peak = max(self._peak_live.get(d.id, 0), used)
                self._peak_live[d.id] = peak
                mem = MemoryReading(
                    used_bytes=used, peak_bytes=peak, limit_bytes=host_ram(),
                    source="live_arrays",
                    reason=f"{d.platform} has no allocator stats: live jax.Array bytes, "
                           "limit is host RAM; peak is the highest seen at a scrape",
                )
            out.append(DeviceRecord(
                id=d.id, kind=getattr(d, "device_kind", d.platform), platform=d.platform,
                memory=mem, busy_percent=busy_percent, busy_reason=busy_reason,
            ))
        tpu = any(r.platform == "tpu" for r in out)
        return with_duty_cycle(out, self.duty.per_chip() if tpu else ())


def live_bytes_by_device() -> dict[int, int]:
    """Bytes of live ``jax.Array``s per device id (a sharded array's shard
    size on each of its devices)."""
    out: dict[int, int] = {}
    for arr in jax.live_arrays():
        try:
            devs = list(arr.sharding.addressable_devices)
            if len(devs) == 1:
                out[devs[0].id] = out.get(devs[0].id, 0) + arr.nbytes
                continue
            shard_shape = arr.sharding.shard_shape(arr.shape)
            n = arr.dtype.itemsize
            for dim in shard_shape:
                n *= dim
            for dev in devs:
                out[dev.id] = out.get(dev.id, 0) + n
        except Exception:  # noqa: BLE001 - deleted or exotic arrays are skipped
            continue
    return out
