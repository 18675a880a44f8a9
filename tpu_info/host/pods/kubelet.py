"""The kubelet's pod-resources API: the pods of this node, by name and namespace.

The kubelet serves ``v1.PodResourcesLister`` on a Unix socket
(:data:`DEFAULT_SOCKET`); ``List`` answers every pod on the node with its
namespace, its containers and the devices each container was given (the
service device-monitoring agents such as dcgm-exporter read). It says no pod
UID and no container ID, which is why :mod:`tpu_info.host.pods.resolver`
matches its pods by name. The socket is the kubelet's, created as root with
mode 0755 under the usual umask: connecting needs write permission, so a
non-root reader is refused (said as :class:`KubeletUnavailable`).

Everything in an answer is validated: at most :data:`MAX_PODS` pods of at
most :data:`MAX_CONTAINERS` containers each, names cleaned and cut, the whole
answer at most :data:`MAX_REPLY_BYTES`.

Example:
    >>> try:
    ...     list_pods("/nonexistent/kubelet.sock", timeout=0.5)
    ... except KubeletUnavailable as e:
    ...     print(e)
    /nonexistent/kubelet.sock: no such socket (not a Kubernetes node, or not mounted here)
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

import grpc

from tpu_info.contract.errors import TpuInfoError
from tpu_info.contract.safe import clean
from tpu_info.proto import kubelet_podresources_pb2 as kpb

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"  # the kubelet's service and method
MAX_REPLY_BYTES = 16 * 1024 * 1024  # the kubelet's own default send limit
MAX_PODS = 10_000  # a node runs at most a few hundred (the kubelet's default max-pods: 110)
MAX_CONTAINERS = 256
MAX_NAME = 253  # a Kubernetes object name's longest (DNS subdomain)


class KubeletUnavailable(TpuInfoError):
    """The pod-resources socket is absent, refused, or answered nothing usable."""


@dataclass(frozen=True, slots=True)
class ListedContainer:
    """A container of a listed pod and its devices: ``(resource name,
    device IDs)`` per resource (``google.com/tpu``)."""

    name: str
    devices: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class ListedPod:
    """A pod the kubelet runs: its namespace, name and containers."""

    namespace: str
    name: str
    containers: tuple[ListedContainer, ...] = ()


def _why_not(path: str) -> str | None:
    """Why ``path`` cannot be dialled, before gRPC hides the reason; None if
    it may be."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "no such socket (not a Kubernetes node, or not mounted here)"
    except OSError as e:
        return f"cannot be read: {e.strerror or e}"
    if not stat.S_ISSOCK(st.st_mode):
        return "not a socket"
    if not os.access(path, os.W_OK):
        return (f"permission denied: the socket is uid {st.st_uid}'s, mode "
                f"{stat.S_IMODE(st.st_mode):04o}, and connecting needs write permission "
                "(the kubelet's is root's)")
    return None


def _name(text: str) -> str:
    return clean(text, MAX_NAME)


def _pods(reply: kpb.ListPodResourcesResponse) -> list[ListedPod]:
    out = []
    for p in reply.pod_resources[:MAX_PODS]:
        containers = tuple(
            ListedContainer(_name(c.name), tuple(
                (_name(d.resource_name), tuple(_name(i) for i in d.device_ids[:MAX_CONTAINERS]))
                for d in c.devices[:16]))
            for c in p.containers[:MAX_CONTAINERS])
        if p.name and p.namespace:
            out.append(ListedPod(_name(p.namespace), _name(p.name), containers))
    return out


def list_pods(socket_path: str = DEFAULT_SOCKET, timeout: float = 1.0) -> list[ListedPod]:
    """Every pod the kubelet at ``socket_path`` runs.

    Raises:
        KubeletUnavailable: no socket, no permission, no answer within
            ``timeout`` seconds, or an answer that is not the service's
            (the message says which, on one line).
    """
    why = _why_not(socket_path)
    if why is not None:
        raise KubeletUnavailable(why, target=socket_path)
    options = [("grpc.max_receive_message_length", MAX_REPLY_BYTES),
               ("grpc.enable_retries", 0), ("grpc.enable_http_proxy", 0)]
    target = "unix:" + os.path.abspath(socket_path)
    try:
        with grpc.insecure_channel(target, options=options) as channel:
            call = channel.unary_unary(
                LIST_METHOD, request_serializer=kpb.ListPodResourcesRequest.SerializeToString,
                response_deserializer=kpb.ListPodResourcesResponse.FromString)
            reply = call(kpb.ListPodResourcesRequest(), timeout=timeout)
    except grpc.RpcError as e:
        code = e.code() if isinstance(e, grpc.Call) else None
        detail = clean(e.details() if isinstance(e, grpc.Call) else str(e), 200)
        if code == grpc.StatusCode.UNIMPLEMENTED:
            detail = "the kubelet does not serve v1.PodResourcesLister/List (Kubernetes < 1.20?)"
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
            detail = f"no answer within {timeout:g}s"
        elif code == grpc.StatusCode.UNAVAILABLE and "ermission" in detail:
            detail = f"permission denied ({detail})"
        raise KubeletUnavailable(detail or f"gRPC {code}", target=socket_path) from None
    except OSError as e:  # the socket went away between the check and the dial
        raise KubeletUnavailable(os.strerror(e.errno or errno.EIO),
                                 target=socket_path) from None
    return _pods(reply)
