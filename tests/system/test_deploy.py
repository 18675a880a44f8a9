"""deploy/ checked offline: the Kubernetes manifests against the API's schemas
(kubernetes-validate, strict: an unknown or misspelt field fails), the
ServiceMonitor against the prometheus-operator fields it uses (no schema for
the CRD ships with kubernetes-validate), the systemd unit with
``systemd-analyze verify``, the Dockerfile's key lines, and every command line
the image, the DaemonSet and the unit start parsed by tpu-info's own parser.
No docker here: the image is not built; an exporter started with the
DaemonSet's arguments answers the image's HEALTHCHECK command.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpu_info.commands import args as cli_args

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
MANIFEST = DEPLOY / "kubernetes" / "tpu-info-exporter.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
UNIT = DEPLOY / "systemd" / "tpu-info-exporter@.service"
TRAINING_POD = DEPLOY / "kubernetes" / "training-pod.yaml"
KUBERNETES_VERSION = "1.30.0"  # the oldest release GKE still supports in 2026
# Values Kubernetes would put in $(VAR) (downward API); the IPv6 one with the
# manifest's documented variant, [$(HOST_IP)]:9431.
EXPANSIONS = ({"HOST_IP": "10.128.0.5", "NODE_NAME": "gke-tpu-node-0"},
              {"HOST_IP": "fd00:10::5", "NODE_NAME": "gke-tpu-node-1"})


def _docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def _one(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in _docs() if d["kind"] == kind]
    return doc


def _parse(argv: list[str]) -> Any:
    """tpu-info's real parser and its combination checks, as ``main`` runs
    them, without starting anything."""
    args = cli_args.build_parser().parse_args(argv)
    cli_args.check_combination(args)
    return args


# Kubernetes ------------------------------------------------------------------

def test_the_manifests_are_valid_kubernetes_objects():
    import kubernetes_validate

    checked = []
    for doc in _docs():
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: checked field by field below
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        checked.append(doc["kind"])
    assert sorted(checked) == ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "Namespace",
                               "Service", "ServiceAccount"]


def test_kubernetes_validate_refuses_a_misspelt_field():
    """The check above is one that can fail: strict mode knows the fields."""
    import kubernetes_validate

    ds = _one("DaemonSet")
    ds["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, KUBERNETES_VERSION, strict=True)


# prometheus-operator v1 ServiceMonitor fields (monitoring.coreos.com_servicemonitors
# CRD): kubernetes-validate has no schema for it, so the keys used are checked
# against the CRD's names here, and the references against the other objects.
_SM_SPEC = {"endpoints", "selector", "namespaceSelector", "jobLabel", "targetLabels",
            "podTargetLabels", "sampleLimit", "targetLimit", "attachMetadata"}
_SM_ENDPOINT = {"port", "targetPort", "path", "scheme", "params", "interval",
                "scrapeTimeout", "honorLabels", "honorTimestamps", "relabelings",
                "metricRelabelings", "tlsConfig", "basicAuth", "authorization",
                "bearerTokenSecret", "followRedirects", "enableHttp2", "proxyUrl"}
_DURATION = re.compile(r"^(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                       r"(([0-9]+)s)?(([0-9]+)ms)?$")  # the CRD's pattern for durations


def test_the_service_monitor_scrapes_the_exporters():
    sm, svc, ds = _one("ServiceMonitor"), _one("Service"), _one("DaemonSet")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(sm) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(sm["spec"]) <= _SM_SPEC, set(sm["spec"]) - _SM_SPEC
    # It selects the Service, in the Service's namespace ...
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert svc["metadata"]["namespace"] in sm["spec"]["namespaceSelector"]["matchNames"]
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    for ep in sm["spec"]["endpoints"]:
        assert set(ep) <= _SM_ENDPOINT, set(ep) - _SM_ENDPOINT
        assert ep["port"] in ports  # a named port of the Service
        assert ep["path"] == "/metrics"
        assert _DURATION.match(ep["interval"]) and _DURATION.match(ep["scrapeTimeout"])
        assert ep["honorLabels"] is True  # the exporter's host and job labels win
    # ... which selects the DaemonSet's pods and names their container's port.
    pod = ds["spec"]["template"]
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert svc["spec"]["clusterIP"] == "None"  # each exporter, not a load-balanced one
    container_ports = {p["name"]: p["containerPort"]
                       for c in pod["spec"]["containers"] for p in c.get("ports", ())}
    for p in ports.values():
        assert p["targetPort"] in container_ports and p["port"] == container_ports[p["targetPort"]]


def _expanded(values: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion of command and args."""
    out = []
    for v in values:
        for name in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", v):
            assert name in env, f"$({name}) is not in the container's env"
            v = v.replace(f"$({name})", env[name])
        out.append(v)
    return out


