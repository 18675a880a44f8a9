"""One look at everything ``tpu-info`` shows: local chips, discovered hooked
processes, libtpu on localhost:8431 and the targets the user named.

What is read without being named (:func:`local_targets`, shared with the
dashboard): this user's discovery records whose port is not held by another
user's socket (a process served on its local socket alone is read there),
and ``localhost:8431`` (and each port of ``$TPU_RUNTIME_METRICS_PORTS``)
only when it is libtpu this user may trust
(:func:`tpu_info.host.listeners.judge_libtpu_port`) or a record of this user
names it. Everything skipped is a note that ``doctor`` prints.

Example:
    >>> g = gather([], timeout=0.5, probe_libtpu=False, scan_devices=False,
    ...            runtime_dir="/nonexistent")
    >>> g.views
    []
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tpu_info.commands import budget
from tpu_info.contract.model import LocalScan
from tpu_info.host.listeners import ProcNet, judge_libtpu_port, no_tcp_reason
from tpu_info.net.discovery import Scan
from tpu_info.net.targets import normalize
from tpu_info.views.values import TargetView

LIBTPU_TARGET = "localhost:8431"
T = TypeVar("T")


@dataclass(frozen=True)
class Gathered:
    """What one look found; ``notes`` are (where, reason) pairs for ``doctor``."""

    views: list[TargetView]
    local: LocalScan
    notes: list[tuple[str, str]] = field(default_factory=list)
    discovered: int = 0

    @property
    def failed(self) -> list[TargetView]:
        return [v for v in self.views if not v.ok]


@dataclass(frozen=True)
class LocalTargets:
    """What to read on this host without being told.

    Attributes:
        processes: ``(target, argv)`` of each discovered process to read.
        libtpu: the libtpu target to read, or None.
        notes: ``(where, reason)`` for what was skipped or removed, and why.
    """

    processes: list[tuple[str, tuple[str, ...]]]
    libtpu: str | None
    notes: list[tuple[str, str]]
    libtpus: list[str] = field(default_factory=list)  # every libtpu target to read


def libtpu_targets(environ: Mapping[str, str] | None = None) -> list[str]:
    """Where libtpu may serve on this host: ``localhost:8431`` and each port of
    ``$TPU_RUNTIME_METRICS_PORTS`` (:mod:`tpu_info.contract.libtpu_ports`)."""
    from tpu_info.contract.libtpu_ports import libtpu_ports

    return [f"localhost:{port}" for port in libtpu_ports(environ)]


def serving_notes(scan: Scan) -> list[tuple[str, str]]:
    """How each discovered process is served, and each hooked process whose
    server did not start (``doctor``'s serving lines)."""
    from tpu_info.contract.discovery_record import NO_TCP_ASKED
    from tpu_info.net.targets import label

    notes = []
    for p in scan.processes:
        who = f"pid {p.pid} ({label(p.target)})"
        if p.port and p.socket:
            notes.append((who, f"served on TCP port {p.port} and on its local socket"))
        elif p.port:
            notes.append((who, f"served on TCP port {p.port} only (a hook without a "
                          "local socket)"))
        elif p.no_tcp == NO_TCP_ASKED:
            notes.append((who, "served on its local socket only: TPU_INFO_BIND=unix asks "
                          "for that; tpu-info on this host reads it, other hosts cannot"))
        else:
            why = f" ({p.no_tcp_detail})" if p.no_tcp_detail else ""
            notes.append((who, f"served on its local socket only: no TCP socket can be "
                          f"opened on this host{why}; tpu-info on this host reads it, "
                          "other hosts cannot"))
    for p in scan.unserved:
        notes.append((f"pid {p.pid}", f"hooked, but its metrics server did not start: "
                      f"{p.failed} (see that program's stderr)"))
    return notes


def local_targets(scan: Scan | None, net: ProcNet, *, uid: int | None = None,
                  libtpu_target: str | Sequence[str] | None = LIBTPU_TARGET,
                  named: Sequence[str] = ()) -> LocalTargets:
    """Picks this host's targets from a discovery ``scan`` and ``/proc``.

    Every process ``scan`` found is read (it already skipped records whose
    port another user holds). Each ``libtpu_target`` (one, or several:
    :func:`libtpu_targets`) is read when a record of this user names it, or
    when :func:`judge_libtpu_port` accepts who listens; a target the user
    ``named`` is left to them.
    """
    uid = os.geteuid() if uid is None else uid
    notes: list[tuple[str, str]] = []
    processes: list[tuple[str, tuple[str, ...]]] = []
    if scan is not None:
        notes += [("discovery", line) for line in scan.summary()]
        processes = [(p.target, p.argv) for p in scan.processes]
        notes += serving_notes(scan)
        if not scan.processes:
            notes.append(("discovery", f"no hooked process of this user found in "
                          f"{scan.directory} (start one with metrics.install() or "
                          "`tpu-info run -- python ...`)"))
    recorded = {normalize(t) for t, _ in processes}
    wanted = [libtpu_target] if isinstance(libtpu_target, str) else list(libtpu_target or ())
    libtpus = [t for t in wanted if _libtpu_read(t, recorded, named, net, uid, notes)]
    return LocalTargets(processes, libtpus[0] if libtpus else None, notes, libtpus)


def _libtpu_read(target: str, recorded: set[str], named: Sequence[str], net: ProcNet,
                 uid: int, notes: list[tuple[str, str]]) -> bool:
    """Whether to read ``target`` as libtpu; says why (or why not) in ``notes``."""
    if normalize(target) in recorded:
        notes.append((target, "read as a hooked process: a discovery record of yours "
                      "names this port"))
        return False
    if normalize(target) in map(normalize, named):
        notes.append((target, "read because you named it with --target, whoever "
                      "listens there"))
        return False
    if no_tcp_reason() is not None:  # whoever listens there, no TCP reaches it from here
        notes.append((target, _libtpu_absent("")))
        return False
    port = int(target.rpartition(":")[2])
    verdict = judge_libtpu_port(net.listeners(port), port, uid)
    if verdict.read or verdict.listening:
        notes.append((target, verdict.why))
    else:
        notes.append((target, _libtpu_absent(verdict.why)))
    return verdict.read


def _libtpu_absent(why: str) -> str:
    """Why libtpu's service was not read, in words that fit this host."""
    if (blocked := no_tcp_reason()) is not None:
        return (f"libtpu's metric service cannot be reached: no TCP socket can be opened on "
                f"this host ({blocked}); HBM and busy come from the programs' hooks")
    return f"libtpu not present: {why} (normal on machines without TPUs, or when no TPU " \
           "program runs)"


def gather(
    targets: Sequence[str],
    timeout: float = 3.0,
    *,
    deadline: float | None = None,
    prepare: Callable[[], object] | None = None,
    use_discovery: bool = True,
    probe_libtpu: bool = True,
    scan_devices: bool = True,
    runtime_dir: str | os.PathLike[str] | None = None,
    proc_root: str | os.PathLike[str] = "/proc",
    libtpu_target: str | Sequence[str] | None = None,
) -> Gathered:
    """Reads every source at once; a failed target becomes a view with its error.

    Targets named by the user that fail are errors (exit code 1); libtpu's
    port is read only as :func:`local_targets` decides, and when it answers
    nothing that is only a note, since most machines have no libtpu.

    The requests go out as soon as the targets are known: the local scan
    (sysfs, NVML, owners in ``/proc``) and ``prepare`` (say, importing what
    prints the answers) run in another thread while they wait, so neither
    takes the targets' time. They are answered by ``deadline`` (a
    ``time.monotonic()``; None: ``timeout`` from now), each given at least
    :func:`~tpu_info.commands.budget.first_wait` from when its request is
    sent when the deadline is already near.
    """
    net = ProcNet(proc_root)
    # The kernel writes the socket table (tens of ms on some hosts) while this
    # thread imports the client: a read waits outside the interpreter lock.
    early = threading.Thread(target=net.sockets, name="tpu-info-sockets", daemon=True)
    if use_discovery or probe_libtpu:
        early.start()
    from tpu_info.net import discovery
    from tpu_info.net.client import Client
    from tpu_info.net.fanout import fan_out

    if early.ident is not None:
        early.join()
    found = None
    if use_discovery:
        found = discovery.scan(runtime_dir, port_owners=net.owners_by_port)
    if libtpu_target is None:  # 8431 and $TPU_RUNTIME_METRICS_PORTS
        libtpu_target = libtpu_targets()
    picked = local_targets(found, net, libtpu_target=libtpu_target if probe_libtpu else None,
                           named=targets)
    notes = list(picked.notes)
    order = [t for t, _ in picked.processes] + list(targets)
    implicit: set[str] = set()
    for libtpu in picked.libtpus:
        order.append(libtpu)
        implicit.add(normalize(libtpu))
    seen: set[str] = set()
    unique: list[str] = []
    for t in order:
        key = normalize(t)
        if key not in seen:
            seen.add(key)
            unique.append(t)

    now = time.monotonic()
    end = now + timeout if deadline is None else budget.wait_until(deadline, timeout, now)
    asking = _Asking(len(unique), Client.read_latest)
    side = futures.ThreadPoolExecutor(1, thread_name_prefix="tpu-info-local")
    try:
        local_scan = side.submit(_scan_local, scan_devices, prepare, asking.all_asked, end)
        answers = fan_out(unique, timeout=max(0.001, end - time.monotonic()), call=asking,
                          min_wait=0.0 if deadline is None else budget.first_wait(timeout))
        local = local_scan.result()
    finally:
        side.shutdown(wait=False)
    notes = [(f"local/{key}", why) for key, why in local.reasons.items()] + notes
    views: list[TargetView] = []
    for r in answers:
        if r.ok:
            source, snap = r.value  # type: ignore[misc]
            views.append(TargetView(r.target, snap, source=source))
        elif normalize(r.target) in implicit:
            notes.append((r.target, _libtpu_absent(str(r.error))))
        else:
            views.append(TargetView(r.target, None, error=str(r.error)))
    return Gathered(views, local, notes, len(picked.processes))


class _Asking(Generic[T]):
    """``call`` for each target, with :attr:`all_asked` set once every target's
    call has started: the local work waits for it, so that no target's
    request waits on the local work (one interpreter lock; on a loaded
    machine each hand-over of it waits for a turn on a core)."""

    def __init__(self, targets: int, call: Callable[[Any], T]) -> None:
        self._left = targets
        self._call = call
        self._lock = threading.Lock()
        self.all_asked = threading.Event()
        if targets <= 0:
            self.all_asked.set()

    def __call__(self, client: Any) -> T:
        with self._lock:
            self._left -= 1
            if self._left <= 0:
                self.all_asked.set()
        return self._call(client)


def _scan_local(scan_devices: bool, prepare: Callable[[], object] | None,
                asked: threading.Event, end: float) -> LocalScan:
    from tpu_info.host import devices

    asked.wait(max(0.0, end - time.monotonic()))
    local = devices.scan_local() if scan_devices else LocalScan()
    if prepare is not None:
        prepare()
    return local
