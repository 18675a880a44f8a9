"""Kubernetes pods of this node's processes (``tpu-info exporter``'s pod labels).

* :mod:`~tpu_info.host.pods.cgroup`: a process's pod UID and container ID,
  from ``/proc/PID/cgroup`` (cgroup v1 and v2, cgroupfs and systemd drivers,
  containerd, CRI-O, docker);
* :mod:`~tpu_info.host.pods.kubelet`: the kubelet's pod-resources API (pod
  names, namespaces, containers) over its Unix socket;
* :mod:`~tpu_info.host.pods.apiserver`: the API server's pods of the node,
  with the DaemonSet's service account;
* :mod:`~tpu_info.host.pods.resolver`: :class:`PodResolver` joins them into
  each process's ``namespace``, ``pod``, ``container`` and ``node``.

Example:
    >>> PodIdentity("ml", "train-0", "trainer", "node-1", "kubelet").labels()
    {'namespace': 'ml', 'pod': 'train-0', 'container': 'trainer', 'node': 'node-1'}
"""

from __future__ import annotations

from tpu_info.host.pods.apiserver import ApiServer, ApiUnavailable
from tpu_info.host.pods.cgroup import PodRef, parse_cgroup, pod_of
from tpu_info.host.pods.kubelet import DEFAULT_SOCKET, KubeletUnavailable, list_pods
from tpu_info.host.pods.resolver import PodIdentity, PodResolver

__all__ = ["ApiServer", "ApiUnavailable", "DEFAULT_SOCKET", "KubeletUnavailable", "PodIdentity",
           "PodRef", "PodResolver", "list_pods", "parse_cgroup", "pod_of"]
