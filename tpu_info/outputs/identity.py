"""Who a process is, in labels that outlive a restart.

A fleet's series are named by what stays the same when a program restarts
(``job``, ``host``, ``program``, ``rank``), never by its pid: a restart then
continues the same series instead of adding a new set (773 of them for an
idle JAX process), and the pid lives on one info series
(``tpu_info_process_info{pid=...}``). :class:`ProgramLabels` tells apart the
processes of one host that would share those labels (two independent runs
of ``train.py``, neither in a distributed job): the first keeps
``program="train.py"``, the next gets ``train.py#2``, and a process that
restarts takes the lowest label free again.

Example:
    >>> labels = ProgramLabels()
    >>> labels.assign([("a", "train.py", ""), ("b", "train.py", ""), ("c", "train.py", "1")])
    {'a': 'train.py', 'b': 'train.py#2', 'c': 'train.py'}
    >>> ProgramLabels().assign([("a", "train.py", "", "ml/train-0"),
    ...                         ("b", "train.py", "", "ml/train-1")])
    {'a': 'train.py', 'b': 'train.py'}
"""

from __future__ import annotations

import os
from collections.abc import Collection, Hashable, Iterable, Sequence

from tpu_info.contract.model import ProcessRecord


def program_name(argv: Sequence[str]) -> str:
    """The ``program`` label: the script's file name (``train.py``), from a
    process's argv (its ``sys.argv``)."""
    first = argv[0] if argv else ""
    if first in ("", "-c"):
        return "python" if not first else "python -c"
    return os.path.basename(first.rstrip("/")) or first


def job_rank(process: ProcessRecord | None) -> str:
    """The ``rank`` label: the process's rank when a job says it has one (an
    engine that sees more than one process, or a launcher's ``$RANK``), else
    empty: a lone JAX program's ``process_index()`` 0 is no rank."""
    if process is None or process.process_index is None:
        return ""
    if (process.process_count or 0) > 1 or process.process_index_source == "env":
        return str(process.process_index)
    return ""


class ProgramLabels:
    """The ``program`` label of each live process of one host, unique per
    (program, rank, place): kept for a process's life, freed when it is gone.
    ``place`` is what else tells processes apart in their labels (their
    Kubernetes pod and container): two pods' ``train.py`` are both
    ``train.py``. Not locked: one caller (the exporter's poll)."""

    def __init__(self) -> None:
        self._held: dict[Hashable, tuple[tuple[str, ...], str]] = {}
        self._taken: dict[tuple[str, ...], set[str]] = {}

    def assign(self, processes: Iterable[tuple[Hashable, str, str]
                                         | tuple[Hashable, str, str, str]],
               alive: Collection[Hashable] | None = None) -> dict[Hashable, str]:
        """Labels for ``(key, program, rank)`` or ``(key, program, rank,
        place)`` of each process, oldest first (the order given). A process
        neither given nor in ``alive`` (default: those given) is forgotten:
        its label is free again."""
        processes = list(processes)
        keep = alive if alive is not None else {p[0] for p in processes}
        for key in [k for k in self._held if k not in keep]:
            self._free(key)
        out: dict[Hashable, str] = {}
        for key, program, rank, *place in processes:
            ident = (program, rank, *place)
            held = self._held.get(key)
            if held is None or held[0] != ident:
                if held is not None:
                    self._free(key)
                taken = self._taken.setdefault(ident, set())
                label, n = program, 1
                while label in taken:
                    n += 1
                    label = f"{program}#{n}"
                taken.add(label)
                held = self._held[key] = (ident, label)
            out[key] = held[1]
        return out

    def _free(self, key: Hashable) -> None:
        ident, label = self._held.pop(key)
        taken = self._taken[ident]
        taken.discard(label)
        if not taken:
            del self._taken[ident]
