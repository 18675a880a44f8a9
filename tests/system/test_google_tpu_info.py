"""Google's ``tpu-info`` (PyPI 0.14.2) reads a hooked JAX program's server
through its own library functions, and gets our snapshot's values.

Its import name ``tpu_info`` clashes with ours, so it is installed into its own
target directory (``$TPU_INFO_TEST_CACHE``, default
``~/.cache/tpu-info-tests``) and run in a subprocess with ``python -S`` and
``PYTHONPATH`` set to only that directory, from a directory without ours.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hooked import HookedProgram
from tpu_info.contract.model import Snapshot
from tpu_info.net.client import Client

VERSION = "0.14.2"
pytestmark = pytest.mark.slow


def _cache_dir() -> Path:
    root = os.environ.get("TPU_INFO_TEST_CACHE") or str(Path.home() / ".cache/tpu-info-tests")
    return Path(root) / "google-tpu-info"


@pytest.fixture(scope="session")
def google_tpu_info() -> Path:
    """The target directory holding Google's tpu-info and its dependencies."""
    target = _cache_dir()
    if (target / f"tpu_info-{VERSION}.dist-info").is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         f"tpu-info=={VERSION}", "--target", str(target)],
        capture_output=True, text=True, timeout=600,
    )
    if proc.returncode != 0 or not (target / f"tpu_info-{VERSION}.dist-info").is_dir():
        pytest.skip(f"pip could not install tpu-info=={VERSION}: {proc.stderr.strip()[-500:]}")
    return target


