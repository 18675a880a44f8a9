"""``tpu-info exporter``: one endpoint per host; processes come and go; a
silent target costs at most its timeout (issue 17, item 1).

Real parts: hooked processes in subprocesses (``metrics.install`` serving
gRPC, writing their discovery records), a silent TCP listener, the
exporter's bounded HTTP server, the fixture sysfs tree of a v5e host.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.fixtures.sysfs_trees import MACHINES, build_dev, build_proc, build_sysfs
from tpu_info.commands import cli
from tpu_info.commands.exporter import ExporterOptions, HostExporter, program_name
from tpu_info.host.devices import scan_local

PROCESS = textwrap.dedent("""
    import json, os, sys
    import metrics
    metrics.install(engines=[], port=0)
    print(json.dumps({"pid": os.getpid(), "port": metrics.exporter().port}), flush=True)
    sys.stdin.read()
""")


class Hooked:
    """A hooked Python process (no engine: starts in about a second) that
    writes its record into ``runtime_dir``; it exits when stdin closes."""

    def __init__(self, runtime_dir: Path, rank: int) -> None:
        env = dict(os.environ, TPU_INFO_RUNTIME_DIR=str(runtime_dir), RANK=str(rank),
                   WORLD_SIZE="2", PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen([sys.executable, "-c", PROCESS], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        assert line, f"hooked process did not start (exit {self.proc.poll()})"
        self.pid: int = json.loads(line)["pid"]

    def stop(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(30)


def _series(body: str, name: str) -> list[str]:
    return [line for line in body.splitlines() if line.startswith(name + "{")]


@pytest.fixture
def v5e_scan(tmp_path: Path):
    sysfs = build_sysfs(tmp_path, MACHINES["v5e"])
    dev = build_dev(tmp_path, ["vfio/12", "vfio/13", "vfio/14", "vfio/15"])
    proc = build_proc(tmp_path, {4242: [str(dev / "vfio" / "12")]})
    return lambda: scan_local(str(sysfs), str(proc), str(dev), nvml_loader=None)


@pytest.mark.slow
def test_processes_come_and_go_and_a_silent_one_costs_its_timeout(tmp_path, v5e_scan):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    # A record of this (live) process naming a port that accepts and never answers.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    (runtime / f"{os.getpid()}.json").write_text(json.dumps({
        "schema": 1, "pid": os.getpid(), "port": silent.getsockname()[1], "host": "127.0.0.1",
        "argv": ["silent.py"], "engine": "jax", "versions": {}, "start_time": time.time()}))
    ex = HostExporter(ExporterOptions(host_label="h1", job="llama", runtime_dir=runtime,
                                      timeout_s=1.0, libtpu_target=None), scan_chips=v5e_scan)
    first = Hooked(runtime, 0)
    second = None
    try:
        port = ex.start("127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}/metrics"
        started = time.monotonic()
        ex.poll()
        assert time.monotonic() - started < 1.0 + 3.0  # the silent target: its timeout
        body = urllib.request.urlopen(url, timeout=10).read().decode()
        chips = _series(body, "tpu_info_chip_info")
        assert len(chips) == 4 and all('host="h1"' in c and 'device="tpu' in c for c in chips)
        assert 'tpu_info_chip_owner{device="tpu0",host="h1",job="llama",pid="4242"} 1.0' \
            in body
        # Targets by what outlives a restart (program, rank), never by pid or port.
        up = {line.split("{", 1)[1].split("}")[0]: line.rsplit(" ", 1)[1]
              for line in _series(body, "tpu_info_target_up")}
        assert up == {'host="h1",job="llama",program="python -c",rank="0"': "1.0",
                      'host="h1",job="llama",program="silent.py",rank=""': "0.0"}
        [info] = _series(body, "tpu_info_process_info")
        assert f'pid="{first.pid}"' in info and 'rank="0"' in info
        assert 'program="python -c"' in info and 'host="h1"' in info
        assert [line for line in body.splitlines()
                if "pid=" in line and not line.startswith(("#", "tpu_info_process_info{",
                                                           "tpu_info_chip_owner{"))] == []

        second = Hooked(runtime, 1)
        ex.poll()
        body = ex.body("", "")[0].decode()
        ranks = sorted(line.split('rank="')[1][0]
                       for line in _series(body, "tpu_info_process_info"))
        assert ranks == ["0", "1"]

        first.stop()
        ex.poll()
        body = ex.body("", "")[0].decode()
        pids = {line.split('pid="')[1].split('"')[0]
                for line in _series(body, "tpu_info_process_info")}
        assert pids == {str(second.pid)}  # the exited one dropped out
        assert len(_series(body, "tpu_info_target_up")) == 2
        assert len(ex._states) == 1
        assert 'tpu_info_exporter_skipped_records{host="h1",job="llama",reason="dead pid"}' \
            not in body  # its record was removed at exit, not left for us to judge
    finally:
        ex.stop()
        silent.close()
        first.stop()
        if second is not None:
            second.stop()


def test_program_label_comes_from_argv():
    assert program_name(("/w/train.py", "--lr", "1")) == "train.py"
    assert program_name(("-c",)) == "python -c"
    assert program_name(()) == "python"


@pytest.mark.parametrize("argv, message", [
    (["exporter", "--listen", "localhost"], "--listen must be HOST:PORT"),
    (["exporter", "--listen", "a b:9431"], "--listen"),
    (["exporter", "--interval", "1", "--timeout", "2"], "must be at most --interval"),
    (["exporter", "--job", "a\x1bb"], "--job must be printable"),
])
def test_bad_flags_are_one_line_and_exit_2(argv, message, capsys):
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.slow
def test_the_command_serves_writes_file_sd_and_cleans_up(tmp_path):
    sd = tmp_path / "sd" / "h1.json"
    sd.parent.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpu_info", "exporter", "--listen", "127.0.0.1:0",
         "--runtime-dir", str(tmp_path / "none"), "--host-label", "h1", "--no-libtpu",
         "--sysfs", str(tmp_path / "nosys"), "--sd-file", str(sd),
         "--sd-address", "h1.example:9431",
         "--interval", "1"],  # shorter than the default --timeout: the default follows it
        stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        line = proc.stderr.readline() if proc.stderr else ""
        assert "serving http://127.0.0.1:" in line, line
        port = int(line.split("127.0.0.1:")[1].split("/")[0])
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        assert b'tpu_info_chips{host="h1"} 0.0' in body
        assert json.loads(sd.read_text()) == [{"targets": ["h1.example:9431"],
                                               "labels": {"host": "h1"}}]
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
    assert not sd.exists()


def test_an_unsafe_runtime_directory_is_said_and_counted(tmp_path, caplog):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o777)
    runtime.chmod(0o777)
    ex = HostExporter(ExporterOptions(host_label="h1", runtime_dir=runtime, libtpu_target=None),
                      scan_chips=lambda: scan_local("/nonexistent", nvml_loader=None))
    ex.poll()
    ex.poll()
    body = ex.body("", "")[0].decode()
    assert 'tpu_info_exporter_skipped_records{host="h1",reason="unsafe runtime directory"} 1.0' \
        in body
    assert caplog.text.count("not reading") == 1


@pytest.mark.slow
def test_the_example_scrape_config_is_valid():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus')")
    r = subprocess.run([promtool, "check", "config",
                        str(ROOT / "examples" / "prometheus" / "prometheus.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_a_scrape_is_answered_while_a_poll_waits_on_a_silent_target(tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    (runtime / f"{os.getpid()}.json").write_text(json.dumps({
        "schema": 1, "pid": os.getpid(), "port": silent.getsockname()[1], "host": "127.0.0.1",
        "argv": ["silent.py"], "engine": "jax", "versions": {}, "start_time": time.time()}))
    ex = HostExporter(ExporterOptions(host_label="h1", runtime_dir=runtime, timeout_s=4.0,
                                      interval_s=60.0, libtpu_target=None),
                      scan_chips=lambda: scan_local("/nonexistent", nvml_loader=None))
    try:
        port = ex.start("127.0.0.1", 0)
        polling = threading.Thread(target=ex.poll)
        polling.start()
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        assert polling.is_alive()  # answered from the last poll, not after this one
        assert b'tpu_info_target_up{host="h1",program="silent.py"} 0.0' in body
        polling.join()
    finally:
        ex.stop()
        silent.close()
