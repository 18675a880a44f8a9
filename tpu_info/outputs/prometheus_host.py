"""Prometheus families of one host: its chips, its targets' health, and many
processes' families merged into one exposition.

The host exporter (``tpu-info exporter``) serves, per poll, the chips the
host scan found (:func:`chip_families`), one ``up``-style gauge per target
it asked (:func:`target_families`) and every hooked process's families
(:func:`tpu_info.outputs.prometheus.families`, with ``host``, ``program``
and ``rank`` labels: :mod:`tpu_info.outputs.identity`). An exposition may
name each family once, so :func:`merge` joins the families of all processes by name, and
:class:`PartsEncoding` writes that joined exposition from each part's lines,
encoding again only the parts that changed since its last call.

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

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder

from tpu_info.contract import reuse
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
                            "(sysfs for TPUs, NVML for GPUs); usable=\"false\" when its "
                            "device node is missing here.", labels=per_chip)
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
                             "pci_address": chip.pci_address,
                             "usable": "true" if chip.usable else "false"})
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
    """One target of the exporter's poll: its labels, whether it answered,
    how long it took, and what of its answer was cut, by part (``reply``:
    the whole answer, over the exporter's byte bound). ``asked`` False: not
    asked this poll because its last try failed (backed off): down, with
    its last try's seconds and cut parts."""

    labels: Mapping[str, str]
    up: bool
    seconds: float
    cut: Mapping[str, int] = field(default_factory=dict)
    asked: bool = True


# The parts of a snapshot whose values the client's decoder cuts or keeps out
# (the first word of each Snapshot.left_out place); anything else is "other".
CUT_PARTS = frozenset(("graphs", "events", "distributions", "distribution", "counters",
                       "counter", "devices", "device", "process", "sites", "graph", "snapshot"))


def cut_parts(left_out: Iterable[tuple[str, str]]) -> dict[str, int]:
    """How many values the decoder cut or kept out of an answer, by part."""
    out: dict[str, int] = {}
    for where, _ in left_out:
        part = where.split(" ", 1)[0]
        part = part if part in CUT_PARTS else "other"
        out[part] = out.get(part, 0) + 1
    return out


def target_families(targets: Iterable[TargetHealth], labels: Mapping[str, str],
                    poll_seconds: float, polls: int, poll_errors: int = 0,
                    skipped: Mapping[str, int] | None = None,
                    not_asked: Mapping[str, int] | None = None) -> Iterator[Metric]:
    """``tpu_info_target_up`` (1 answered, 0 failed or timed out) and the
    seconds each target took, per target; the exporter's own poll figures.

    Args:
        targets: every target of the poll (each with its own labels:
            ``program``, ``rank``; what outlives a restart, never a pid or port),
            and those not asked because their last try failed (down).
        labels: the exporter's constant labels (``host``, ``job``).
        poll_seconds: how long the last poll took.
        polls: polls so far.
        poll_errors: polls that failed (a bug: every target's failure is its ``up``).
        skipped: discovery records (or the directory) not used, by reason
            (``dead pid``, ``not owned by the current user``, ...).
        not_asked: live processes the poll did not ask, by reason
            (:mod:`tpu_info.commands.exporter_targets`: ``max_targets``,
            ``port_closed``, ``not_answering``, ``dial_budget``).
    """
    names, values = list(labels), [str(v) for v in labels.values()]
    targets = list(targets)
    keys = sorted({k for t in targets for k in t.labels if k not in labels})
    up = _gauge("target_up", "1 when the target answered the exporter's last poll, "
                "0 when it failed or did not answer within --timeout, or was not asked "
                "because it has not answered lately (backed off).", [*names, *keys])
    took = _gauge("target_scrape_duration_seconds", "Seconds the target took to answer "
                  "the exporter's last poll (its timeout when it did not; not asked: its "
                  "last try's).", [*names, *keys])
    cut = _gauge("target_cut", "Places in the target's last answer where values were cut "
                 "or kept out (over the client's bounds: 2,000 graphs, ...; not finite), by "
                 "part; part=\"reply\": the whole answer was over the exporter's 16 MiB (a target "
                 "not asked since keeps its last try's).",
                 [*names, *keys, "part"])
    for t in targets:
        at = [*values, *(str(t.labels.get(k, "")) for k in keys)]
        up.add_metric(at, 1.0 if t.up else 0.0)
        took.add_metric(at, t.seconds)
        for part, n in sorted(t.cut.items()):
            cut.add_metric([*at, part], n)
    count = _gauge("exporter_targets", "Targets the exporter asked in its last poll.", names)
    count.add_metric(values, sum(t.asked for t in targets))
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
    unasked = _gauge("exporter_targets_skipped", "Hooked processes discovery found that the "
                     "last poll did not ask, by reason: max_targets (more than it asks), "
                     "port_closed (nothing listens on the port), not_answering (did not "
                     "answer lately: asked again in turn, answering and greeting first, "
                     "backed off), "
                     "dial_budget (not asked yet: recent dials hung).",
                     [*names, "reason"])
    for reason in ("dial_budget", "max_targets", "not_answering", "port_closed"):
        unasked.add_metric([*values, reason], (not_asked or {}).get(reason, 0))
    yield from (up, took, cut, count, duration, done, errors, left, unasked)


def groups(families: Iterable[Metric]) -> list[list[Metric]]:
    """Families by name, in the order each name came first. A family whose
    type differs from the first of its name (hooks of two versions) is left
    out."""
    out: dict[str, list[Metric]] = {}
    for fam in families:
        group = out.get(fam.name)
        if group is None:
            out[fam.name] = [fam]
        elif group[0].type == fam.type:
            group.append(fam)
    return list(out.values())


def joined(group: Sequence[Metric]) -> Metric:
    """One family of a group's samples in order (named as its first)."""
    first = group[0]
    merged = Metric(first.name, first.documentation, first.type, first.unit)
    merged.samples = [s for fam in group for s in fam.samples]
    return merged


def merge(families: Iterable[Metric]) -> list[Metric]:
    """Families of the same name joined into one (their samples in order),
    so the exposition names each once (:func:`groups`, :func:`joined`)."""
    return [joined(g) for g in groups(families)]


@dataclass(frozen=True, slots=True)
class FamilyList:
    """A fixed list of families, as prometheus_client's encoders read a registry."""

    items: Sequence[Metric]

    def collect(self) -> Iterator[Metric]:
        return iter(self.items)


class PartsEncoding:
    """prometheus_client's exposition of :func:`merge`'s families, in the
    format ``accept`` picks (text 0.0.4 or OpenMetrics), written from each
    part's encoded lines: a group's header (its first part's ``# HELP``,
    ``# TYPE``, ``# UNIT``) then every part's sample lines, in order.

    Each call keeps its parts' lines and encodes again only the parts that
    are not the very objects of the last call (the reuse rule,
    :mod:`tpu_info.contract.reuse`; :class:`tpu_info.outputs.prometheus.
    SeriesState` hands out an unchanged family again). So a poll costs in
    proportion to what changed, and the bytes are those of encoding the
    merged families whole: the encoders write one line per sample, in
    order; a part whose lines they would not write in place (the text
    format moves ``_created`` samples after its family) has its group
    encoded whole. Only the last call's parts are kept. Not locked: one
    caller (the exporter's poll).

    Args:
        accept: the scraper's ``Accept`` header.
    """

    def __init__(self, accept: str) -> None:
        self._encoder = choose_encoder(accept)[0]
        self._eof = self._encoder(FamilyList(()))  # OpenMetrics: "# EOF"
        self._last: tuple[tuple[Metric, ...], list[tuple[bytes, bytes] | None]] | None = None
        self.encoded = 0  # parts encoded so far (what reuse saves shows here)

    def encode(self, grouped: Sequence[Sequence[Metric]]) -> bytes:
        """The exposition of ``grouped`` (:func:`groups`' result)."""
        self._last = reuse.each(tuple(itertools.chain.from_iterable(grouped)), self._part,
                                self._last)
        parts = iter(self._last[1])
        out = []
        for group in grouped:
            lines = list(itertools.islice(parts, len(group)))
            if all(lines):
                out.append(lines[0][0])  # type: ignore[index]
                out.extend(part[1] for part in lines)  # type: ignore[index]
            else:
                out.append(self._alone(joined(group)))
        out.append(self._eof)
        return b"".join(out)

    def _alone(self, fam: Metric) -> bytes:
        body = self._encoder(FamilyList((fam,)))
        return body[: len(body) - len(self._eof)]

    def _part(self, fam: Metric) -> tuple[bytes, bytes] | None:
        """(header, sample lines) of one part; None where its lines are not
        written in place."""
        self.encoded += 1
        whole = self._alone(fam)
        head = self._alone(Metric(fam.name, fam.documentation, fam.type, fam.unit))
        lines = whole[len(head):]
        if not whole.startswith(head) or lines.startswith(b"# ") or b"\n# " in lines:
            return None
        return head, lines
