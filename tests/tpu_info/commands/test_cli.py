"""The `tpu-info` command: bad input, and end to end against real hooked JAX programs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # every test runs `tpu-info` or a hooked program in a subprocess

CLI = [sys.executable, "-m", "tpu_info"]

PROGRAM = r"""
import sys, jax, jax.numpy as jnp, metrics
metrics.install()
@jax.jit
def train_step(batch):
    return (batch * 2).sum()
step = metrics.track(train_step)
for n in (32, 32, 31):
    step(jnp.ones((n, 4)))
    metrics.mark_step()
print(metrics.exporter().address, flush=True)
sys.stdin.read()
"""


def _env(runtime_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["TPU_INFO_RUNTIME_DIR"] = str(runtime_dir)
    env["TPU_INFO_PORT"] = "0"  # never take 8431 from a neighbour
    env["COLUMNS"] = "120"
    return env


def tpu_info(*args: str, env: dict[str, str] | None = None,
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env=env or _env(Path("/nonexistent-tpu-info-test")), cwd=ROOT)


@pytest.fixture
def hooked(tmp_path):
    """Starts hooked programs sharing one runtime dir; yields a starter."""
    procs: list[subprocess.Popen[str]] = []
    env = _env(tmp_path / "rt")

    def start() -> tuple[int, str]:
        p = subprocess.Popen([sys.executable, "-c", PROGRAM], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env, cwd=ROOT)
        procs.append(p)
        line = p.stdout.readline()
        assert line, p.stderr.read()
        return p.pid, line.strip()

    start.env = env  # type: ignore[attr-defined]
    yield start
    for p in procs:
        p.stdin.close()
        p.wait(timeout=30)


@pytest.mark.parametrize("args,needle", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--target", "host"], "has no port"),
    (["--target", ":99999"], "no host"),
    (["--target", "localhost:99999"], "expected 1..65535"),
    (["--target", "[::1"], "brackets"),
    (["--target", ""], "empty target"),
    (["--target", "a b:c"], "not HOST:PORT"),
    (["--rate", "0"], "positive number"),
    (["--rate", "-1"], "positive number"),
    (["--rate", "abc"], "number of seconds"),
    (["--timeout", "nan"], "positive number"),
    (["--metric", "bogus"], "valid metrics: "),
    (["-f", "percentile:[p50]"], "must follow a --metric"),
    (["--metric", "hbm_usage", "-f", "p50"], "percentile:[p50,p90]"),
    (["--metric", "hbm_usage", "-f", "core_type:gpu"], "core_type must be one of"),
    (["report", "--pid", "1"], "no hooked process with pid 1"),
    (["run"], "run needs a command"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    r = tpu_info(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_corrupt_targets_file(tmp_path):
    f = tmp_path / "targets"
    f.write_bytes(b"localhost:1\nnot a target\n")
    r = tpu_info("--targets-file", str(f))
    assert r.returncode == 2 and "targets:2:" in r.stderr and "Traceback" not in r.stderr
    f.write_bytes(b"\xff\xfe\x00garbage")
    r = tpu_info("--targets-file", str(f))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    r = tpu_info("--targets-file", str(tmp_path / "missing"))
    assert r.returncode == 2 and "cannot read targets file" in r.stderr


def test_targets_file_fifo_is_read_within_the_timeout(tmp_path):
    """A FIFO with no writer once blocked past --timeout (still at 60 s)."""
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    r = tpu_info("--no-discovery", "--timeout", "2", "--targets-file", str(fifo), timeout=30)
    took = time.monotonic() - started
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "a FIFO nobody writes to?" in lines[0], r.stderr
    assert took < 2 + 5, took  # its --timeout, and a start-up's margin on a busy machine

    def write() -> None:  # as `--targets-file <(cmd)` is: a writer that ends
        with open(fifo, "w") as f:
            f.write("127.0.0.1:1\n")

    writer = threading.Thread(target=write)
    writer.start()
    r = tpu_info("--no-discovery", "--timeout", "2", "--targets-file", str(fifo), timeout=30)
    writer.join(10)
    assert r.returncode == 1 and "127.0.0.1:1" in r.stderr, r.stderr  # read, then unreachable
    started = time.monotonic()
    r = tpu_info("--no-discovery", "--targets-file", "/dev/zero", timeout=30)
    assert r.returncode == 2 and "larger than 1024 KiB" in r.stderr, r.stderr
    assert time.monotonic() - started < 10


def test_unreachable_target_exits_1_and_still_prints():
    r = tpu_info("--no-discovery", "--target", "127.0.0.1:1", "--timeout", "2")
    assert r.returncode == 1
    assert "127.0.0.1:1" in r.stderr and "Traceback" not in r.stderr


def test_version_and_list_metrics():
    r = tpu_info("--version")
    assert r.returncode == 0 and r.stdout.startswith("- tpu-info version: ")  # Google's lines
    r = tpu_info("--list_metrics")
    assert r.returncode == 0 and "host_to_device_transfer_latency" in r.stdout
    assert "CompileTime" in r.stdout


def test_table_against_one_hooked_process(hooked):
    pid, address = hooked()
    r = tpu_info(env=hooked.env)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert str(pid) in out and "jit(train_step)" in out
    flat = " ".join(out.split())  # a finding wraps in its column: the words stay whole
    assert "changed f32[32,4] -> f32[31,4]" in flat, out
    r = tpu_info("--json", env=hooked.env)
    doc = json.loads(r.stdout)
    assert doc["schema"] == "tpu-info/v1"
    assert any(t["target"] == address for t in doc["targets"])


def test_two_hooked_processes_and_report(hooked):
    (pid1, a1), (pid2, _a2) = hooked(), hooked()
    r = tpu_info(env=hooked.env)
    assert r.returncode == 0, r.stderr
    assert str(pid1) in r.stdout and str(pid2) in r.stdout
    r = tpu_info("report", env=hooked.env)
    assert r.returncode == 2 and "--pid" in r.stderr  # ambiguous: says how to choose
    r = tpu_info("report", "--pid", str(pid2), env=hooked.env)
    assert r.returncode == 0, r.stderr
    assert "Counter: MarkStep\n  Value: 3" in r.stdout
    assert "Metric: CompileTime" in r.stdout and "Findings:" in r.stdout
    r = tpu_info("report", "--target", a1, "--short", env=hooked.env)
    assert r.returncode == 0 and "Metric: CompileTime" in r.stdout


def test_metric_view_reads_distributions(hooked):
    hooked()
    r = tpu_info("--metric", "CompileTime", "-f", "percentile:[p50,p999]",
                 "--metric", "hbm_usage", env=hooked.env)
    assert r.returncode == 0, r.stderr
    assert "P50" in r.stdout and "P999" in r.stdout and "P90" not in r.stdout
    assert "GiB" in r.stdout
    # Google tpu-info's own --help example
    r = tpu_info("--metric", "CompileTime", "-f", "percentile:[p50,p90], core_type:tensorcore",
                 env=hooked.env)
    assert r.returncode == 0, r.stderr
    assert "P90" in r.stdout and "P999" not in r.stdout


def test_doctor_explains(hooked):
    hooked()
    r = tpu_info("doctor", env=hooked.env)
    assert r.returncode == 0, r.stderr
    assert "no TPU chips found" in r.stdout
    assert "not counted: np.asarray(x), np.array(x), x.item()" in r.stdout  # JAX on CPU
    # localhost:8431 is judged by who holds it: nobody here, or (on a busy
    # machine) another program's hook; either way doctor says what it found.
    assert "libtpu not present" in r.stdout or "localhost:8431: " in r.stdout, r.stdout


def test_streaming_refreshes_until_interrupted(hooked):
    import signal
    import threading

    hooked()
    p = subprocess.Popen([*CLI, "--streaming", "--rate", "0.2"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=hooked.env, cwd=ROOT)
    # Interrupted once two looks are out (a pipe gets each look as it is
    # taken), not after a fixed sleep: on a loaded machine the first look
    # comes after seconds of start-up.
    lines: list[str] = []
    two_looks = threading.Event()

    def read() -> None:
        for line in p.stdout:
            lines.append(line)
            if sum("jit(train_step)" in x for x in lines) >= 2:
                two_looks.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert two_looks.wait(90), "".join(lines)
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=20) == 0, p.stderr.read()
    reader.join(10)
    err = p.stderr.read()
    assert "Traceback" not in err, err
