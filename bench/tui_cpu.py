"""CPU and memory of `tpu-info --watch` fed 8 devices and 500 graphs.

The app runs headless (Textual's ``run_test``, 200x50: every panel visible)
against the synthetic source of :mod:`tui.fake`, which ticks from a thread
like a live target: each tick a new snapshot (8 devices, 500 graphs, five of
them changed, two events). Measured: CPU seconds per wall second of the whole
process (the source's thread included) at 1 Hz and at 10 Hz, after a short
warm-up; and resident memory at the start and end of each run (flat: grows
by less than 8 MiB; the histories are bounded rings).

Headless means the compositor builds every frame but nothing is written to a
terminal, so terminal output costs are not included.

    python bench/tui_cpu.py            # 60 s at 1 Hz, 60 s at 10 Hz
    python bench/tui_cpu.py --smoke    # a few seconds each, only checks it runs
"""

from __future__ import annotations

import asyncio
import time

import psutil
from _common import parser, verdict

from tui.app import WatchApp
from tui.fake import synthetic

WARMUP_S = 3.0
FLAT_MIB = 8.0


async def measure(hz: float, seconds: float) -> tuple[float, float, float, int]:
    """Returns (cpu per wall second, RSS MiB at start, RSS MiB at end, ticks drawn)."""
    source = synthetic(devices=8, graphs=500, interval_s=1.0 / hz)
    app = WatchApp(source, 1.0 / hz, tick_s=1.0)
    proc = psutil.Process()
    async with app.run_test(size=(200, 50)) as pilot:
        await asyncio.sleep(WARMUP_S)
        await pilot.pause()
        rss0 = proc.memory_info().rss / 2**20
        versions0 = next(iter(app.state.targets.values())).version
        cpu0, wall0 = time.process_time(), time.monotonic()
        await asyncio.sleep(seconds)
        cpu1, wall1 = time.process_time(), time.monotonic()
        rss1 = proc.memory_info().rss / 2**20
        ticks = next(iter(app.state.targets.values())).version - versions0
        await pilot.press("q")
    return (cpu1 - cpu0) / (wall1 - wall0), rss0, rss1, ticks


def main() -> int:
    args = parser(__doc__).parse_args()
    seconds = 4.0 if args.smoke else 60.0
    ok = True
    for hz, target in ((1.0, 0.05), (10.0, 0.2)):
        ratio, rss0, rss1, ticks = asyncio.run(measure(hz, seconds))
        print(f"{hz:g} Hz for {seconds:g} s: {ticks} updates drawn, RSS {rss0:.1f} -> "
              f"{rss1:.1f} MiB")
        good = ratio <= target
        verdict(f"cpu seconds per second at {hz:g} Hz", ratio, f"<= {target}", good)
        flat = rss1 - rss0 <= FLAT_MIB
        verdict(f"memory growth MiB at {hz:g} Hz", rss1 - rss0, f"<= {FLAT_MIB:g}", flat)
        ok = ok and good and flat
    return 0 if ok or args.smoke else 1


if __name__ == "__main__":
    raise SystemExit(main())
