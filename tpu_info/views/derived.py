"""Every value the outputs show, decided once per run: the value, or why it is missing.

:func:`readings` turns the :class:`~tpu_info.views.values.TargetView` s of one run
(plus the local scan and the header) into rows of :class:`Derived` values:
each is a value, or ``None`` with the reason it is missing (not connected,
the engine does not report it, no permission). The tables
(:mod:`tpu_info.outputs.render`), ``--json`` (:mod:`tpu_info.outputs.jsonview`), ``doctor``
and the dashboard read these rows, so an N/A says the same why everywhere;
:meth:`RunReadings.reasons` lists them all. Findings come out here too, as
:class:`FindingLine` s (level, where, words, cost), for the same reason.

Example:
    >>> from tpu_info.contract.model import Snapshot
    >>> from tpu_info.views.values import Header, TargetView
    >>> run = readings([TargetView("h:1", Snapshot(taken_at_unix=0.0))],
    ...                header=Header(host="h", time_unix=0.0))
    >>> run.targets[0].process.steps.reason[:31]
    'the program never called metric'
    >>> run.targets[0].process.steps.text()
    'N/A'
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from tpu_info.contract.catalog import UNCACHED_COMPILE
from tpu_info.contract.model import (
    Finding,
    GraphRecord,
    LocalScan,
    OwnerRecord,
    Snapshot,
)
from tpu_info.views.chips import ChipUsage
from tpu_info.views.cost import cost_cell
from tpu_info.views.derived_value import Derived
from tpu_info.views.derived_value import Row as _Row
from tpu_info.views.device_rows import (  # noqa: F401 - re-exported: the outputs' one door
    DeviceReadings,
    DeviceRow,
    chip_row,
    device_readings,
    device_row,
    owner_cell,
)
from tpu_info.views.findings import diverging_graphs, find, no_engine_reason, short_location
from tpu_info.views.values import (
    NO_STEPS,
    Header,
    Reasons,
    TargetView,
    TransferStats,
    clean,
    engine_label,
    last_cause,
    memory_reason,
    memory_totals,
    no_findings_text,
    steps_label,
    transfer_stats,
)
from tpu_info.views.values import top_graphs as ranked_graphs

# Processes ------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ProcessRow:
    """One target as a process: who it is and its running totals."""

    target: str
    pid: Derived[int]
    name: Derived[str]
    user: Derived[str]
    engine: Derived[str]
    uptime_seconds: Derived[float]
    steps: Derived[str]  # 1,200 (inferred: jit(train_step))
    steps_short: Derived[str]  # ~1,200
    compiles: Derived[int]
    hbm_used_bytes: Derived[int]
    na: tuple[tuple[str, str], ...] = ()
    chips: Derived[str] = Derived()  # the local chips it holds open: "tpu3"


def _all_missing(target: str, why: str, na: list[tuple[str, str]]) -> ProcessRow:
    gone: Derived = Derived(None, why)  # type: ignore[type-arg]
    return ProcessRow(target, gone, gone, gone, gone, gone, gone, gone, gone, gone, tuple(na))


def _no_steps(s: Snapshot) -> str:
    """Why no steps: when a JAX program's compiled functions ran and none of
    their calls was counted, what hid them (the hook lists this program's own
    blind spots first: a ``jit`` bound before install, with its line), not
    the generic :data:`NO_STEPS`."""
    engine = s.process.engine.split(",") if s.process is not None else []
    if ("jax" in engine and s.blind_spots and s.graphs
            and all(g.executions is None for g in s.graphs)):
        return f"no jitted call was counted: {s.blind_spots[0]}"
    return NO_STEPS


def process_row(v: TargetView) -> ProcessRow | None:
    """``v`` as a process row; None for a libtpu probe that failed (its failure
    explains the chips' N/As instead)."""
    s = v.snapshot
    r = _Row(f"processes/{v.target}")
    libtpu = v.source == "libtpu"
    if s is None:
        if libtpu:
            return None
        r.get("", None, v.error or "not read")
        return _all_missing(v.target, v.error or "not read", r.na)
    p = s.process
    if p is None:
        why = ("libtpu's service reports devices, not processes" if libtpu
               else "the target sent no process record")
        r.get("process", None, why)
        row = _all_missing(v.target, why, [])
        if libtpu:
            row = replace(row, name=Derived("libtpu"), engine=Derived("libtpu"))
    else:
        row = ProcessRow(
            v.target, Derived(p.pid), Derived.of(p.name or None, "not reported"),
            r.get("user", p.user or None, "the process did not report its user"),
            r.get("engine", engine_label(p), no_engine_reason(p)),
            *([Derived()] * 5))
    used, _ = memory_totals(s)
    hbm = r.get("hbm", used, memory_reason(s))
    if libtpu:
        why = "libtpu's service does not count steps, compiles or uptime"
        r.get("counters", None, why)
        gone: Derived = Derived(None, why)  # type: ignore[type-arg]
        return replace(row, uptime_seconds=gone, steps=gone, steps_short=gone, compiles=gone,
                       hbm_used_bytes=hbm, na=tuple(r.na))
    steps = r.get("steps", steps_label(s), _no_steps(s))
    uptime = r.get("uptime", s.uptime_seconds if s.uptime_seconds > 0 else None,
                   "the target did not report its uptime")
    return replace(row, uptime_seconds=uptime, steps=steps,
                   steps_short=Derived.of(steps_label(s, short=True), steps.reason),
                   compiles=Derived(s.counter(UNCACHED_COMPILE)), hbm_used_bytes=hbm,
                   na=tuple(r.na))


def chip_names(chips: Sequence[ChipUsage]) -> str:
    """``tpu0-3, gpu1``: chip names, runs of consecutive indices shortened."""
    out: list[str] = []
    run: list[int] = []
    prefix = ""

    def close() -> None:
        if run:
            out.append(f"{prefix}{run[0]}" + (f"-{run[-1]}" if len(run) > 1 else ""))

    for u in sorted(chips, key=lambda u: (u.chip.name.rstrip("0123456789"), u.chip.index)):
        p = u.chip.name.rstrip("0123456789")
        if p == prefix and run and u.chip.index == run[-1] + 1:
            run.append(u.chip.index)
            continue
        close()
        prefix, run = p, [u.chip.index]
    close()
    return ", ".join(out)


def owner_rows(usage: Sequence[ChipUsage], local: LocalScan | None,
               listed: set[int]) -> tuple[ProcessRow, ...]:
    """A row for each process that holds a chip and is not ``listed`` (hooked
    processes have theirs): pid, name, user and the chips, from ``/proc``."""
    held: dict[int, list[ChipUsage]] = {}
    for u in usage:
        for pid in u.chip.owner_pids:
            held.setdefault(pid, []).append(u)
    out = []
    for pid, chips in sorted(held.items()):
        if pid in listed:
            continue
        o = (local.owner(pid) if local else None) or OwnerRecord(pid)
        r = _Row(f"processes/pid {pid}")
        # The command with its interpreter's directory cut (a full path would
        # fill the column): "python3 plain.py --lr 3".
        exe, _, args = o.command.partition(" ")
        command = f"{os.path.basename(exe) or exe} {args}".strip()
        name = r.get("name", clean(command or o.name, 200) or None,
                     "the process exited, or /proc does not show its command")
        user = r.get("user", o.user or None, "/proc does not show the process's user")
        used = [u.hbm_used_bytes for u in chips if u.hbm_used_bytes is not None]
        sole = all(u.chip.owner_pids == (pid,) for u in chips)
        why = next((u.reasons.get("hbm_used_bytes", "") for u in chips), "") or "not reported"
        hbm = r.get("hbm", sum(used) if sole and len(used) == len(chips) else None,
                    why if sole else "the process shares its chips: HBM is per chip")
        out.append(ProcessRow("-", Derived(pid), name, user, Derived("not hooked"),
                              Derived(), Derived(), Derived(), Derived(), hbm, tuple(r.na),
                              Derived(chip_names(chips))))
    return tuple(out)


# Graphs and transfers ---------------------------------------------------------

@dataclass(frozen=True, slots=True)
class GraphRow:
    """One compiled graph: its executions and its last recompile cause."""

    graph: GraphRecord
    executions: Derived[int]
    cause: Derived[str]  # "argument 'batch' changed ... at train.py:88"
    na: tuple[tuple[str, str], ...] = ()


def graph_row(target: str, g: GraphRecord) -> GraphRow:
    r = _Row(f"compilation/{target}/{g.short_hash}")
    execs = r.get("executions", g.executions,
                  f"{g.engine or 'the engine'} does not count executions per graph")
    c = last_cause(g)
    words = None if c is None else clean(
        c.description + (f" at {short_location(c.location)}" if c.location else ""))
    cause = r.get("cause", words, "the engine gave no cause for the recompile",
                  applies=g.compiles > 1)
    return GraphRow(g, execs, cause, tuple(r.na))


@dataclass(frozen=True, slots=True)
class TransferRow:
    """Transfers one way: count, bytes and latency percentiles (ns)."""

    stats: TransferStats
    bytes: Derived[float]
    p50_ns: Derived[float]
    p90_ns: Derived[float]
    p95_ns: Derived[float]
    p999_ns: Derived[float]
    na: tuple[tuple[str, str], ...] = ()

    @property
    def direction(self) -> str:
        return self.stats.direction

    @property
    def count(self) -> int:
        return self.stats.count


def transfer_rows(v: TargetView) -> tuple[TransferRow, TransferRow]:
    """Both directions of ``v``'s snapshot (which is set)."""
    assert v.snapshot is not None
    out = []
    for t in transfer_stats(v.snapshot):
        r = _Row(f"transfers/{v.target}/{t.direction}")
        why = t.reasons.get
        pcts = [r.get(key[:-3], getattr(t, key), why(key, "not reported"))
                for key in ("p50_ns", "p90_ns", "p95_ns", "p999_ns")]
        nbytes = r.get("bytes", t.bytes, why("bytes", "not reported"))
        out.append(TransferRow(t, nbytes, *pcts, na=tuple(r.na)))
    return out[0], out[1]


# Findings -------------------------------------------------------------------

FINDING_TEXT = 600  # a finding's line, cost and advice: longer than other remote strings


@dataclass(frozen=True, slots=True)
class FindingLine:
    """A finding in the words every output shows.

    Attributes:
        level: ``warn``, ``info`` or ``FAIL``.
        kind: the rule's stable name (``per_step_sync``); ``unreadable`` or
            ``libtpu_unanswered`` for a target that could not be read.
        where: ``pid 4242``, ``job``, or a target's address.
        at: the short source line when the words do not name it ("" otherwise).
        text: the message, cleaned for a terminal.
        cost: ``4.1 ms/step 3.0%``, ``~2.8 s`` (estimated), ``-`` (nothing measurable).
        finding: the record it came from (None for an unreadable target).
    """

    level: str
    kind: str
    where: str
    at: str
    text: str
    cost: str
    finding: Finding | None = None


def finding_line(f: Finding, where: str) -> FindingLine:
    loc = short_location(f.location)
    at = loc if f.location and loc not in f.message else ""
    return FindingLine(f.severity.label, f.kind, where, at,
                       clean(f.message, FINDING_TEXT), cost_cell(f), f)


def findings_of(s: Snapshot, where: str = "") -> tuple[FindingLine, ...]:
    """The findings of one snapshot, costliest first, ``where`` its process."""
    return tuple(finding_line(f, where) for f in find(s))


def _problems(views: Sequence[TargetView], local: LocalScan | None,
              usage: Sequence[ChipUsage] = ()) -> list[FindingLine]:
    """Targets that could not be read, as lines above the findings."""
    out = []
    has_tpus = local is not None and bool(local.tpus)
    hooked = any(u.hook_pid is not None for u in usage)
    for v in views:
        if v.snapshot is not None:
            continue
        if v.source == "libtpu":
            if has_tpus:  # without chips, libtpu being absent is normal
                out.append(FindingLine(
                    "info", "libtpu_unanswered", v.target, "", clean(
                        f"libtpu's metric service did not answer ({v.error or 'not read'}); "
                        + ("chip HBM and busy % come from the hooks of the programs that "
                           "hold the chips" if hooked else
                           "chip HBM use and busy % are unknown until a TPU workload runs")),
                    "-"))
            continue
        out.append(FindingLine("FAIL", "unreadable", v.target, "", clean(v.error or "not read"),
                               "-"))
    return out


# One run --------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TargetReadings:
    """Everything derived from one target."""

    view: TargetView
    process: ProcessRow | None
    devices: tuple[DeviceRow, ...]  # empty when folded into the local chips
    graphs: tuple[GraphRow, ...]  # the top graphs by compile time
    transfers: tuple[TransferRow, ...]  # h2d, d2h (empty when not read)
    findings: tuple[FindingLine, ...]


@dataclass(frozen=True, slots=True)
class RunReadings:
    """Everything the outputs show of one run, each value with its reason."""

    header: Header
    libtpu_version: Derived[str]
    accelerator: Derived[str]
    chips: tuple[DeviceRow, ...]  # the chips listed (usable ones, or all when asked)
    usage: tuple[ChipUsage, ...]  # every local chip, listed or not (for --json)
    targets: tuple[TargetReadings, ...]
    no_devices: str  # why the Devices section is empty ("" when it is not)
    problems: tuple[FindingLine, ...]  # targets that could not be read
    job_findings: tuple[FindingLine, ...]
    no_findings: str  # what to say when no rule fired
    # Lines under the Devices table: chips not listed, where HBM and busy came from.
    device_notes: tuple[str, ...] = ()
    owners: tuple[ProcessRow, ...] = ()  # chip owners without the hook
    hidden: str = ""  # the chips not listed (not usable here), in one line
    no_processes: str = ""  # why Processes is empty when a selection left none (--pid, --user)

    @property
    def processes(self) -> tuple[ProcessRow, ...]:
        """Every process row: the hooked targets', then the other chip owners'."""
        return tuple(t.process for t in self.targets if t.process is not None) + self.owners

    @property
    def findings(self) -> tuple[FindingLine, ...]:
        """Unreadable targets, job-wide findings, then each target's."""
        return self.problems + self.job_findings + tuple(
            f for t in self.targets for f in t.findings)

    def reasons(self) -> list[tuple[str, str]]:
        """``(where, reason)`` for every N/A the tables show, in table order, then
        what the client kept out of each reply (``targets/<target>/<where>``)."""
        r = Reasons()
        pairs = [*self.header_na(), *(p for c in self.chips for p in c.na),
                 *(p for t in self.targets for d in t.devices for p in d.na)]
        if self.no_devices:
            pairs.append(("devices", self.no_devices))
        pairs += [("devices", n) for n in self.device_notes[:1] if n == self.hidden]
        pairs += [p for t in self.targets if t.process for p in t.process.na]
        pairs += [p for o in self.owners for p in o.na]
        pairs += [p for t in self.targets for g in t.graphs for p in g.na]
        pairs += [p for t in self.targets for x in t.transfers if x.count for p in x.na]
        for where, why in pairs:
            r.na(where, why)
        for t in self.targets:
            s = t.view.snapshot
            for where, why in s.left_out if s is not None else ():
                r.na(f"targets/{t.view.target}/{where}", f"kept out: {why}")
        return [(clean(where), clean(why)) for where, why in r.pairs]

    def header_na(self) -> list[tuple[str, str]]:
        return [(f"header/{name}", d.reason) for name, d in
                (("libtpu", self.libtpu_version), ("accelerator", self.accelerator))
                if d.value is None]


def libtpu_version(header: Header, views: Sequence[TargetView]) -> str | None:
    """libtpu's version: the header's, else the first a process reported."""
    return header.libtpu_version or next(
        (v.snapshot.process.versions["libtpu"] for v in views
         if v.snapshot and v.snapshot.process and "libtpu" in v.snapshot.process.versions), None)


def readings(views: Sequence[TargetView], *, local: LocalScan | None = None,
             header: Header | None = None, top_graphs: int = 5,
             all_chips: bool = False, only: Collection[str] | None = None) -> RunReadings:
    """Derives every value of one run once (see the module docstring).

    Args:
        views: one per target, read or failed.
        local: this machine's accelerators (``devices.scan_local()``).
        header: time and host; None means now, here.
        top_graphs: graphs kept per process (by compile time).
        all_chips: list every chip on the host, also those not usable here
            (``--all``); by default they are counted in one note.
        only: list only these chips (``-i``; names as the table's).
    """
    from tpu_info.host.devices import accelerator_type  # the host scan: not for `import metrics`

    header = header or Header.now()
    views = list(views)
    devs = device_readings(views, local, header.host, all_chips, only)
    usage, listed, chips = devs.usage, devs.listed, devs.chips
    targets = []
    for v in views:
        s = v.snapshot
        if s is None:
            row = _with_chips(process_row(v), v, usage, header.host)
            targets.append(TargetReadings(v, row, (), (), (), ()))
            continue
        who = f"pid {s.process.pid}" if s.process else v.target
        devices = tuple(device_row(v, d) for d in devs.shown(v))
        targets.append(TargetReadings(
            v, _with_chips(process_row(v), v, usage, header.host), devices,
            tuple(graph_row(v.target, g) for g in ranked_graphs(s, top_graphs)),
            transfer_rows(v), findings_of(s, who)))
    no_devices = ""
    if not chips and not any(t.devices for t in targets):
        no_devices = "; ".join(clean(x) for x in ([devs.hidden] if devs.hidden else [])
                               + list(local.reasons.values() if local else ())) \
            or "no local scan and no process reported devices"
    accel = header.accelerator_type or (accelerator_type(local) if local else None)
    job = diverging_graphs([v.snapshot for v in views if v.snapshot is not None])
    return RunReadings(
        header,
        Derived.of(libtpu_version(header, views), "no libtpu package here and no process "
                "reported a libtpu version"),
        Derived.of(accel, (local.reasons.get("tpu") if local else None)
                or "the local machine was not scanned"),
        chips, usage, tuple(targets), no_devices, tuple(_problems(views, local, usage)),
        tuple(finding_line(f, "job") for f in job), no_findings_text(views),
        devs.notes,
        owner_rows(listed, local, {v.snapshot.process.pid for v in views
                                   if v.snapshot is not None and v.snapshot.process}),
        devs.hidden)


def _with_chips(row: ProcessRow | None, v: TargetView, usage: Sequence[ChipUsage],
                host: str) -> ProcessRow | None:
    """``row`` with the local chips its process holds (its pid among their owners)."""
    s = v.snapshot
    if row is None or s is None or s.process is None or (s.process.host or host) != host:
        return row
    held = [u for u in usage if s.process.pid in u.chip.owner_pids]
    return replace(row, chips=Derived(chip_names(held))) if held else row



# doctor -----------------------------------------------------------------------

def hooked_lines(views: Sequence[TargetView]) -> list[str]:
    """For ``doctor``: per hooked process, which engines are hooked and which
    the hook still waits for (those with nothing hooked are N/A reasons)."""
    out = []
    for v in views:
        p = v.snapshot.process if v.snapshot is not None else None
        if p is None or not p.engine:
            continue
        waiting = [e for e in p.waiting.split(",") if e]
        tail = (f"; waiting for {', '.join(waiting)} (hooked when imported)" if waiting
                else "")
        out.append(f"{v.target}: hooked {engine_label(p)}{tail}")
    return out


def blind_spot_lines(views: Sequence[TargetView]) -> list[str]:
    """For ``doctor``: per process, what its hook cannot see (not counted)."""
    return [f"{v.target}: not counted: {spot}" for v in views if v.snapshot is not None
            for spot in v.snapshot.blind_spots]
