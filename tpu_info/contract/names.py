"""The rule for the program's own metric names, shared by both ends.

A name a program gives ``metrics.counter()`` or ``metrics.distribution()``
becomes a Prometheus metric name (``DataLoadTime`` ->
``tpu_info_data_load_time_seconds``), so it must make one that Prometheus
accepts and ``promtool check metrics`` passes. The hook refuses a name that
breaks the rule (:func:`name_problem`, a ``ValueError`` with
:data:`NAME_RULE`); the expositions (:mod:`tpu_info.outputs.prometheus`) check
every name again (:func:`lint_problem`), since an older or hostile hook may
send anything, and leave out, counted by reason, what would not pass.

The words of a name are its snake_case parts (split at ``_`` and at
capitals). What promtool's lint refuses in a word: a unit abbreviation
(``ms``, ``s``, ``b``, ...: spell units out, or record in the base unit and
let the exporter add it), a prefixed unit (``milliseconds``: the base unit
is ``seconds``), a metric type (``counter``, ``gauge``, ...); and ``total``
at the end of a name that is not a counter.

Example:
    >>> name_problem("DataLoadTime") is None
    True
    >>> name_problem("LoadMs")
    "its word 'ms' is a unit abbreviation"
    >>> lint_problem("tpu_info_a_b_c_evil_total")
    "its word 'b' is a unit abbreviation"
"""

from __future__ import annotations

import re

MAX_NAME = 200
NAME_RULE = (f"a metric name is 1..{MAX_NAME} ASCII letters, digits and underscores, "
             "starting with a letter (CamelCase as torch_xla's, e.g. DataLoadTime, or "
             "snake_case), and none of its words a unit abbreviation (s, ms, us, b, kb, ...), "
             "a prefixed unit (milliseconds, kilobytes: record nanoseconds or bytes) or a "
             "metric type (counter, gauge, histogram, summary)")
_VALID = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")

# promtool's lint (client_golang's promlint, Prometheus 2.x).
ABBREVIATIONS = frozenset(("s", "ms", "us", "ns", "sec", "b", "kb", "mb", "gb", "tb", "pb",
                           "m", "h", "d"))
TYPES = ("counter", "gauge", "histogram", "summary", "untyped", "gauge_histogram")
_UNITS = {"amperes": "amperes", "bytes": "bytes", "hertz": "hertz", "joules": "joules",
          "kelvin": "kelvin", "meters": "meters", "metres": "metres", "seconds": "seconds",
          "volts": "volts", "grams": "grams", "celsius": "kelvin", "fahrenheit": "kelvin",
          "percent": "ratio"}
_PREFIXES = ("pico", "nano", "micro", "milli", "centi", "deci", "deca", "hecto", "kilo", "kibi",
             "mega", "mibi", "giga", "gibi", "tera", "tebi", "peta", "pebi")

# Every family name of ours (the hook's and the host exporter's): a process's
# own metric of one of these names is left out (reason "reserved").
RESERVED = frozenset("tpu_info_" + n for n in (
    "ops", "events", "graph_compiles", "graph_compile_seconds", "graph_cache_hits",
    "graph_executions", "graphs", "graphs_evicted", "device_memory_used_bytes",
    "device_memory_peak_bytes", "device_memory_limit_bytes", "device_busy_ratio", "process",
    "process_start_time_seconds", "uptime_seconds", "findings", "finding_seconds_lost",
    "finding_share_of_step_ratio", "names_dropped", "scrape_errors", "chip",
    "chip_hbm_total_bytes", "chip_hbm_used_bytes", "chip_busy_ratio", "chip_processes",
    "chip_owner", "chips", "target_up", "target_scrape_duration_seconds", "target_cut",
    "exporter_targets", "exporter_targets_skipped", "exporter_poll_duration_seconds",
    "exporter_polls", "exporter_poll_errors", "exporter_skipped_records",
    "backend_start_seconds"))

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def words(name: str) -> list[str]:
    """``"DataLoadTime"`` -> ``["data", "load", "time"]`` (the snake_case parts)."""
    return [w for w in _CAMEL.sub("_", name).lower().split("_") if w]


def _unit_problem(word: str) -> str | None:
    base = _UNITS.get(word)
    if base is not None and base != word:
        return f"its word {word!r} is not a base unit (use {base})"
    for p in _PREFIXES:
        if word.startswith(p) and word[len(p):] in _UNITS:
            return f"its word {word!r} is a prefixed unit (use {_UNITS[word[len(p):]]})"
    return None


# Why a name was left out: the ``reason`` label of ``tpu_info_names_dropped``.
INVALID, ABBREVIATION, PREFIXED_UNIT, TYPE_IN_NAME, TOTAL_SUFFIX = (
    "invalid", "unit_abbreviation", "prefixed_unit", "type_in_name", "total_suffix")


def lint(exported: str, counter: bool = False) -> tuple[str, str] | None:
    """What promtool's lint says of the exported metric name ``exported``
    (``_total`` included for a counter): ``(reason, words)``, or None when it
    passes. ``reason`` is one of the stable labels above."""
    if not _VALID.match(exported):
        return INVALID, "it is not a valid Prometheus name"
    parts = exported.split("_")
    for word in parts:
        if word in ABBREVIATIONS:
            return ABBREVIATION, f"its word {word!r} is a unit abbreviation"
        problem = _unit_problem(word)
        if problem:
            return PREFIXED_UNIT, problem
    for t in TYPES:
        if f"_{t}_" in exported or exported.endswith(f"_{t}"):
            return TYPE_IN_NAME, f"it names the metric type {t!r}"
    if not counter and exported.endswith("_total"):
        return TOTAL_SUFFIX, "only a counter's name ends in 'total'"
    if "" in parts[2:] or exported.endswith("_"):  # tpu_info___total: an empty name
        return INVALID, "it has an empty word"
    return None


def lint_problem(exported: str, counter: bool = False) -> str | None:
    """:func:`lint`'s words, or None when the name passes."""
    found = lint(exported, counter)
    return found[1] if found else None


def name_problem(name: object, counter: bool = True) -> str | None:
    """Why ``name`` breaks :data:`NAME_RULE` (None when it does not): checked
    by the hook when a program defines a metric (``counter``: a counter, whose
    name may end in ``Total``)."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        return f"it is not 1..{MAX_NAME} characters"
    if not _VALID.match(name):
        return "it has a character other than an ASCII letter, digit or underscore, or " \
               "does not start with a letter"
    return lint_problem("x_" + "_".join(words(name)), counter)