def _run_google(target_dir: Path, code: str, cwd: Path, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(target_dir)
    proc = subprocess.run([sys.executable, "-S", "-c", code, *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


READ = r"""
import json, sys
import tpu_info
assert "google-tpu-info" in tpu_info.__file__, tpu_info.__file__
from tpu_info import device, metrics
addr = sys.argv[1]
usage = metrics.get_chip_usage(device.TpuChip.V5E, addr=addr)
out = {"usage": [list(u) for u in usage]}
for arg in ("host_to_device_transfer_latency", "device_to_host_transfer_latency"):
    out[arg] = [list(d) for d in metrics.get_transfer_latency(arg, addr=addr)]
out["hlo"] = [list(h) for h in metrics.get_hlo_exec_timing(device.TpuChip.V5E, addr=addr)]
print(json.dumps(out))
"""

DESCRIBE = r"""
import json
from tpu_info.proto import tpu_metric_service_pb2 as m, tpu_telemetry_pb2 as t
def walk(d, out):
    out[d.full_name] = sorted((f.name, f.number, f.type, f.is_repeated, f.has_presence,
                               f.containing_oneof.name if f.containing_oneof else "")
                              for f in d.fields)
    for n in d.nested_types:
        walk(n, out)
out = {}
for fd in (m.DESCRIPTOR, t.DESCRIPTOR):
    for d in fd.message_types_by_name.values():
        walk(d, out)
svc = m.DESCRIPTOR.services_by_name["RuntimeMetricService"]
out["service"] = [[x.full_name, x.input_type.full_name, x.output_type.full_name]
                  for x in svc.methods]
print(json.dumps(out))
"""


def _google_percentile(pcount: int, total: int, buckets: list[int], scale: float,
                       growth: float) -> float:
    # The reading rule of libtpu's format: bucket i >= 1 starts at scale*growth**(i-1).
    for i in range(len(buckets) - 1, 0, -1):
        total -= buckets[i]
        if total <= pcount:
            lower = scale * growth ** (i - 1)
            return lower * (1 + ((pcount - total) / buckets[i]) * (growth - 1))
    return 1.0


def _expected_latency(snap: Snapshot, name: str) -> list:
    d = snap.distribution(name)
    assert d is not None and d.buckets is not None
    b = d.buckets
    kmin, kmax = min(b.positive), max(b.positive)
    counts = [b.zero] + [b.positive.get(k, 0) for k in range(kmin, kmax + 1)] + [0]
    scale = b.gamma ** (kmin - 1) / 1000.0
    return ["all"] + [_google_percentile(int(d.count * q), d.count, counts, scale, b.gamma)
                      for q in (0.5, 0.9, 0.95, 0.999)]


def test_google_client_reads_our_server(google_tpu_info: Path, tmp_path: Path) -> None:
    with HookedProgram() as hooked:
        with Client(hooked.address, timeout=10) as c:
            ours = c.snapshot()
        got = _run_google(google_tpu_info, READ, tmp_path, hooked.address)
        with Client(hooked.address, timeout=10) as c:  # nothing moved meanwhile
            assert [d.memory for d in c.snapshot().devices] == [d.memory for d in ours.devices]
    expected_usage = [[d.id, d.memory.used_bytes or 0, d.memory.limit_bytes or 0]
                      for d in sorted(ours.devices, key=lambda d: d.id)]
    assert [row[:3] for row in got["usage"]] == expected_usage
    # Duty cycle is our busy % estimate, a rate over time: only its range is fixed.
    assert all(0.0 <= row[3] <= 100.0 for row in got["usage"])
    assert len(got["usage"]) == 4  # XLA_FLAGS gives the program four CPU devices
    for arg, name in (("host_to_device_transfer_latency", "TransferToDeviceTime"),
                      ("device_to_host_transfer_latency", "TransferFromDeviceTime")):
        (row,) = got[arg]
        expected = _expected_latency(ours, name)
        assert row[0] == "all"
        assert row[1:] == pytest.approx(expected[1:], rel=1e-9)
        d = ours.distribution(name)
        assert d.min / 1e3 * 0.99 <= row[1] <= d.max / 1e3 * 1.01  # p50 inside the samples
    execute = ours.distribution("ExecuteTime")
    assert [h[0] for h in got["hlo"]] == [0, 1, 2, 3]
    assert all(h[1] == pytest.approx(execute.mean / 1e3) for h in got["hlo"])


def test_our_descriptors_match_google_client(google_tpu_info: Path, tmp_path: Path) -> None:
    theirs = _run_google(google_tpu_info, DESCRIBE, tmp_path)
    from tpu_info.proto import tpu_metric_service_pb2 as m
    from tpu_info.proto import tpu_telemetry_pb2 as t

    ours: dict = {}

    def walk(d) -> None:
        ours[d.full_name] = sorted(
            [f.name, f.number, f.type, f.is_repeated, f.has_presence,
             f.containing_oneof.name if f.containing_oneof else ""] for f in d.fields)
        for n in d.nested_types:
            walk(n)

    for fd in (m.DESCRIPTOR, t.DESCRIPTOR):
        for d in fd.message_types_by_name.values():
            walk(d)
    svc = m.DESCRIPTOR.services_by_name["RuntimeMetricService"]
    ours["service"] = [[x.full_name, x.input_type.full_name, x.output_type.full_name]
                       for x in svc.methods]
    assert ours == theirs


VERSION_LINE = r"^- (tpu-info version|libtpu version|accelerator type): (.+)$"


def test_version_lines_parse_like_googles(google_tpu_info: Path, tmp_path: Path) -> None:
    """``tpu-info -v``: the three lines a script parses from Google's tool, in its order."""
    import re

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    theirs = subprocess.run(
        [sys.executable, "-S", "-c", "import sys; sys.argv = ['tpu-info', '-v']; "
         "from tpu_info import cli; cli.print_chip_info()"], capture_output=True, text=True,
        timeout=120, env=dict(env, PYTHONPATH=str(google_tpu_info)), cwd=tmp_path)
    assert theirs.returncode == 0, theirs.stderr[-2000:]
    ours = subprocess.run([sys.executable, "-m", "tpu_info", "-v"], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[2],
                          env=dict(env, PYTHONPATH=str(Path(__file__).resolve().parents[2])))
    assert ours.returncode == 0, ours.stderr
    keys = [[k for k, _ in re.findall(VERSION_LINE, out, re.M)]
            for out in (theirs.stdout, ours.stdout)]
    assert keys[0] == keys[1] == ["tpu-info version", "libtpu version", "accelerator type"]
    assert ours.stdout.count("\n") == 3
