"""One-off time the step figures leave out: opening the device, and the
compiles inside the step loop.

Opening the backend (the first device operation: 7-11 s for a TPU chip) is
a start-up phase of its own, never the cost of the op that asked first: the
hook times it (``BackendStartTime``) and takes it out of that op's record;
here it is said as one line. The compile work inside the loop
(``CompileStepTime``) is said with the steady step it was left out of.

Example:
    >>> from tpu_info.contract.model import DistributionReading, Snapshot, Unit
    >>> d = DistributionReading("BackendStartTime", Unit.TIME_NS, 1, 7.0e9, 7.0e9, 7.0e9)
    >>> [f.message[:34] for f in startup(Snapshot(0.0, distributions=(d,)))]
    ['opening the device backend took 7.'...]
"""

from __future__ import annotations

from collections.abc import Iterable

from tpu_info.contract.catalog import BACKEND_START_TIME
from tpu_info.contract.model import Finding, Phase, Severity, Snapshot
from tpu_info.views.cost import duration, share_words

# The start-up is said from this long (a CPU backend opens in milliseconds).
MIN_STARTUP_SECONDS = 0.5


def _device_words(s: Snapshot) -> str:
    """``the TPU``, ``the GPU``, ``the CPU backend``; ``the device backend``
    when the process told no device."""
    platforms = {d.platform.lower() for d in s.devices if d.platform}
    if len(platforms) == 1:
        p = platforms.pop()
        return "the CPU backend" if p == "cpu" else f"the {p.upper()}"
    return "the device backend"


def startup_seconds(s: Snapshot) -> float | None:
    """Seconds the backends took to open (None: not told)."""
    d = s.distribution(BACKEND_START_TIME)
    return d.total / 1e9 if d is not None and d.count else None


def startup(s: Snapshot) -> Iterable[Finding]:
    """``opening the TPU took 7.0 s`` (info), once the start-up is worth saying."""
    seconds = startup_seconds(s)
    if seconds is None or seconds < MIN_STARTUP_SECONDS:
        return
    run = f", {share_words(min(1.0, seconds / s.uptime_seconds))} of run time" if (
        s.uptime_seconds > 0) else ""
    yield Finding(
        f"opening {_device_words(s)} took {duration(seconds)} (once at start-up, in the "
        f"process's first device operation{run}, measured): a start-up of its own, not a cost "
        "of the line that asked first. Nothing to fix in the program; one process holds the "
        "chip, so keep it running rather than starting one per task.",
        Severity.INFO, None, seconds, "backend_startup", count=1, share_of_run=(
            min(1.0, seconds / s.uptime_seconds) if s.uptime_seconds > 0 else None),
        phase=Phase.SETUP.value)
