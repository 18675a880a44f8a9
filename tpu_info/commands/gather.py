"""One look at everything ``tpu-info`` shows: local chips, discovered hooked
processes, libtpu on localhost:8431 and the targets the user named.

What is read without being named (:func:`local_targets`, shared with the
dashboard): this user's discovery records whose port is not held by another
user's socket, and ``localhost:8431`` only when it is libtpu this user may
trust (:func:`tpu_info.host.listeners.judge_libtpu_port`) or a record of this user
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
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tpu_info.commands import budget
from tpu_info.contract.model import LocalScan
from tpu_info.host.listeners import ProcNet, judge_libtpu_port
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


def local_targets(scan: Scan | None, net: ProcNet, *, uid: int | None = None,
                  libtpu_target: str | None = LIBTPU_TARGET,
                  named: Sequence[str] = ()) -> LocalTargets:
    """Picks this host's targets from a discovery ``scan`` and ``/proc``.

    Every process ``scan`` found is read (it already skipped records whose
    port another user holds). ``libtpu_target`` is read when a record of this
    user names it, or when :func:`judge_libtpu_port` accepts who listens; a
    target the user ``named`` is left to them.
    """
    uid = os.geteuid() if uid is None else uid
    notes: list[tuple[str, str]] = []
    processes: list[tuple[str, tuple[str, ...]]] = []
    if scan is not None:
        notes += [("discovery", line) for line in scan.summary()]
        processes = [(p.target, p.argv) for p in scan.processes]
        if not scan.processes:
            notes.append(("discovery", f"no hooked process of this user found in "
                          f"{scan.directory} (start one with metrics.install() or "
                          "`tpu-info run -- python ...`)"))
    libtpu = None
    recorded = {normalize(t) for t, _ in processes}
    if libtpu_target is not None and normalize(libtpu_target) in recorded:
        notes.append((libtpu_target, "read as a hooked process: a discovery record of yours "
                      "names this port"))
    elif libtpu_target is not None and normalize(libtpu_target) in map(normalize, named):
        notes.append((libtpu_target, "read because you named it with --target, whoever "
                      "listens there"))
    elif libtpu_target is not None:
        port = int(libtpu_target.rpartition(":")[2])
        verdict = judge_libtpu_port(net.listeners(port), port, uid)
        if verdict.read:
            libtpu = libtpu_target
            notes.append((libtpu_target, verdict.why))
        elif verdict.listening:
            notes.append((libtpu_target, verdict.why))
        else:
            notes.append((libtpu_target, f"libtpu not present: {verdict.why} (normal on "
                          "machines without TPUs, or when no TPU program runs)"))
    return LocalTargets(processes, libtpu, notes)


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
    libtpu_target: str = LIBTPU_TARGET,
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
    picked = local_targets(found, net, libtpu_target=libtpu_target if probe_libtpu else None,
                           named=targets)
    notes = list(picked.notes)
    order = [t for t, _ in picked.processes] + list(targets)
    implicit: set[str] = set()
    if picked.libtpu is not None:
        order.append(picked.libtpu)
        implicit.add(normalize(picked.libtpu))
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
            notes.append((r.target, f"libtpu not present: {r.error} (normal on machines "
                          "without TPUs, or when no TPU program runs)"))
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
