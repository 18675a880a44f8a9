"""The summary a run prints when it ends, as ``time`` or Nsight's ``--stats`` do.

A few lines on stderr: how the program ended and its wall time, steps and
steps/s, step time P50/P99, compiles and their time, transfers per step, and
the top findings with their cost and line; then where the saved run is, to
read it again (``tpu-info report --from FILE``). A pure function of the
saved run: ``tpu-info run`` prints it after its child ended (nothing is
added to the program's own exit), and a program that called
``metrics.install()`` itself prints it at exit when ``TPU_INFO_SUMMARY`` asks.

Example:
    >>> from tpu_info.contract.model import ProcessRecord, Snapshot, StepsReading
    >>> s = Snapshot(100.0, ProcessRecord(7, "train.py", engine="jax"), uptime_seconds=83.0,
    ...              steps=StepsReading(1200, "marked", "metrics.mark_step", 60.0))
    >>> for line in summary(s, "exit").splitlines()[:2]:
    ...     print(line)
    tpu-info: train.py (pid 7) ended (exit) after 1m23s
      steps 1,200 (20.0/s), mean step 50 ms
"""

from __future__ import annotations

from tpu_info.contract import catalog
from tpu_info.contract.model import Snapshot
from tpu_info.contract.safe import clean
from tpu_info.views.breakdown import breakdown
from tpu_info.views.cost import duration, short_location, steady_step_words, steps_of
from tpu_info.views.derived import finding_line
from tpu_info.views.findings import find
from tpu_info.views.values import dist_percentile, format_uptime

TOP_FINDINGS = 3
WIDTH = 120


def _steps_line(s: Snapshot) -> str | None:
    steps = steps_of(s)
    if steps is None:
        return None
    parts = [f"steps {steps.count:,}"]
    if steps.seconds_total:
        parts[0] += f" ({steps.count / steps.seconds_total:,.1f}/s)"
    d = s.distribution(catalog.STEP_TIME)
    p50 = dist_percentile(d, 50)[0] if d is not None else None
    p99 = dist_percentile(d, 99)[0] if d is not None else None
    if p50 is not None:
        parts.append(f"step time P50 {duration(p50 / 1e9)}")
        if p99 is not None:
            parts.append(f"P99 {duration(p99 / 1e9)}")
    elif (steady := steps.steady_seconds_per_step):
        word = "steady step" if steps.compile_steps else "mean step"
        parts.append(f"{word} {duration(steady)}")
    if compiles := steady_step_words(steps):
        parts.append(compiles)
    return ", ".join(parts)


def _transfers(s: Snapshot) -> str:
    steps = steps_of(s)
    out = []
    for name, words in ((catalog.TRANSFER_TO_DEVICE_TIME, "host->device"),
                        (catalog.TRANSFER_FROM_DEVICE_TIME, "device->host")):
        d = s.distribution(name)
        if d is None or not d.count:
            continue
        if steps is not None:
            out.append(f"{words} {d.count / steps.count:.2g}/step")
        else:
            out.append(f"{words} {d.count:,}")
    return ", ".join(out)


def summary(s: Snapshot, ended: str, saved: str = "") -> str:
    """The end-of-run lines for ``s`` (no trailing newline)."""
    p = s.process
    who = f"{clean(p.name, 60)} (pid {p.pid})" if p is not None else "the program"
    lines = [f"tpu-info: {who} ended ({clean(ended, 120)}) after "
             f"{format_uptime(s.uptime_seconds)}"]
    if (steps := _steps_line(s)) is not None:
        lines.append(f"  {steps}")
    ct = s.distribution(catalog.COMPILE_TIME)
    compiles = sum(g.compiles for g in s.graphs) or (ct.count if ct is not None else 0)
    head = f"  compiles {compiles:,}"
    if ct is not None and ct.total:
        head += f" ({duration(ct.total / 1e9)})"
    if moved := _transfers(s):
        head += f", transfers {moved}"
    lines.append(head)
    if (time := breakdown(s)) is not None and time.parts:
        text = f"  time: {time.short_line()}"
        lines.append(text if len(text) <= WIDTH else text[: WIDTH - 1] + "…")
    found = find(s)
    for f in found[:TOP_FINDINGS]:
        fl = finding_line(f, "")
        at = f" at {short_location(f.location)}" if f.location else ""
        text = f"  {fl.level:<4}  {fl.cost:>16}  {f.kind}{at}: {fl.text}"
        lines.append(text if len(text) <= WIDTH else text[: WIDTH - 1] + "…")
    if len(found) > TOP_FINDINGS:
        lines.append(f"  ... {len(found) - TOP_FINDINGS} more findings")
    if saved:
        lines.append(f"  saved: {clean(saved, 300)} (tpu-info report --from FILE)")
    return "\n".join(lines)
