"""Each process's Kubernetes pod: ``namespace``, ``pod``, ``container``, ``node``.

A process's cgroup names its pod's UID and its container's ID
(:mod:`tpu_info.host.pods.cgroup`); names come from one of two sources:

1. the kubelet's pod-resources API (:mod:`tpu_info.host.pods.kubelet`), on
   the node, when its socket is there and may be dialled. It lists each
   pod's name, namespace and containers but no UID, so a process is matched
   by its hostname, which is its pod's name (unless the pod sets
   ``spec.hostname`` or runs with ``hostNetwork``): exactly one listed pod of
   that name, claimed by no process of another pod UID; the container is the
   pod's only one (a pod of several leaves ``container`` out, or to the API
   server);
2. the API server (:mod:`tpu_info.host.pods.apiserver`), with the
   DaemonSet's service account, when the kubelet's socket is absent or
   refused, or for the processes its answer did not name: an exact join by
   pod UID and container ID.

Sources are asked only while a process's pod is not yet named: at most every
:data:`NEW_GAP_S` seconds in the process's first :data:`RETRY_S` seconds
(its pod or container may not be listed yet), then every :data:`RETRY_S`. A process's identity is
kept for its life. What a source said when it failed is logged once.

Example:
    >>> r = PodResolver(proc_root="/nonexistent", kubelet_socket="", api=None)
    >>> r.observe([("k", 1)], budget_s=0.1)
    >>> r.labels({"k": "train-0"})
    {'k': {}}
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass

from tpu_info.contract.errors import TpuInfoError
from tpu_info.host.pods import kubelet
from tpu_info.host.pods.apiserver import ApiPod, ApiServer
from tpu_info.host.pods.cgroup import PROC_ROOT, PodRef, pod_of

log = logging.getLogger("tpu_info.host.pods")

NEW_GAP_S = 2.0  # a pod seen for the first time: sources asked again at most this often
RETRY_S = 30.0  # a pod still unnamed: asked again after this long
KUBELET_TIMEOUT_S = 1.0
API_TIMEOUT_S = 2.0
KUBELET, API = "kubelet", "apiserver"


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """Where a process runs: its pod's namespace and name, its container
    (``""``: not known) and node, and the source that named them."""

    namespace: str
    pod: str
    container: str
    node: str
    source: str

    def labels(self) -> dict[str, str]:
        """The Prometheus labels, dcgm-exporter's names; empty values left out."""
        pairs = (("namespace", self.namespace), ("pod", self.pod),
                 ("container", self.container), ("node", self.node))
        return {k: v for k, v in pairs if v}


