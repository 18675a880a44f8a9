"""Prometheus families of one host: its chips, its targets' health, and many
processes' families merged into one exposition.

The host exporter (``tpu-info exporter``) serves, per poll, the chips the
host scan found (:func:`chip_families`), one ``up``-style gauge per target
it asked (:func:`target_families`) and every hooked process's families
(:func:`tpu_info.outputs.prometheus.families`, with ``host``, ``pid``,
``program``, ``process_index`` labels). An exposition may name each family
once, so :func:`merge` joins the families of all processes by name.

Chip series carry ``host`` and ``device`` (``tpu0``, ``gpu1``: the names the
``tpu-info`` table uses); a value the scan could not read is left out, never
exported as 0.

Example:
    >>> from tpu_info.contract.model import ChipRecord, LocalScan
    >>> chip = ChipRecord(0, "tpu", "v5e", "/dev/vfio/12", "0000:00:05.0", hbm_total_bytes=16)
    >>> [f.name for f in chip_families(LocalScan(chips=(chip,)), {"host": "h1"})][:2]
    ['tpu_info_chip', 'tpu_info_chip_hbm_total_bytes']
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from tpu_info.contract.model import LocalScan
from tpu_info.outputs.prometheus import PREFIX

MAX_OWNERS_PER_CHIP = 64  # owner series per chip at most (a chip has a handful)


def _gauge(name: str, doc: str, labels: Sequence[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, labels=list(labels))


def chip_families(scan: LocalScan, labels: Mapping[str, str]) -> Iterator[Metric]:
    """The host's accelerators from :func:`tpu_info.host.devices.scan_local`.

    Args:
        scan: the host scan (sysfs TPUs, NVML GPUs, owners from ``/proc``).
        labels: constant labels (``host``, and ``job`` when set) on every series.
    """
    names, values = list(labels), [str(v) for v in labels.values()]
    per_chip = [*names, "device"]
    info = InfoMetricFamily(PREFIX + "chip", "An accelerator this host's scan found "
                            "(sysfs for TPUs, NVML for GPUs).", labels=per_chip)
    total = _gauge("chip_hbm_total_bytes", "Device memory of the chip.", per_chip)
    used = _gauge("chip_hbm_used_bytes", "Device memory in use on the chip (NVML; TPUs: "
                  "from libtpu or the hooked processes' device series).", per_chip)
    busy = _gauge("chip_busy_ratio", "Fraction of time the chip was busy (NVML).", per_chip)
    owners = _gauge("chip_processes", "Processes holding the chip open (from /proc).",
                    per_chip)
    owner = _gauge("chip_owner", "1 for each process holding the chip open.",
                   [*per_chip, "pid"])
    for chip in scan.chips:
        at = [*values, chip.name]
        info.add_metric(at, {"vendor": chip.vendor, "kind": chip.kind,
                             "pci_address": chip.pci_address})
        for fam, value in ((total, chip.hbm_total_bytes), (used, chip.hbm_used_bytes),
                           (busy, None if chip.busy_percent is None
                            else chip.busy_percent / 100.0)):
            if value is not None:
                fam.add_metric(at, value)
        if "owner_pids" not in chip.reasons:
            owners.add_metric(at, len(chip.owner_pids))
        for pid in chip.owner_pids[:MAX_OWNERS_PER_CHIP]:
            owner.add_metric([*at, str(pid)], 1)
    count = _gauge("chips", "Accelerators this host's scan found.", names)
    count.add_metric(values, len(scan.chips))
    yield from (info, total, used, busy, owners, owner, count)


@dataclass(frozen=True, slots=True)
class TargetHealth:
    """One target the exporter asked this poll: its labels, whether it
    answered, and how long it took."""

    labels: Mapping[str, str]
    up: bool
    seconds: float


def target_families(targets: Iterable[TargetHealth], labels: Mapping[str, str],
                    poll_seconds: float, polls: int, poll_errors: int = 0,
                    skipped: Mapping[str, int] | None = None) -> Iterator[Metric]:
    """``tpu_info_target_up`` (1 answered, 0 failed or timed out) and the
    seconds each target took, per target; the exporter's own poll figures.

    Args:
        targets: every target of the poll (each with its own labels:
            ``target``, ``pid``, ``program``, ``process_index``).
        labels: the exporter's constant labels (``host``, ``job``).
        poll_seconds: how long the last poll took.
        polls: polls so far.
        poll_errors: polls that failed (a bug: every target's failure is its ``up``).
        skipped: discovery records (or the directory) not used, by reason
            (``dead pid``, ``not owned by the current user``, ...).
    """
    names, values = list(labels), [str(v) for v in labels.values()]
    targets = list(targets)
    keys = sorted({k for t in targets for k in t.labels if k not in labels})
    up = _gauge("target_up", "1 when the target answered the exporter's last poll, "
                "0 when it failed or did not answer within --timeout.", [*names, *keys])
    took = _gauge("target_scrape_duration_seconds", "Seconds the target took to answer "
                  "the exporter's last poll (its timeout when it did not).", [*names, *keys])
    for t in targets:
        at = [*values, *(str(t.labels.get(k, "")) for k in keys)]
        up.add_metric(at, 1.0 if t.up else 0.0)
        took.add_metric(at, t.seconds)
    count = _gauge("exporter_targets", "Targets the exporter asked in its last poll.", names)
    count.add_metric(values, len(targets))
    duration = _gauge("exporter_poll_duration_seconds", "Seconds the exporter's last poll "
                      "took (host scan, discovery and every target).", names)
    duration.add_metric(values, poll_seconds)
    done = CounterMetricFamily(PREFIX + "exporter_polls", "Polls the exporter has made.",
                               labels=names)
    done.add_metric(values, polls)
    errors = CounterMetricFamily(PREFIX + "exporter_poll_errors", "Polls that failed as a "
                                 "whole (a target's failure is its target_up).", labels=names)
    errors.add_metric(values, poll_errors)
    left = _gauge("exporter_skipped_records", "Discovery records (or the runtime directory) "
                  "the last poll did not use, by reason.", [*names, "reason"])
    for reason, n in sorted((skipped or {}).items()):
        left.add_metric([*values, reason], n)
    yield from (up, took, count, duration, done, errors, left)


def merge(families: Iterable[Metric]) -> list[Metric]:
    """Families of the same name joined into one (their samples in order),
    so the exposition names each once. A family whose type differs from the
    first of its name (hooks of two versions) is left out."""
    out: dict[str, Metric] = {}
    for fam in families:
        first = out.get(fam.name)
        if first is None:
            merged = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            merged.samples = list(fam.samples)
            out[fam.name] = merged
        elif first.type == fam.type:
            first.samples.extend(fam.samples)
    return list(out.values())
