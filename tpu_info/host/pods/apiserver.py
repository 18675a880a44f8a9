"""The Kubernetes API server's word on this node's pods, with the DaemonSet's service account.

One request, ``GET /api/v1/pods?fieldSelector=spec.nodeName=NODE&resourceVersion=0``
(served from the API server's watch cache, as node agents are asked to),
answers each pod of the node with its UID, namespace, name and the IDs of its
running containers: an exact join with what a process's cgroup says
(:mod:`tpu_info.host.pods.cgroup`). In a pod, the service account's token and
CA are the files Kubernetes mounts (:data:`SERVICE_ACCOUNT`; the token is
read again for each request: projected tokens rotate) and the address is
``$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``. The account needs
``list`` on ``pods`` (``deploy/kubernetes/tpu-info-exporter.yaml``'s
ClusterRole).

The answer is bounded (:data:`MAX_REPLY_BYTES`), parsed as JSON, and every
name cleaned and cut.

Example:
    >>> api = ApiServer.in_cluster(environ={})
    >>> api is None  # not in a pod: no KUBERNETES_SERVICE_HOST
    True
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tpu_info.contract.errors import TpuInfoError
from tpu_info.contract.safe import clean

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
MAX_REPLY_BYTES = 64 * 1024 * 1024  # ~110 pods of a node at tens of KB each, and room
MAX_PODS = 10_000
MAX_CONTAINERS = 256
MAX_NAME = 253
MIRROR = "kubernetes.io/config.mirror"  # a static pod's mirror: the UID its cgroup carries


class ApiUnavailable(TpuInfoError):
    """The API server could not be asked, refused, or answered nothing usable."""


@dataclass(frozen=True, slots=True)
class ApiPod:
    """A pod of the node: UID, namespace, name, and container ID -> name
    (the IDs without their ``containerd://`` scheme; init and ephemeral
    containers included)."""

    uid: str
    namespace: str
    name: str
    containers: Mapping[str, str] = field(default_factory=dict)
    static_uid: str = ""  # a mirror pod's: its static pod's UID (the cgroup's)


def _name(v: object) -> str:
    return clean(v, MAX_NAME) if isinstance(v, str) else ""


def _container_id(v: object) -> str:
    """``containerd://abc...`` -> ``abc...`` (lower case hex only)."""
    if not isinstance(v, str):
        return ""
    cid = v.rpartition("://")[2].lower()
    return cid if len(cid) == 64 and all(c in "0123456789abcdef" for c in cid) else ""


def parse_pods(doc: Any) -> list[ApiPod]:
    """The pods of a ``PodList`` document.

    Raises:
        ApiUnavailable: the document is not a PodList.
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
        raise ApiUnavailable(f"the answer is not a PodList (kind {clean(kind, 40)!r})")
    out = []
    for item in doc["items"][:MAX_PODS]:
        meta = item.get("metadata") if isinstance(item, dict) else None
        status = item.get("status") if isinstance(item, dict) else None
        if not isinstance(meta, dict):
            continue
        uid, ns, name = (_name(meta.get(k)) for k in ("uid", "namespace", "name"))
        if not (uid and ns and name):
            continue
        containers: dict[str, str] = {}
        if isinstance(status, dict):
            for key in ("containerStatuses", "initContainerStatuses",
                        "ephemeralContainerStatuses"):
                statuses = status.get(key)
                for c in statuses[:MAX_CONTAINERS] if isinstance(statuses, list) else ():
                    if isinstance(c, dict) and _container_id(c.get("containerID")):
                        containers[_container_id(c.get("containerID"))] = _name(c.get("name"))
        notes = meta.get("annotations")
        static = _name(notes.get(MIRROR)) if isinstance(notes, dict) else ""
        out.append(ApiPod(uid.lower(), ns, name, containers, static.lower()))
    return out


class ApiServer:
    """Asks one API server for one node's pods.

    Args:
        host, port: the API server (in a pod: the ``kubernetes`` Service's).
        token_file: the service account's bearer token, read for each request.
        ca_file: the CA that signed the API server's certificate.
    """

    def __init__(self, host: str, port: int, token_file: str, ca_file: str) -> None:
        self.host, self.port = host, port
        self.token_file, self.ca_file = token_file, ca_file
        self._tls: ssl.SSLContext | None = None

    @classmethod
    def in_cluster(cls, environ: Mapping[str, str] | None = None,
                   account: str = SERVICE_ACCOUNT) -> ApiServer | None:
        """The API server a pod reaches with its service account; None
        outside a pod or without a mounted token."""
        env = os.environ if environ is None else environ
        host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT")
        token = os.path.join(account, "token")
        if not host or not os.path.exists(token):
            return None
        try:
            number = int(port or 443)
        except ValueError:
            return None
        return cls(host, number, token, os.path.join(account, "ca.crt"))

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def _context(self) -> ssl.SSLContext:
        if self._tls is None:
            try:
                self._tls = ssl.create_default_context(cafile=self.ca_file)
            except (OSError, ssl.SSLError) as e:
                raise ApiUnavailable(f"cannot load the CA {self.ca_file}: {e}",
                                     target=self.address) from None
        return self._tls

    def node_pods(self, node: str, timeout: float = 2.0) -> list[ApiPod]:
        """The pods scheduled to ``node``.

        Raises:
            ApiUnavailable: no token, no connection, a refusal (401/403: the
                service account lacks ``list pods``), or an answer that is
                not a PodList within ``timeout`` seconds (one line).
        """
        try:
            with open(self.token_file, encoding="utf-8") as f:
                token = f.read(16 * 1024).strip()
        except OSError as e:
            raise ApiUnavailable(f"no service-account token ({e.strerror or e})",
                                 target=self.address) from None
        query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={node}",
                                        "resourceVersion": "0"})
        conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                           context=self._context())
        try:
            conn.request("GET", f"/api/v1/pods?{query}", headers={
                "Authorization": f"Bearer {token}", "Accept": "application/json",
                "User-Agent": "tpu-info-exporter"})
            reply = conn.getresponse()
            body = reply.read(MAX_REPLY_BYTES + 1)
        except (OSError, http.client.HTTPException, ssl.SSLError) as e:
            raise ApiUnavailable(clean(f"cannot ask: {e}", 300), target=self.address) from None
        finally:
            conn.close()
        if reply.status != 200:
            hint = (" (the service account needs list on pods: the ClusterRole in "
                    "deploy/kubernetes/tpu-info-exporter.yaml)" if reply.status in (401, 403)
                    else "")
            raise ApiUnavailable(f"HTTP {reply.status} {clean(reply.reason, 60)}{hint}",
                                 target=self.address)
        if len(body) > MAX_REPLY_BYTES:
            raise ApiUnavailable(f"an answer over {MAX_REPLY_BYTES >> 20} MiB",
                                 target=self.address)
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            raise ApiUnavailable("the answer is not JSON", target=self.address) from None
        try:
            return parse_pods(doc)
        except ApiUnavailable as e:
            raise e.with_target(self.address) from None