def _exporter_container() -> dict[str, Any]:
    (c,) = _one("DaemonSet")["spec"]["template"]["spec"]["containers"]
    return c


@pytest.mark.parametrize("env", EXPANSIONS)
def test_the_daemonsets_command_line_is_one_tpu_info_accepts(env):
    c = _exporter_container()
    assert "command" not in c  # the image's ENTRYPOINT (tpu-info) runs it
    declared = {e["name"] for e in c["env"]}
    assert set(env) == declared
    argv = c["args"]
    if ":" in env["HOST_IP"]:
        assert "[$(HOST_IP)]:9431" in MANIFEST.read_text()  # the comment that says so
        argv = [a.replace("$(HOST_IP):", "[$(HOST_IP)]:") for a in argv]
    args = _parse(_expanded(argv, env))
    assert args.command == "exporter"
    assert args.listen == (env["HOST_IP"], 9431)
    assert args.runtime_dir == "/run/tpu-info" and args.sysfs == "/host/sys"
    assert args.host_label == env["NODE_NAME"] == args.node_name  # the node label
    assert args.kubernetes == "auto" and args.kubelet_socket is None  # the default socket
    (port,) = c["ports"]
    assert port["containerPort"] == args.listen[1]
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/metrics", "port": port["name"]}


def test_the_runtime_directory_is_one_path_on_both_sides():
    """A record names its Unix socket by full path: the exporter must mount the
    host's directory where the programs do (and read it there)."""
    spec = _one("DaemonSet")["spec"]["template"]["spec"]
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in _exporter_container()["volumeMounts"]}
    assert mounts["runtime-dir"]["mountPath"] == host["runtime-dir"] == "/run/tpu-info"
    assert "--runtime-dir" in _exporter_container()["args"]
    (init,) = spec["initContainers"]
    assert init["volumeMounts"] == [{"name": "runtime-dir", "mountPath": "/run/tpu-info"}]
    run_as = spec["securityContext"]["runAsUser"]
    assert f"chown {run_as}:{spec['securityContext']['runAsGroup']}" in init["command"][-1]
    assert f"= {run_as} ]" in init["command"][-1]


def test_every_privilege_is_the_least_and_says_why():
    text = MANIFEST.read_text()
    spec = _one("DaemonSet")["spec"]["template"]["spec"]
    # Each host privilege has its reason beside it, as a comment.
    assert spec["hostPID"] is True and "# PRIVILEGE hostPID:" in text
    assert spec["hostNetwork"] is True and "# PRIVILEGE hostNetwork:" in text
    for v in spec["volumes"]:
        if "hostPath" in v:
            assert f"# PRIVILEGE hostPath {v['hostPath']['path']}," in text, v
    # The exporter: not root, no capability, no escalation, read-only root fs.
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    c = _exporter_container()
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]} and "privileged" not in sc
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/host/sys"]["readOnly"] is True
    # Only the one-off init step is root, with CAP_CHOWN alone.
    (init,) = spec["initContainers"]
    isc = init["securityContext"]
    assert isc["runAsUser"] == 0 and isc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert isc["allowPrivilegeEscalation"] is False and "privileged" not in isc
    assert "# PRIVILEGE root with CAP_CHOWN only:" in text
    assert "privileged: true" not in text


# Dockerfile ------------------------------------------------------------------

def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) per Dockerfile instruction, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _exec_form(text: str) -> list[str]:
    value = json.loads(text)  # exec form: no shell between Docker and tpu-info
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


