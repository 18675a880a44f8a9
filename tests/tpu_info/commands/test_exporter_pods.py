"""``tpu-info exporter`` on a Kubernetes node: each hooked process's series
carry its pod's ``namespace``, ``pod``, ``container`` and ``node`` (issue 43:
"Kubernetes users cannot tell pods apart").

Real parts: hooked processes in subprocesses (``metrics.install`` serving
gRPC, writing discovery records; each says the hostname a pod gives it), the
exporter and its pod-resources client dialling a fake kubelet on a Unix
socket (tests/fixtures/kube.py: the kubelet's method and field numbers). The
seam: the processes' cgroup files are a fixture ``/proc`` tree read by the
real parser (this machine runs no pods).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.fixtures.kube import (
    CID_A,
    CID_B1,
    UID_A,
    UID_B,
    KubeletPod,
    build_cgroups,
    cgroup_v2,
    fake_kubelet,
)
from tpu_info.commands.exporter import ExporterOptions, HostExporter
from tpu_info.contract.model import LocalScan
from tpu_info.host.pods import PodResolver

pytestmark = pytest.mark.slow

# A hooked process whose hostname is its pod's name, as a pod's UTS namespace gives it.
PROCESS = textwrap.dedent("""
    import json, os, socket, sys
    socket.gethostname = lambda: os.environ["POD_HOSTNAME"]
    import metrics
    metrics.install(engines=[], port=0)
    print(json.dumps({"pid": os.getpid()}), flush=True)
    sys.stdin.read()
""")


def _hooked(runtime: Path, hostname: str) -> tuple[subprocess.Popen[str], int]:
    env = dict(os.environ, TPU_INFO_RUNTIME_DIR=str(runtime), POD_HOSTNAME=hostname,
               PYTHONPATH=str(ROOT))
    env.pop("RANK", None)
    proc = subprocess.Popen([sys.executable, "-c", PROCESS], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    line = proc.stdout.readline() if proc.stdout else ""
    assert line, f"hooked process did not start (exit {proc.poll()})"
    return proc, json.loads(line)["pid"]


def _labels(line: str) -> dict[str, str]:
    inside = line[line.index("{") + 1:line.rindex("}")]
    return dict((k, v.strip('"')) for k, v in (p.split("=", 1) for p in inside.split('",')
                                              if "=" in p))


def test_each_process_series_carry_its_pod_and_two_pods_programs_stay_apart(tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    procs = [_hooked(runtime, host) for host in ("train-0", "train-1", "tpu-vm-1")]
    try:
        (p0, pid0), (p1, pid1), (p2, pid2) = procs
        proc_root = build_cgroups(tmp_path, {
            pid0: cgroup_v2(UID_A, CID_A), pid1: cgroup_v2(UID_B, CID_B1),
            pid2: "0::/user.slice/user-1000.slice/session-3.scope\n"})  # a host process
        sock = tmp_path / "kubelet.sock"
        pods = [KubeletPod("ml", "train-0", [("trainer", ["0", "1", "2", "3"])]),
                KubeletPod("research", "train-1", [("jax", ["4", "5"])])]
        with fake_kubelet(sock, pods) as kubelet:
            resolver = PodResolver(str(proc_root), node="gke-tpu-node-a",
                                   kubelet_socket=str(sock))
            ex = HostExporter(ExporterOptions(host_label="gke-tpu-node-a", runtime_dir=runtime,
                                              libtpu_target=None, timeout_s=5.0),
                              scan_chips=LocalScan, pods=resolver)
            ex.poll()
            body = ex.body("", "")[0].decode()
        up = {line for line in body.splitlines() if line.startswith("tpu_info_target_up{")}
        assert len(up) == 3 and all(line.endswith(" 1.0") for line in up), up
        assert sorted(_labels(line).get("pod", "") for line in up) == ["", "train-0", "train-1"]
        info = [_labels(line) for line in body.splitlines()
                if line.startswith("tpu_info_process_info{")]
        by_pid = {int(x["pid"]): x for x in info}
        assert {k: by_pid[pid0].get(k) for k in ("namespace", "pod", "container", "node")} == {
            "namespace": "ml", "pod": "train-0", "container": "trainer",
            "node": "gke-tpu-node-a"}
        assert (by_pid[pid1]["namespace"], by_pid[pid1]["pod"], by_pid[pid1]["container"]) == (
            "research", "train-1", "jax")
        assert not {"namespace", "pod", "container", "node"} & set(by_pid[pid2])
        # One program in two pods: both keep their name (pod tells them apart).
        assert by_pid[pid0]["program"] == by_pid[pid1]["program"] == "python -c"
        # Every series of a pod's process carries the pod, not only the info.
        steps = [_labels(line) for line in body.splitlines()
                 if line.startswith("tpu_info_mark_step_total{")]
        assert sorted(s.get("pod", "") for s in steps) == ["", "train-0", "train-1"]
        assert kubelet.calls == 1
        promtool = shutil.which("promtool")
        if promtool:  # no label twice in a series (the ops family's is op_namespace)
            r = subprocess.run([promtool, "check", "metrics"], input=body, text=True,
                               capture_output=True, timeout=30)
            assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr
    finally:
        for p, _ in procs:
            if p.stdin:
                p.stdin.close()
            p.wait(30)


def test_a_pods_namespace_and_the_engines_op_namespace_are_two_labels():
    """torch._lazy's per-op counters had a ``namespace`` label of their own:
    with a pod's ``namespace`` on every series, a series would name it twice.
    The op's is ``op_namespace``."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from tpu_info.contract.model import CounterReading, ProcessRecord, Snapshot
    from tpu_info.outputs.prometheus import families
    from tpu_info.outputs.prometheus_host import FamilyList

    snap = Snapshot(1.0, ProcessRecord(7, "train.py", engine="torch_lazy"),
                    counters=(CounterReading("lazy::add", 5),))
    labels = {"host": "node-a", "namespace": "ml", "pod": "train-0", "container": "trainer",
              "node": "node-a", "program": "train.py"}
    text = generate_latest(FamilyList(list(families(snap, labels)))).decode()  # type: ignore[arg-type]
    (ops,) = [f for f in text_string_to_metric_families(text) if f.name == "tpu_info_ops"]
    (sample,) = ops.samples
    assert sample.labels == {**labels, "op_namespace": "lazy", "op": "add"}
    assert sample.value == 5
