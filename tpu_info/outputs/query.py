"""``tpu-info --query FIELD,... --format csv[,noheader][,nounits]``: nvidia-smi's habit.

:data:`FIELDS` is the one table of named fields: each has a unit, a level
(``device`` or ``process``) and the reading it shows, taken from the rows of
:mod:`tpu_info.views.derived` (so a value here is the value the tables show).
When any device field is asked, there is one row per device (local chips,
then each process's devices), joined with the process that owns it; when
only process fields are asked, one row per process as the Processes table
lists them (:func:`rows`; nvidia-smi's ``--query-gpu`` and
``--query-compute-apps`` choose theirs: :mod:`tpu_info.outputs.nvsmi_fields`).
Values are joined with
``", "`` as nvidia-smi does; a value holding a comma or a quote is quoted,
so ``csv.reader(f, skipinitialspace=True)`` reads every row back. A value
that could not be read is ``[N/A]`` (``tpu-info doctor`` says why).

Example:
    >>> fmt = parse_format("csv,noheader,nounits")
    >>> fmt.header, fmt.units
    (False, False)
    >>> [f.name for f in parse_query("index,memory.used")]
    ['index', 'hbm_used']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tpu_info.contract.catalog import UNCACHED_COMPILE
from tpu_info.contract.model import Snapshot
from tpu_info.contract.safe import clean
from tpu_info.views.derived import (
    Derived,
    DeviceRow,
    ProcessRow,
    RunReadings,
    TargetReadings,
)
from tpu_info.views.findings import by_function, function_compiles

NA_CELL = "[N/A]"  # nvidia-smi's word for a value it could not read
MIB = float(1 << 20)


@dataclass(frozen=True, slots=True)
class Row:
    """One output row: a device (or None, for process rows) and its process
    (``process``: a hooked target's row or a chip owner's; ``target``: the
    hooked target, whose snapshot the counters come from)."""

    index: int
    device: DeviceRow | None
    target: TargetReadings | None
    process: ProcessRow | None = None
    time_unix: float = 0.0  # when the look was taken
    devices: int = 0  # how many devices the look lists


Value = float | int | str | None


@dataclass(frozen=True, slots=True)
class Field:
    """A named column: ``get(row)`` is its value (None: ``[N/A]``) in ``unit``."""

    name: str
    level: str  # "device" or "process"
    unit: str
    help: str
    get: Callable[[Row], Value]
    aliases: tuple[str, ...] = ()
    digits: int | None = None  # decimals for a float


def _d(value: Derived) -> Value:  # type: ignore[type-arg]
    return value.value


def _dev(get: Callable[[DeviceRow], Value]) -> Callable[[Row], Value]:
    return lambda r: None if r.device is None else get(r.device)


def _proc(get: Callable[[TargetReadings], Value]) -> Callable[[Row], Value]:
    return lambda r: None if r.target is None else get(r.target)


def _snap(get: Callable[..., Value]) -> Callable[[Row], Value]:
    return _proc(lambda t: None if t.view.snapshot is None else get(t.view.snapshot))


def _mib(value: int | None) -> float | None:
    return None if value is None else value / MIB


def _pid(r: Row) -> Value:
    if r.process is not None and r.process.pid.value:
        return r.process.pid.value
    pids = None if r.device is None else _d(r.device.pids)
    return None if pids == "-" else pids


def _free_mib(d: DeviceRow) -> float | None:
    used, total = d.hbm_used.value, d.hbm_total.value
    return None if used is None or total is None else max(0, total - used) / MIB


def _process_hbm(r: Row) -> float | None:
    """The device memory the row's process uses: on the row's device when it
    holds it alone (nvidia-smi's used_memory; a shared chip is N/A), else, on
    a row of no device, the process's own total."""
    if r.process is None:
        return None
    if r.device is None:
        return _mib(r.process.hbm_used_bytes.value)
    alone = _d(r.device.pids) == str(r.process.pid.value)
    return _mib(r.device.hbm_used.value) if alone else None


def _timestamp(r: Row) -> str:
    """nvidia-smi's form: ``2026/12/05 23:12:09.123`` (local time)."""
    import time

    t = time.localtime(r.time_unix)
    return time.strftime("%Y/%m/%d %H:%M:%S", t) + f".{int(r.time_unix % 1 * 1000):03d}"


def _recompiles(s: Snapshot) -> int:
    """Compiles of each function beyond its first (as the recompile findings count)."""
    return sum(max(0, function_compiles(g) - 1) for g in by_function(s).values())


def _step_ms(s: Snapshot) -> float | None:
    per = None if s.steps is None else s.steps.seconds_per_step
    return None if per is None else per * 1e3


def _process_field(name: str) -> Callable[[Row], Value]:
    return lambda r: None if r.process is None else _d(getattr(r.process, name))


FIELDS: tuple[Field, ...] = (
    Field("index", "device", "", "the row's number (0, 1, ...)", lambda r: r.index),
    Field("id", "device", "", "the device's number, as -i, -L and the table name it (tpu3: 3)",
          _dev(lambda d: d.number)),
    Field("device", "device", "", "the device's label (tpu0, cpu:0)",
          _dev(lambda d: d.label)),
    Field("name", "device", "", "the device's kind (TPU v5e, NVIDIA H100, cpu)",
          _dev(lambda d: d.kind), ("type",)),
    Field("pci_bus_id", "device", "", "a local chip's PCI address (0000:00:0b.0)",
          _dev(lambda d: d.pci_address or None), ("pci.bus_id", "gpu_bus_id")),
    Field("hbm_used", "device", "MiB", "device memory in use", _dev(
        lambda d: _mib(d.hbm_used.value)), ("memory.used",), 0),
    Field("hbm_total", "device", "MiB", "device memory in all", _dev(
        lambda d: _mib(d.hbm_total.value)), ("memory.total",), 0),
    Field("hbm_free", "device", "MiB", "device memory not in use", _dev(_free_mib),
          ("memory.free",), 0),
    Field("hbm_used_bytes", "device", "B", "device memory in use, exact",
          _dev(lambda d: d.hbm_used.value)),
    Field("hbm_total_bytes", "device", "B", "device memory in all, exact",
          _dev(lambda d: d.hbm_total.value)),
    Field("hbm_percent", "device", "%", "device memory in use, of the total",
          _dev(lambda d: d.hbm_percent.value), (), 1),
    Field("duty_cycle", "device", "%", "busy % (libtpu's duty cycle, or the hook's estimate)",
          _dev(lambda d: d.busy.value), ("busy", "utilization.gpu"), 1),
    Field("count", "look", "", "how many devices the look lists", lambda r: r.devices),
    Field("timestamp", "look", "", "when the look was taken (2026/12/05 23:12:09.123)",
          _timestamp),
    Field("pid", "process", "", "the process using the device (pids, for a chip)", _pid),
    Field("process", "process", "", "the process's name", _process_field("name"),
          ("process_name",)),
    Field("user", "process", "", "the process's user", _process_field("user")),
    Field("engine", "process", "", "what is hooked (jax 0.10, torch_xla ...)",
          _process_field("engine")),
    Field("process_hbm", "process", "MiB", "device memory the process uses (on the row's "
          "device, when it holds it alone)", _process_hbm, ("used_memory", "used_gpu_memory"),
          0),
    Field("target", "process", "", "where the process was read (HOST:PORT)",
          _proc(lambda t: clean(t.view.target))),
    Field("uptime", "process", "s", "seconds since the process started",
          _process_field("uptime_seconds"), (), 0),
    Field("steps", "process", "", "training steps (marked or inferred)",
          _snap(lambda s: None if s.steps is None else s.steps.count)),
    Field("step_time", "process", "ms", "wall time per step",
          _snap(_step_ms), (), 3),
    Field("compiles", "process", "", "compiles (cache misses)",
          _snap(lambda s: s.counter(UNCACHED_COMPILE))),
    Field("recompiles", "process", "", "compiles of a function beyond its first",
          _snap(_recompiles)),
    Field("graphs", "process", "", "compiled graphs known", _snap(lambda s: len(s.graphs))),
    Field("findings", "process", "", "findings (problems and notes) for the process",
          _proc(lambda t: len(t.findings))),
)
_BY_NAME = {n: f for f in FIELDS for n in (f.name, *f.aliases)}


def help_text() -> str:
    """The field table, for ``--help-query``."""
    lines = ["Fields for --query (comma-separated; aliases in brackets):", ""]
    for f in FIELDS:
        also = f" [{', '.join(f.aliases)}]" if f.aliases else ""
        unit = f" ({f.unit})" if f.unit else ""
        lines.append(f"  {f.name + also:<34} {f.level:<8} {f.help}{unit}")
    lines += ["", "Rows are devices when any device field is asked, else processes (a look's",
              "fields go with either). A value not read is [N/A]."]
    return "\n".join(lines) + "\n"


def parse_query(text: str) -> list[Field]:
    """``"index,name"`` -> the fields, in order.

    Raises:
        ValueError: an unknown or empty field name (the message lists the valid ones).
    """
    names = [n.strip() for n in text.split(",")]
    bad = [n for n in names if n not in _BY_NAME]
    if bad or not text.strip():
        raise ValueError(f"--query: unknown field {clean(bad[0] if bad else text)!r}; "
                         f"fields: {', '.join(f.name for f in FIELDS)} (see --help-query)")
    return [_BY_NAME[n] for n in names]


@dataclass(frozen=True, slots=True)
class Format:
    """``--format csv[,noheader][,nounits]``."""

    header: bool = True
    units: bool = True


def parse_format(text: str) -> Format:
    """Raises ValueError for anything but ``csv`` with ``noheader``/``nounits``."""
    parts = [p.strip() for p in text.split(",")]
    extra = set(parts[1:]) - {"noheader", "nounits"}
    if parts[0] != "csv" or extra:
        raise ValueError(f"--format must be csv[,noheader][,nounits], got {clean(text)!r}")
    return Format(header="noheader" not in parts, units="nounits" not in parts)


def rows(run: RunReadings, fields: Sequence[Field], per: str | None = None) -> list[Row]:
    """The rows of one look, ``per`` (None: ``device`` when a device field is
    asked, else ``process``):

    * ``device``: each device the Devices table lists, joined with the process
      that holds it (its first owner);
    * ``process``: each process, as the Processes table lists them (the
      hooked targets, then every other process that holds a chip);
    * ``app`` (``--query-compute-apps``): each process on each device it
      holds, then each process that holds no chip (a program on the CPU);
      one whose chips are not listed (``-i``) has no row, as nvidia-smi's.
    """
    per = per or ("device" if any(f.level == "device" for f in fields) else "process")
    devices = [*run.chips, *(d for t in run.targets for d in t.devices)]
    targets = {t.process.pid.value: t for t in run.targets
               if t.process is not None and t.process.pid.value is not None}
    procs = {p.pid.value: p for p in run.processes if p.pid.value is not None}
    pairs: list[tuple[DeviceRow | None, TargetReadings | None, ProcessRow | None]] = []
    if per == "process":
        pairs = [(None, t, t.process) for t in run.targets]
        pairs += [(None, None, o) for o in run.owners]
    else:
        for chip in run.chips:
            owners = [int(p) for p in (chip.pids.value or "").split(", ") if p.isdigit()]
            if per == "device":  # one row: its hooked owner first
                first = next((p for p in owners if p in targets), owners[0] if owners else -1)
                pairs.append((chip, targets.get(first), procs.get(first)))
            else:
                pairs += [(chip, targets.get(p), procs[p]) for p in owners if p in procs]
        pairs += [(d, t, t.process) for t in run.targets for d in t.devices]
        if per == "app":  # processes only, each with a pid; one that holds no chip at all once
            pairs = [x for x in pairs if x[2] is not None and x[2].pid.value is not None]
            held = {x[2].pid.value for x in pairs if x[2] is not None}
            held |= {pid for u in run.usage for pid in u.chip.owner_pids}  # -i left them out
            pairs += [(None, targets.get(pid), p) for pid, p in procs.items() if pid not in held]
    return [Row(i, d, t, p, run.header.time_unix, len(devices))
            for i, (d, t, p) in enumerate(pairs)]


def _cell(field: Field, value: Value, units: bool) -> str:
    if value is None or value == "":
        return NA_CELL
    if isinstance(value, float):
        text = f"{value:.{field.digits}f}" if field.digits is not None else f"{value:g}"
    else:
        text = clean(str(value))
    if units and field.unit:
        text = f"{text} {field.unit}"
    if any(c in text for c in ',"\n'):
        text = '"' + text.replace('"', '""') + '"'
    return text


def header_line(fields: Sequence[Field], fmt: Format) -> str:
    return ", ".join(f"{f.name} [{f.unit}]" if fmt.units and f.unit else f.name
                     for f in fields)


def csv_lines(run: RunReadings, fields: Sequence[Field], fmt: Format,
              per: str | None = None) -> list[str]:
    """The data lines (no header) for one look (``per``: as :func:`rows`)."""
    return [", ".join(_cell(f, f.get(r), fmt.units) for f in fields)
            for r in rows(run, fields, per)]