def test_the_dockerfile_runs_tpu_info_as_non_root_from_a_pinned_base():
    ins = _instructions()
    bases = [rest.split()[0] for word, rest in ins if word == "FROM"]
    assert bases
    for base in bases:
        name, _, tag = base.partition(":")
        assert tag and tag != "latest" and "slim" in tag, base
    final = ins[max(i for i, (w, _) in enumerate(ins) if w == "FROM"):]
    users = [rest for word, rest in final if word == "USER"]
    assert users, "the final stage sets no USER: it would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric: runAsNonRoot can check it
    (health,) = [rest for word, rest in final if word == "HEALTHCHECK"]
    assert "CMD" in health and "/metrics" in health
    assert "pip install" in " ".join(rest for word, rest in final if word == "RUN")
    # The DaemonSet runs this image as the uid it sets, and the same image.
    spec = _one("DaemonSet")["spec"]["template"]["spec"]
    assert str(spec["securityContext"]["runAsUser"]) == uid
    images = {c["image"] for c in spec["containers"] + spec["initContainers"]}
    assert len(images) == 1 and not images.pop().endswith(":latest")


def _image_argv() -> list[str]:
    ins = _instructions()
    (entry,) = [rest for word, rest in ins if word == "ENTRYPOINT"]
    (cmd,) = [rest for word, rest in ins if word == "CMD"]
    return _exec_form(entry) + _exec_form(cmd)


def test_the_images_entry_point_is_a_command_line_tpu_info_accepts():
    argv = _image_argv()
    assert argv[0] == "tpu-info"
    args = _parse(argv[1:])
    assert args.command == "exporter"
    assert args.listen == ("0.0.0.0", 9431)  # a container's loopback is its own
    ins = _instructions()
    assert ("EXPOSE", "9431") in ins
    assert "127.0.0.1:9431/metrics" in next(r for w, r in ins if w == "HEALTHCHECK")


def test_a_refused_command_line_fails_this_check():
    """The parse above is a real check: a misspelt flag is a UsageError."""
    argv = _image_argv()
    with pytest.raises(cli_args.UsageError):
        _parse([a.replace("--runtime-dir", "--runtime_dir") for a in argv[1:]])