class PodResolver:
    """Names the pods of a node's processes. Not locked: one caller (the
    exporter's poll).

    Args:
        proc_root: where the host's ``/proc`` is (the exporter's ``--procfs``).
        node: this node's name (the ``node`` label and the API server's
            field selector); ``""`` when not known (no API server then).
        kubelet_socket: the pod-resources socket; ``""``: never ask.
        api: the API server, or None.
        clock: monotonic seconds.
    """

    def __init__(self, proc_root: str = PROC_ROOT, node: str = "",
                 kubelet_socket: str = kubelet.DEFAULT_SOCKET, api: ApiServer | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 list_pods: Callable[[str, float], list[kubelet.ListedPod]] = kubelet.list_pods
                 ) -> None:
        self.proc_root, self.node = proc_root, node
        self.kubelet_socket = kubelet_socket
        self.api = api if node else None
        self._clock = clock
        self._list_pods = list_pods
        self._refs: dict[Hashable, PodRef | None] = {}
        self._named: dict[Hashable, PodIdentity] = {}  # final: kept for the process's life
        self._listed: list[kubelet.ListedPod] | None = None
        self._by_uid: dict[str, ApiPod] = {}
        self._asked: dict[str, float] = {}  # source -> when last asked
        self._first_seen: dict[Hashable, float] = {}
        self._kubelet_down = not kubelet_socket  # its last answer failed, or never asked
        self._want_api = False
        self._said: dict[str, str] = {}  # source -> the failure last logged

    # One poll -------------------------------------------------------------------

    def observe(self, processes: Iterable[tuple[Hashable, int]], budget_s: float = 2.0) -> None:
        """Reads the cgroup of each ``(key, pid)`` not read yet, forgets the
        processes not given, and asks the sources when a pod is unnamed (at
        most ``budget_s`` seconds in all)."""
        started = self._clock()
        given = dict(processes)
        for key in [k for k in self._refs if k not in given]:
            for kept in (self._refs, self._named, self._first_seen):
                kept.pop(key, None)
        for key, pid in given.items():
            if key not in self._refs:
                self._refs[key] = pod_of(pid, self.proc_root)
                self._first_seen[key] = started
        unnamed = [k for k, r in self._refs.items() if r is not None and k not in self._named]
        if not unnamed:
            return
        # A process seen lately (its pod or container may not be listed yet):
        # asked again soon; one that stays unnamed, seldom.
        new = any(started - self._first_seen[k] < RETRY_S for k in unnamed)
        if self.kubelet_socket and self._due(KUBELET, new):
            self._ask_kubelet(min(KUBELET_TIMEOUT_S, budget_s))
        if self.api is not None and (self._kubelet_down or self._want_api) and self._due(API, new):
            left = budget_s - (self._clock() - started)
            if left > 0.05:
                self._ask_api(min(API_TIMEOUT_S, left))

    def labels(self, hosts: Mapping[Hashable, str]) -> dict[Hashable, dict[str, str]]:
        """The pod labels of each process observed this poll, given the
        hostname its snapshot says (``hosts``: key -> hostname, ``""`` when
        unknown); ``{}`` for a process in no pod, or whose pod no source
        named."""
        claims: dict[str, set[str]] = {}  # hostname -> the pod UIDs whose processes say it
        for key, ref in self._refs.items():
            if ref is not None and hosts.get(key):
                claims.setdefault(hosts[key], set()).add(ref.pod_uid)
        out: dict[Hashable, dict[str, str]] = {}
        for key, ref in self._refs.items():
            named = self._named.get(key)
            if named is not None or ref is None:
                out[key] = named.labels() if named is not None else {}
                continue
            host = hosts.get(key, "")
            found = self._from_api(ref) or (
                self._from_kubelet(ref, host) if claims.get(host) == {ref.pod_uid} else None)
            if found is None:
                self._want_api = True
                out[key] = {}
                continue
            identity, final = found
            if final:
                self._named[key] = identity
            else:
                self._want_api = True
            out[key] = identity.labels()
        return out

    # Sources --------------------------------------------------------------------

    def _due(self, source: str, new: bool) -> bool:
        last = self._asked.get(source)
        return last is None or self._clock() - last >= (NEW_GAP_S if new else RETRY_S)

    def _ask_kubelet(self, timeout: float) -> None:
        self._asked[KUBELET] = self._clock()
        try:
            self._listed = self._list_pods(self.kubelet_socket, timeout)
        except TpuInfoError as e:
            # Absent, refused or silent: the API server names pods instead
            # until the kubelet answers again (asked when due: a stat of an
            # absent socket costs nothing).
            self._listed = None
            self._kubelet_down = True
            self._say(KUBELET, str(e) + ("; asking the API server instead" if self.api else ""))
            return
        self._kubelet_down = False
        self._said.pop(KUBELET, None)

    def _ask_api(self, timeout: float) -> None:
        assert self.api is not None
        self._asked[API] = self._clock()
        self._want_api = False
        try:
            pods = self.api.node_pods(self.node, timeout)
        except TpuInfoError as e:
            self._say(API, str(e))
            return
        self._said.pop(API, None)
        by_uid = {}
        for p in pods:
            by_uid[p.uid] = p
            if p.static_uid:
                by_uid.setdefault(p.static_uid, p)
        self._by_uid = by_uid

    def _say(self, source: str, words: str) -> None:
        if self._said.get(source) != words:
            self._said[source] = words
            log.warning("tpu-info exporter: pod names from the %s: %s", source, words)

    # Joins ----------------------------------------------------------------------

    def _from_api(self, ref: PodRef) -> tuple[PodIdentity, bool] | None:
        pod = self._by_uid.get(ref.pod_uid)
        if pod is None:
            return None
        container = pod.containers.get(ref.container_id, "") if ref.container_id else ""
        # A container not in the pod's status yet (it just started): asked again.
        return (PodIdentity(pod.namespace, pod.name, container, self.node, API),
                bool(container) or not ref.container_id)

    def _from_kubelet(self, ref: PodRef, hostname: str) -> tuple[PodIdentity, bool] | None:
        """The one listed pod named ``hostname`` (a process's hostname is its
        pod's name; the caller checked no other pod's process says it too)."""
        if not self._listed or not hostname:
            return None
        same = [p for p in self._listed if p.name == hostname]
        if len(same) != 1:  # none, or one name in two namespaces: it says nothing
            return None
        pod = same[0]
        container = pod.containers[0].name if len(pod.containers) == 1 else ""
        # Several containers: the API server, where there is one, tells which.
        final = bool(container) or self.api is None
        return PodIdentity(pod.namespace, pod.name, container, self.node, KUBELET), final
