"""Default bind is loopback; other interfaces need the explicit opt-in; the
runtime directory and discovery files are private; messages are size-capped."""

from __future__ import annotations

import ipaddress
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

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
    for key in ("TPU_INFO_BIND", "TPU_INFO_PROMETHEUS_BIND"):
        if key not in extra:
            env.pop(key, None)
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


def _ipv4_of_this_host() -> set[str]:
    return {a.address for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family == socket.AF_INET}


def test_grpc_bind_opens_grpc_only_and_0000_means_ipv4(tmp_path):
    p = _start(tmp_path, TPU_INFO_BIND="0.0.0.0")
    try:
        grpc_port, prom_port = _ports(p)
        socks = _listening(p.pid)
    finally:
        p.stdin.close()
        p.wait(timeout=30)
    # (grpc listens on IPv4 addresses through IPv6 sockets, as ::ffff:a.b.c.d)
    grpc_ips = {ip.removeprefix("::ffff:") for ip, port in socks if port == grpc_port}
    # Every IPv4 address of this host, and no IPv6 one: grpc alone binds [::] for 0.0.0.0.
    assert grpc_ips == _ipv4_of_this_host(), socks
    assert all(_loopback(ip) for ip, port in socks if port == prom_port), socks
    err = p.stderr.read()
    assert err.count("not loopback") == 1 and "captures stay loopback-only" in err, err


def test_prometheus_has_its_own_bind_setting(tmp_path):
    p = _start(tmp_path, TPU_INFO_PROMETHEUS_BIND="0.0.0.0")
    try:
        grpc_port, prom_port = _ports(p)
        socks = _listening(p.pid)
    finally:
        p.stdin.close()
        p.wait(timeout=30)
    assert ("0.0.0.0", prom_port) in socks, socks
    assert all(_loopback(ip) for ip, port in socks if port == grpc_port), socks
    assert "not loopback" in p.stderr.read()


def test_bind_settings_expand_exactly() -> None:
    from metrics.export import binding

    assert binding.addresses("127.0.0.1, ::1,127.0.0.1") == ["127.0.0.1", "::1"]
    assert binding.addresses("0.0.0.0") == sorted(
        _ipv4_of_this_host(), key=lambda a: (not a.startswith("127."), a))
    assert binding.addresses("::") == ["::"] and binding.addresses("") == ["127.0.0.1"]
    assert binding.is_loopback("localhost,127.0.0.2,[::1]")
    assert not binding.is_loopback("127.0.0.1,0.0.0.0") and not binding.is_loopback("::")
    assert binding.dial_host("0.0.0.0") == "127.0.0.1"
    assert binding.dial_host("192.0.2.9,::1") == "::1"


def test_client_refuses_oversized_replies():
    from tpu_info.net import client

    assert client.DEFAULT_MAX_MESSAGE_BYTES <= 64 * 2**20


def test_server_caps_request_size():
    import grpc

    from metrics.export.limits import MAX_RECEIVE_BYTES
    from metrics.export.server import Server
    from tpu_info.contract.model import Snapshot

    server = Server(lambda since: Snapshot(taken_at_unix=0.0), port=0)
    port = server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.unary_unary("/tpu_info.v1.Monitor/GetSnapshot",
                                  request_serializer=lambda b: b,
                                  response_deserializer=lambda b: b)
            assert call(b"", timeout=10) is not None  # an empty request is answered
            with pytest.raises(grpc.RpcError) as e:
                call(b"\x00" * (MAX_RECEIVE_BYTES + 1), timeout=10)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        server.stop(grace=0)
