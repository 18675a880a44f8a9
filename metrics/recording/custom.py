"""The program's own metrics: a counter or distribution with a unit and help.

A user metric is recorded like the hook's own (the same registry, journal and
wire fields), so its unit drives every output: ``metrics_report()`` prints a
time distribution as torch_xla prints ``CompileTime`` and bytes as ``B``/``KB``/
``MB``, Prometheus adds the unit suffix (``_seconds``, ``_bytes``) and its
``# HELP`` line, the CLI's ``--metric NAME`` and ``--json`` show both.
Times are recorded in nanoseconds, as torch_xla's are.

Example:
    >>> from metrics.recording.recorder import Recorder
    >>> rec = Recorder()
    >>> d = define(rec, "distribution", "DataLoadTime", "ns", "Time to load one batch.")
    >>> d.observe(1_500_000)
    >>> d.unit, d.help
    (<Unit.TIME_NS: 'ns'>, 'Time to load one batch.')
"""

from __future__ import annotations

from typing import Literal, overload

from metrics.recording.recorder import Recorder
from metrics.recording.registry import Counter, Distribution
from tpu_info.contract import names
from tpu_info.contract.model import Unit

# Words a user may give for each unit (the Unit values themselves included).
_UNITS: dict[str, Unit] = {
    "ns": Unit.TIME_NS, "nanoseconds": Unit.TIME_NS, "time_ns": Unit.TIME_NS,
    "bytes": Unit.BYTES, "byte": Unit.BYTES, "b": Unit.BYTES,
    "1": Unit.NUMBER, "": Unit.NUMBER, "number": Unit.NUMBER, "count": Unit.NUMBER,
}
MAX_NAME = names.MAX_NAME
MAX_HELP = 1000


def parse_unit(unit: Unit | str) -> Unit:
    """``"ns"`` -> :attr:`Unit.TIME_NS` (also ``"bytes"``, ``"1"`` and a few synonyms).

    Raises:
        ValueError: any other unit (seconds are not one: record nanoseconds).
    """
    if isinstance(unit, Unit):
        return unit
    found = _UNITS.get(str(unit).strip().lower())
    if found is None:
        raise ValueError(f"unit {unit!r} is not one of 'ns' (times, in nanoseconds), 'bytes', "
                         "'1' (plain numbers)")
    return found


@overload
def define(rec: Recorder, kind: Literal["counter"], name: str, unit: Unit | str,
           help: str) -> Counter: ...
@overload
def define(rec: Recorder, kind: Literal["distribution"], name: str, unit: Unit | str,
           help: str) -> Distribution: ...
def define(rec: Recorder, kind: str, name: str, unit: Unit | str,
           help: str) -> Counter | Distribution:
    """The program's metric ``name`` of ``kind``, created with ``unit`` and
    ``help`` on first use; the same object on every later call.

    Raises:
        ValueError: a name that breaks :data:`tpu_info.contract.names.NAME_RULE`
            (the message says the rule and what broke it), an unknown unit, or
            a name already recorded with another unit (a metric has one unit).
    """
    problem = names.name_problem(name, counter=kind == "counter")
    if problem:
        raise ValueError(f"{names.NAME_RULE}; got {name!r:.60}: {problem}")
    u = parse_unit(unit)
    text = str(help)[:MAX_HELP]
    made = rec.counter(name, u, text) if kind == "counter" else rec.distribution(name, u, text)
    if made.unit is not u:
        raise ValueError(f"{kind} {name!r} is already recorded in {made.unit.value!r}, "
                         f"not {u.value!r}")
    if text and not made.help:
        made.help = text  # first made without one (by an engine or an earlier call)
    return made