@pytest.mark.slow
def test_an_exporter_started_as_the_daemonset_does_passes_the_healthcheck(tmp_path):
    """The DaemonSet's arguments (port 0 and temporary directories for the
    host's) start a real exporter, and the image's HEALTHCHECK command, run
    as written, passes against it."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    argv = _expanded(_exporter_container()["args"], {"HOST_IP": "127.0.0.1", "NODE_NAME": "n0"})
    argv = [a.replace("127.0.0.1:9431", "127.0.0.1:0").replace("/run/tpu-info", str(runtime))
            .replace("/host/sys", str(tmp_path / "sys")) for a in argv]
    proc = subprocess.Popen([sys.executable, "-m", "tpu_info", *argv, "--no-libtpu"],
                            stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        line = proc.stderr.readline() if proc.stderr else ""
        assert "serving http://127.0.0.1:" in line, line
        port = line.split("127.0.0.1:")[1].split("/")[0]
        health = next(r for w, r in _instructions() if w == "HEALTHCHECK")
        cmd = _exec_form(health[health.index("CMD") + 3:].strip())
        assert cmd[0] == "python"
        ok = subprocess.run([sys.executable, cmd[1], cmd[2].replace("9431", port)],
                            capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0, ok.stderr
        bad = subprocess.run([sys.executable, cmd[1], cmd[2].replace("9431", "1")],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0  # nothing listens: unhealthy
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


# systemd ---------------------------------------------------------------------

def _unit_lines() -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, _, v = line.partition("=")
            keys.setdefault(k, []).append(v)
    return keys


def test_the_unit_is_hardened():
    keys = _unit_lines()
    for key, value in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"),
                       ("ProtectHome", "yes"), ("CapabilityBoundingSet", ""),
                       ("RuntimeDirectoryMode", "0700"), ("SystemCallArchitectures", "native"),
                       ("RestrictNamespaces", "yes"), ("MemoryDenyWriteExecute", "yes")):
        assert keys.get(key) == [value], key
    assert keys["User"] == ["%i"]  # the programs' user: records are read per uid
    assert "DynamicUser" not in keys and "RemoveIPC" not in keys  # see the unit's comments
    assert keys["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6 AF_NETLINK"]


def test_the_units_command_line_is_one_tpu_info_accepts():
    (exec_start,) = _unit_lines()["ExecStart"]
    argv = shlex.split(exec_start.replace("%i", "alice"))
    assert argv[0] == "/opt/tpu-info/bin/tpu-info"
    args = _parse(argv[1:])
    assert args.command == "exporter" and args.runtime_dir == "/run/tpu-info-alice"
    assert _unit_lines()["RuntimeDirectory"] == ["tpu-info-%i"]  # /run/ + that: the same


def test_systemd_analyze_verifies_the_unit(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (Debian package 'systemd')")
    tpu_info = Path(sys.executable).with_name("tpu-info")
    if not tpu_info.exists():
        pytest.skip(f"no tpu-info console script beside {sys.executable}")
    # An instance for a user that exists here, run from this venv's tpu-info
    # (verify checks that ExecStart's program is there and executable).
    import pwd

    user = pwd.getpwuid(os.geteuid()).pw_name
    unit = tmp_path / f"tpu-info-exporter@{user}.service"
    text = UNIT.read_text().replace("/opt/tpu-info/bin/tpu-info", str(tpu_info))
    unit.write_text(text)
    r = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True,
                       timeout=120)
    # verify exits 0 for unknown keys and unparsable values but says so: none allowed.
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert r.returncode == 0 and not lines, "\n".join(lines)
    unit.write_text(text.replace("ProtectSystem=strict", "ProtectSystem=strict\nProtectSytem=1"))
    r = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True,
                       timeout=120)
    assert "Unknown key" in r.stdout + r.stderr  # the check above can fail


def test_the_training_pod_example_meets_the_exporter():
    """The pod fragment the guide shows: valid, and what the exporter needs
    (same uid, same directory at the same path, the node's pids)."""
    import kubernetes_validate

    (pod,) = [d for d in yaml.safe_load_all(TRAINING_POD.read_text()) if d]
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    ds = _one("DaemonSet")["spec"]["template"]["spec"]
    spec = pod["spec"]
    assert spec["hostPID"] is True
    assert spec["securityContext"]["runAsUser"] == ds["securityContext"]["runAsUser"]
    (train,) = spec["containers"]
    env = {e["name"]: e["value"] for e in train["env"]}
    exporter = _parse(_expanded(_exporter_container()["args"], EXPANSIONS[0]))
    assert env["TPU_INFO_RUNTIME_DIR"] == exporter.runtime_dir
    (mount,) = train["volumeMounts"]
    (vol,) = spec["volumes"]
    assert mount["mountPath"] == vol["hostPath"]["path"] == exporter.runtime_dir
    assert vol["hostPath"]["path"] in {v["hostPath"]["path"] for v in ds["volumes"]
                                       if "hostPath" in v}
    command = train["command"]
    assert command[0] == "tpu-info" and _parse(command[1:]).command == "run"


def test_pod_labels_take_a_token_in_the_exporter_alone_and_list_pods_only():
    """Pod labels (issue 43): the exporter container mounts the kubelet's
    pod-resources directory where its default socket path is, read-only, and a
    service-account token for the API server; the token goes to that container
    alone (the root init step gets none), and the account may list pods,
    nothing else."""
    from tpu_info.host.pods import DEFAULT_SOCKET

    text = MANIFEST.read_text()
    spec = _one("DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in _exporter_container()["volumeMounts"]}
    socket_dir = os.path.dirname(DEFAULT_SOCKET)
    assert volumes["pod-resources"]["hostPath"]["path"] == socket_dir
    assert mounts["pod-resources"] == {"name": "pod-resources", "mountPath": socket_dir,
                                       "readOnly": True}
    token = mounts["kube-api-access"]
    assert token["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
    assert token["readOnly"] is True
    sources = volumes["kube-api-access"]["projected"]["sources"]
    assert {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}} in sources
    (init,) = spec["initContainers"]
    assert all(m["name"] != "kube-api-access" for m in init["volumeMounts"])
    assert spec["automountServiceAccountToken"] is False  # no token anywhere else
    assert _one("ServiceAccount")["automountServiceAccountToken"] is False
    role, binding = _one("ClusterRole"), _one("ClusterRoleBinding")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": role["metadata"]["name"]}
    sa = _one("ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": sa["metadata"]["namespace"]}]
    assert spec["serviceAccountName"] == sa["metadata"]["name"]
    assert "# PRIVILEGE list pods" in text
