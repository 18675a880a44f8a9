"""Which Kubernetes pod and container a process runs in, from ``/proc/PID/cgroup``.

The kubelet puts every container of a pod under the pod's own cgroup, named
by the pod's UID, and the container runtime names the container's cgroup by
the container's ID. The spellings differ by cgroup driver and runtime, and a
reader in its own cgroup namespace (cgroup v2's default for containers) sees
the path relative to its own cgroup (``/../../...``); all of these are read
here, by the path's segments:

* cgroupfs driver (v1 or v2): ``/kubepods/burstable/pod<uid>/<id>``,
  ``/kubepods/pod<uid>/<id>`` (Guaranteed), ``/kubepods/besteffort/...``;
* systemd driver (v1 or v2): ``/kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope``
  (containerd), ``crio-<id>.scope`` (CRI-O), ``docker-<id>.scope``
  (dockershim, cri-dockerd); under a kubelet ``--cgroup-root`` the slices
  carry its name in front (kind: ``kubelet-kubepods-burstable-pod...``);
* a static pod's cgroup is named by its config hash (32 hex digits);
* v1 files list one line per hierarchy (``4:memory:/kubepods/...``), v2 one
  line (``0::/kubepods.slice/...``); any line naming a pod will do.

``proc_root`` is an argument, so tests read fixture trees.

Example:
    >>> ref = parse_cgroup("0::/kubepods.slice/kubepods-besteffort.slice/"
    ...     "kubepods-besteffort-pod0b3c6a0e_4f7e_4a8e_9d1b_2c5e8f0a1b2c.slice/"
    ...     "cri-containerd-" + "ab" * 32 + ".scope\\n")
    >>> ref.pod_uid, ref.container_id[:8], ref.runtime
    ('0b3c6a0e-4f7e-4a8e-9d1b-2c5e8f0a1b2c', 'abababab', 'containerd')
    >>> parse_cgroup("0::/user.slice/user-1000.slice/session-3.scope\\n") is None
    True
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

PROC_ROOT = "/proc"
MAX_CGROUP_BYTES = 64 * 1024  # a v1 file lists a dozen hierarchies; a stranger's is cut

# A UID (dashes, or _ in systemd's unit names), or a static pod's config hash.
_UID = (r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
        r"|[0-9a-f]{32}")
# cgroupfs: pod<uid>; systemd: kubepods[-qos]-pod<uid with _>.slice, with the
# kubelet's cgroup root in front when it has one (kind: kubelet-kubepods-...)
_POD = re.compile(rf"^(?:pod({_UID})|(?:[a-z0-9.]+-)?kubepods(?:-[a-z]+)?-pod({_UID})\.slice)$")
_ID = r"[0-9a-f]{64}"
# systemd scopes by runtime; cgroupfs: the bare ID (runtime unknown from the path)
_CONTAINER = re.compile(rf"^(?:(cri-containerd|crio|docker)-({_ID})\.scope|({_ID}))$")
RUNTIMES = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker"}


@dataclass(frozen=True, slots=True)
class PodRef:
    """A process's pod (its UID, dashed) and container (its ID: 64 hex
    digits, the runtime's; ``""`` when the path names the pod alone), and the
    runtime the path's spelling names (``containerd``, ``cri-o``,
    ``docker``; ``""`` for cgroupfs' bare IDs)."""

    pod_uid: str
    container_id: str = ""
    runtime: str = ""


def _segment_ref(segments: list[str]) -> PodRef | None:
    for i, seg in enumerate(segments):
        m = _POD.match(seg)
        if m is None:
            continue
        uid = (m.group(1) or m.group(2)).replace("_", "-")
        for after in segments[i + 1:]:
            c = _CONTAINER.match(after)
            if c is not None:
                runtime, scoped, bare = c.groups()
                return PodRef(uid, scoped or bare, RUNTIMES.get(runtime or "", ""))
            if after.startswith("crio-conmon-"):  # CRI-O's monitor beside the container
                return PodRef(uid)
        return PodRef(uid)
    return None


def parse_cgroup(text: str) -> PodRef | None:
    """The pod and container a ``/proc/PID/cgroup`` file names, or None for
    a process in no pod. Where several lines name one, the first that names
    a container wins."""
    found: PodRef | None = None
    for line in text.splitlines():
        _, _, path = line.partition(":")
        _, _, path = path.partition(":")  # hierarchy-ID:controllers:path
        if "pod" not in path:
            continue
        ref = _segment_ref(path.strip().split("/"))
        if ref is None:
            continue
        if ref.container_id:
            return ref
        found = found or ref
    return found


def pod_of(pid: int, proc_root: str = PROC_ROOT) -> PodRef | None:
    """:func:`parse_cgroup` of ``pid``'s cgroup file; None when it is in no
    pod or the file cannot be read (the process ended, or ``/proc`` is
    another pid namespace's)."""
    try:
        with open(os.path.join(proc_root, str(pid), "cgroup"), "rb") as f:
            data = f.read(MAX_CGROUP_BYTES)
    except OSError:
        return None
    return parse_cgroup(data.decode("ascii", "replace"))
