"""Kubernetes pods of a node's processes: the cgroup parser on the files each
driver and runtime writes, the pod-resources client against a fake kubelet
on a Unix socket (the kubelet's method path and field numbers, with fields
we do not read), the API-server client against a fake HTTPS API server, and
the resolver that joins them (issue 43: per-process series carry
``namespace``, ``pod``, ``container``, ``node``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.fixtures.kube import (
    CGROUPS,
    CID_A,
    CID_B1,
    CID_B2,
    STATIC,
    UID_A,
    UID_B,
    FakeApiServer,
    KubeletPod,
    api_pod,
    build_cgroups,
    cgroup_v2,
    fake_kubelet,
)
from tpu_info.host.pods import (
    ApiServer,
    KubeletUnavailable,
    PodRef,
    PodResolver,
    list_pods,
    parse_cgroup,
    pod_of,
)
from tpu_info.host.pods import kubelet as kubelet_mod
from tpu_info.host.pods import resolver as resolver_mod

# --- cgroup ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CGROUPS))
def test_each_drivers_and_runtimes_cgroup_names_the_pod_and_container(name, tmp_path):
    text, want = CGROUPS[name]
    expected = PodRef(*want) if want is not None else None
    assert parse_cgroup(text) == expected
    proc = build_cgroups(tmp_path, {4242: text})
    assert pod_of(4242, str(proc)) == expected  # the same read from a /proc tree


def test_a_process_that_is_gone_or_unreadable_is_in_no_pod(tmp_path):
    proc = build_cgroups(tmp_path, {})
    assert pod_of(4242, str(proc)) is None


# --- the kubelet's pod-resources API ----------------------------------------------

PODS = [KubeletPod("ml", "train-0", [("trainer", ["0", "1", "2", "3"])]),
        KubeletPod("ml", "train-1", [("trainer", ["4"]), ("sidecar", [])]),
        KubeletPod("kube-system", "kube-proxy-x", [("kube-proxy", [])])]


def test_list_reads_the_kubelets_answer_and_skips_fields_it_does_not_know(tmp_path):
    sock = tmp_path / "kubelet.sock"
    with fake_kubelet(sock, PODS) as k:
        pods = list_pods(str(sock), timeout=5)
    assert k.calls == 1
    assert [(p.namespace, p.name, [c.name for c in p.containers]) for p in pods] == [
        ("ml", "train-0", ["trainer"]), ("ml", "train-1", ["trainer", "sidecar"]),
        ("kube-system", "kube-proxy-x", ["kube-proxy"])]
    assert pods[0].containers[0].devices == (("google.com/tpu", ("0", "1", "2", "3")),)


def test_a_hostile_kubelet_answer_is_cleaned(tmp_path):
    sock = tmp_path / "kubelet.sock"
    evil = [KubeletPod("ml\x1b[31m", "x" * 5000, [("c\nd", [])]), KubeletPod("", "nameless")]
    with fake_kubelet(sock, evil):
        (pod,) = list_pods(str(sock), timeout=5)  # a pod without a namespace is left out
    assert pod.namespace == "ml\ufffd[31m" and len(pod.name) == 253
    assert pod.containers[0].name == "c\ufffdd"


def test_a_kubelet_that_is_not_there_or_refuses_says_why_in_one_line(tmp_path, monkeypatch):
    with pytest.raises(KubeletUnavailable, match="no such socket"):
        list_pods(str(tmp_path / "absent.sock"), timeout=1)
    plain = tmp_path / "file.sock"
    plain.write_text("")
    with pytest.raises(KubeletUnavailable, match="not a socket"):
        list_pods(str(plain), timeout=1)
    sock = tmp_path / "kubelet.sock"
    with fake_kubelet(sock, PODS):
        # The kubelet's socket is root's, mode 0755: a non-root reader may not connect.
        monkeypatch.setattr(kubelet_mod.os, "access", lambda path, mode: False)
        with pytest.raises(KubeletUnavailable, match="permission denied.*write permission"):
            list_pods(str(sock), timeout=1)


def test_a_socket_that_serves_something_else_is_not_a_kubelet(tmp_path):
    from concurrent import futures

    import grpc

    sock = tmp_path / "other.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_insecure_port(f"unix:{sock}")
    server.start()
    try:
        with pytest.raises(KubeletUnavailable, match="does not serve"):
            list_pods(str(sock), timeout=5)
    finally:
        server.stop(None)


# --- the resolver, kubelet only --------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _proc(tmp_path: Path) -> Path:
    return build_cgroups(tmp_path, {
        101: cgroup_v2(UID_A, CID_A),  # train-0's only container
        102: cgroup_v2(UID_B, CID_B1),  # train-1's trainer
        104: cgroup_v2(UID_B, CID_B2),  # train-1's sidecar
        103: CGROUPS["a VM's login session"][0],  # not in a pod
    })


HOSTS = {"p101": "train-0", "p102": "train-1", "p104": "train-1", "p103": "vm-1"}
KEYS = [("p101", 101), ("p102", 102), ("p104", 104), ("p103", 103)]


def test_the_kubelet_names_pods_by_their_hostname_and_an_only_container(tmp_path):
    sock = tmp_path / "kubelet.sock"
    clock = Clock()
    with fake_kubelet(sock, PODS) as k:
        r = PodResolver(str(_proc(tmp_path)), node="node-a", kubelet_socket=str(sock), clock=clock)
        r.observe(KEYS)
        got = r.labels(HOSTS)
        assert got == {
            "p101": {"namespace": "ml", "pod": "train-0", "container": "trainer",
                     "node": "node-a"},
            # Two containers, and no API server to say which: the pod without one.
            "p102": {"namespace": "ml", "pod": "train-1", "node": "node-a"},
            "p104": {"namespace": "ml", "pod": "train-1", "node": "node-a"},
            "p103": {},  # a host process: no labels
        }
        assert k.calls == 1
        clock.now += 60
        r.observe(KEYS)
        assert r.labels(HOSTS) == got and k.calls == 1  # named for life: not asked again
        # A new process in a pod the kubelet does not list yet: asked again soon,
        # then seldom while it stays unnamed.
        (Path(r.proc_root) / "105").mkdir()
        (Path(r.proc_root) / "105" / "cgroup").write_text(cgroup_v2(UID_A, "c5" * 32))
        keys = [*KEYS, ("p105", 105)]
        hosts = {**HOSTS, "p105": "eval-0"}
        r.observe(keys)
        assert k.calls == 2 and r.labels(hosts)["p105"] == {}
        clock.now += 1
        r.observe(keys)
        assert k.calls == 2  # within NEW_GAP_S
        clock.now += resolver_mod.NEW_GAP_S
        r.observe(keys)
        assert k.calls == 3
        k.pods.append(KubeletPod("eval", "eval-0", [("eval", [])]))
        clock.now += resolver_mod.RETRY_S
        r.observe(keys)
        assert k.calls == 4 and r.labels(hosts)["p105"]["pod"] == "eval-0"
        clock.now += resolver_mod.RETRY_S * 3
        r.observe(keys)
        assert k.calls == 4  # everyone named
        r.observe(KEYS[:1])  # the others ended: forgotten
        assert set(r.labels(HOSTS)) == {"p101"}


def test_a_hostname_that_names_two_pods_or_is_claimed_by_two_pods_says_nothing(tmp_path):
    sock = tmp_path / "kubelet.sock"
    twice = [KubeletPod("ml", "train-0", [("trainer", [])]),
             KubeletPod("dev", "train-0", [("trainer", [])])]
    with fake_kubelet(sock, twice):
        r = PodResolver(str(_proc(tmp_path)), node="node-a", kubelet_socket=str(sock))
        r.observe(KEYS)
        assert r.labels(HOSTS)["p101"] == {}  # ml/train-0 or dev/train-0?
    with fake_kubelet(sock, PODS):
        r = PodResolver(str(_proc(tmp_path)), node="node-a", kubelet_socket=str(sock))
        r.observe(KEYS)
        # train-1's processes and train-0's say one hostname (a pod's spec.hostname):
        assert r.labels({**HOSTS, "p101": "train-1"}) == {
            "p101": {}, "p102": {}, "p104": {}, "p103": {}}


def test_without_a_kubelet_or_an_api_server_no_pod_is_named_and_it_is_said_once(
        tmp_path, caplog):
    r = PodResolver(str(_proc(tmp_path)), node="node-a",
                    kubelet_socket=str(tmp_path / "absent.sock"))
    with caplog.at_level(logging.WARNING, logger="tpu_info.host.pods"):
        for _ in range(3):
            r.observe(KEYS)
            assert all(v == {} for v in r.labels(HOSTS).values())
    said = [m for m in caplog.messages if "pod names from the kubelet" in m]
    assert len(said) == 1 and "no such socket" in said[0]


# --- the API server ----------------------------------------------------------------


@pytest.fixture
def api(tmp_path: Path):
    from tests.tls_certs import make_pki

    pki = make_pki(tmp_path / "pki")
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("s3cret\n")
    (account / "ca.crt").write_bytes((pki / "ca.crt").read_bytes())
    server = FakeApiServer(pki, "s3cret", [
        api_pod(UID_A, "ml", "train-0", "node-a", {CID_A: "trainer"}),
        api_pod(UID_B, "ml", "train-1", "node-a", {CID_B1: "trainer", CID_B2: "sidecar"},
                init={"c0" * 32: "fetch-data"}),
        api_pod("9f" * 16, "ml", "elsewhere", "node-b", {"dd" * 32: "x"}),
    ]).start()
    try:
        yield server, ApiServer.in_cluster(
            {"KUBERNETES_SERVICE_HOST": "127.0.0.1",
             "KUBERNETES_SERVICE_PORT": str(server.port)}, account=str(account))
    finally:
        server.stop()


@pytest.mark.slow  # the certificates are made with the openssl command line
def test_the_api_server_names_pods_and_containers_exactly_when_the_kubelet_is_absent(
        tmp_path, api):
    server, client = api
    r = PodResolver(str(_proc(tmp_path)), node="node-a",
                    kubelet_socket=str(tmp_path / "absent.sock"), api=client)
    r.observe(KEYS)
    got = r.labels({})  # no hostnames needed: pod UID and container ID
    assert got["p102"] == {"namespace": "ml", "pod": "train-1", "container": "trainer",
                           "node": "node-a"}
    assert got["p104"]["container"] == "sidecar" and got["p101"]["container"] == "trainer"
    assert got["p103"] == {}
    assert len(server.requests) == 1
    (query,) = server.requests
    assert query.startswith("/api/v1/pods?") and "spec.nodeName%3Dnode-a" in query
    assert "resourceVersion=0" in query  # the watch cache, as node agents should ask


@pytest.mark.slow
def test_the_kubelet_names_the_pod_and_the_api_server_the_container(tmp_path, api):
    server, client = api
    sock = tmp_path / "kubelet.sock"
    with fake_kubelet(sock, PODS) as k:
        r = PodResolver(str(_proc(tmp_path)), node="node-a", kubelet_socket=str(sock),
                        api=client)
        r.observe(KEYS)
        first = r.labels(HOSTS)
        assert first["p101"]["container"] == "trainer" and not server.requests  # kubelet alone
        assert "container" not in first["p104"]  # train-1 has two: the API server is asked
        r.observe(KEYS)
        assert r.labels(HOSTS)["p104"]["container"] == "sidecar" and len(server.requests) == 1
        assert k.calls == 1


@pytest.mark.slow
def test_an_api_server_that_refuses_says_which_permission_is_missing(tmp_path, api, caplog):
    server, client = api
    server.status = 403
    r = PodResolver(str(_proc(tmp_path)), node="node-a",
                    kubelet_socket=str(tmp_path / "absent.sock"), api=client)
    with caplog.at_level(logging.WARNING, logger="tpu_info.host.pods"):
        r.observe(KEYS)
        assert r.labels({})["p101"] == {}
    assert any("HTTP 403" in m and "list on pods" in m for m in caplog.messages)
    assert client is not None
    (Path(client.token_file)).write_text("rotated")  # projected tokens rotate: read each time
    server.status, server.token = 200, "rotated"
    r2 = PodResolver(str(_proc(tmp_path)), node="node-a",
                     kubelet_socket=str(tmp_path / "absent.sock"), api=client)
    r2.observe(KEYS)
    assert r2.labels({})["p101"]["pod"] == "train-0"


def test_a_static_pods_cgroup_is_named_through_its_mirror_pod():
    from tpu_info.host.pods.apiserver import parse_pods

    mirror = api_pod("e1" * 16, "kube-system", "etcd-node-a", "node-a", {CID_B1: "etcd"})
    mirror["metadata"]["annotations"] = {"kubernetes.io/config.mirror": STATIC}  # type: ignore[index]
    (pod,) = parse_pods({"kind": "PodList", "items": [mirror]})
    assert pod.static_uid == STATIC and pod.containers == {CID_B1: "etcd"}
    with pytest.raises(Exception, match="not a PodList"):
        parse_pods({"kind": "Status", "code": 403})
