"""Default bind is loopback; other interfaces need the explicit opt-in; the
runtime directory and discovery files are private; messages are size-capped."""

from __future__ import annotations

import ipaddress
import os
import stat
import subprocess
import sys
from pathlib import Path

import psutil

from tests.conftest import ROOT

PROGRAM = r"""
import sys, jax, jax.numpy as jnp, metrics
metrics.install(prometheus_port=0)
jax.jit(lambda x: x + 1)(jnp.ones(2))
print(metrics.exporter().port, metrics.prometheus_endpoint().port, flush=True)
sys.stdin.read()
"""


def _start(tmp_path: Path, **extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"),
               TPU_INFO_PORT="0", **extra)
    env.pop("TPU_INFO_BIND", None) if "TPU_INFO_BIND" not in extra else None
    return subprocess.Popen([sys.executable, "-c", PROGRAM], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)
    return addr.is_loopback or bool(mapped and mapped.is_loopback)


def _listening(pid: int) -> set[tuple[str, int]]:
    """What the program and its serving helper (the default) listen on."""
    program = psutil.Process(pid)
    return {(c.laddr.ip, c.laddr.port) for proc in [program, *program.children()]
            for c in proc.net_connections("inet") if c.status == psutil.CONN_LISTEN}


def _ports(p: subprocess.Popen[str]) -> tuple[int, int]:
    line = p.stdout.readline()
    assert line, p.stderr.read()
    grpc_port, prom_port = map(int, line.split())
    return grpc_port, prom_port


def test_default_bind_is_loopback_only(tmp_path):
    p = _start(tmp_path)
    try:
        grpc_port, prom_port = _ports(p)
        socks = _listening(p.pid)
        assert {port for _, port in socks} >= {grpc_port, prom_port}
        assert all(_loopback(ip) for ip, _ in socks), socks
        rt = tmp_path / "rt"
        assert stat.S_IMODE(rt.stat().st_mode) == 0o700
        (record,) = list(rt.glob("*.json"))
        assert stat.S_IMODE(record.stat().st_mode) == 0o600
    finally:
        p.stdin.close()
        p.wait(timeout=30)
    assert not list((tmp_path / "rt").glob("*.json"))  # removed at exit


def test_other_interfaces_need_the_opt_in_and_warn(tmp_path):
    p = _start(tmp_path, TPU_INFO_BIND="0.0.0.0")
    try:
        grpc_port, prom_port = _ports(p)
        socks = _listening(p.pid)
        anywhere = {port for ip, port in socks if ip in ("0.0.0.0", "::")}
        assert {grpc_port, prom_port} <= anywhere, socks
    finally:
        p.stdin.close()
        p.wait(timeout=30)
    err = p.stderr.read()
    assert "not loopback" in err


def test_client_refuses_oversized_replies():
    from tpu_info import client

    assert client.DEFAULT_MAX_MESSAGE_BYTES <= 64 * 2**20


def test_server_caps_request_size():
    import inspect

    from metrics.export import server

    assert "max_receive_message_length" in inspect.getsource(server)
