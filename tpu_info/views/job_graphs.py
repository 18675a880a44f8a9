"""Findings across the processes of one job: the same function compiled to
different graphs (:func:`diverging_graphs`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from tpu_info.contract.model import Finding, Severity, Snapshot


def diverging_graphs(snapshots: Sequence[Snapshot]) -> list[Finding]:
    """Processes of one job (same program and arguments) that compiled the
    same function to different graphs: their inputs, shardings or flags
    differ, which in a multi-host job often means a hang at the next
    collective."""
    jobs: dict[tuple[str, ...], list[Snapshot]] = defaultdict(list)
    for s in snapshots:
        if s.process is not None and s.process.argv:
            jobs[tuple(s.process.argv)].append(s)
    out: list[Finding] = []
    for argv, members in jobs.items():
        if len(members) < 2:
            continue
        by_fn: dict[str, dict[int, set[str]]] = defaultdict(dict)
        for s in members:
            pid = s.process.pid if s.process else 0
            for g in s.graphs:
                if g.compiles or g.cache_hits:
                    by_fn[g.name].setdefault(pid, set()).add(g.hash)
        for name, per_pid in sorted(by_fn.items()):
            if len(per_pid) < 2:
                continue
            distinct = {frozenset(h) for h in per_pid.values()}
            if len(distinct) < 2:
                continue
            pids = sorted(per_pid)
            sample = "; ".join(f"pid {p}: {', '.join(h[:12] for h in sorted(per_pid[p])[:2])}"
                               for p in pids[:3])
            out.append(Finding(
                f"{len(pids)} processes of {' '.join(argv)[:60]} compiled {name} to different "
                f"graphs ({sample}): their input shapes, shardings or flags differ. Compare "
                "the signatures in `tpu-info --json`; a multi-host job can hang on this.",
                Severity.WARNING, None, 0.0, "diverging_graphs"))
    return out
