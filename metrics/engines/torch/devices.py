"""The devices a torch program computes on, as device records: CUDA devices
with the caching allocator's numbers, or one CPU record that says why there
are none (torch.compile's adapter; torch._lazy and torch_xla list their own).

Example:
    >>> import torch
    >>> [d.platform for d in torch_devices(torch)] in (["cpu"], ["cuda"])
    True
"""

from __future__ import annotations

from types import ModuleType

from metrics.engines._frames import host_ram
from tpu_info.contract.model import DeviceRecord, MemoryReading


def torch_devices(torch: ModuleType) -> list[DeviceRecord]:
    """CUDA devices with the caching allocator's numbers, or one CPU record
    saying why there are none. Never initializes CUDA itself."""
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available():
        if not cuda.is_initialized():
            return [DeviceRecord(
                id=0, kind="cuda", platform="cuda",
                memory=MemoryReading(None, source="none",
                                     reason="the program has not used CUDA yet"),
                busy_reason="busy % is not measured by the torch hook")]
        out = []
        for i in range(cuda.device_count()):
            try:
                free, total = cuda.mem_get_info(i)
                mem = MemoryReading(
                    used_bytes=int(cuda.memory_reserved(i)),
                    peak_bytes=int(cuda.max_memory_reserved(i)),
                    limit_bytes=int(total), source="memory_stats",
                    reason=f"torch caching allocator (reserved); {free} bytes free on the device",
                )
            except Exception as e:  # noqa: BLE001
                mem = MemoryReading(None, source="none", reason=f"torch.cuda: {e}")
            out.append(DeviceRecord(id=i, kind=cuda.get_device_name(i), platform="cuda",
                                    memory=mem,
                                    busy_reason="busy % is not measured by the torch hook"))
        return out
    return [DeviceRecord(
        id=0, kind="cpu", platform="cpu",
        memory=MemoryReading(None, limit_bytes=host_ram(), source="none",
                             reason="torch keeps no allocator statistics for the CPU "
                                    "(torch.cuda.is_available() is False)"),
        busy_reason="busy % is not measured by the torch hook")]
