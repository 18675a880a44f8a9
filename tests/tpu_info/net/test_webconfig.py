"""Securing the ``/metrics`` endpoints (issue 30, items 1 and 6): the
exporter-toolkit web configuration file, HTTPS, client certificates, basic
auth and the landing page, on the bounded server both endpoints use.

Real TLS on loopback with certificates made by ``openssl`` (tests/tls_certs.py),
real bcrypt. The real Prometheus scraping through all of it is
``tests/system/test_web_config_prometheus.py``.
"""

from __future__ import annotations

import base64
import os
import socket
import ssl
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest

from metrics.export import prometheus as prom
from tests.conftest import ROOT
from tests.metrics.export.test_prometheus import make_snapshot
from tests.tls_certs import make_pki
from tpu_info.commands import cli
from tpu_info.net import basic_auth, webconfig
from tpu_info.net.bounded_http import BoundedHttpServer

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(10)).decode()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _write(where: Path, text: str) -> Path:
    path = where / "web.yml"
    path.write_text(textwrap.dedent(text))
    return path


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _get(url: str, *, ca: Path | None = None, auth: str | None = None,
         cert: tuple[Path, Path] | None = None) -> tuple[int, str, bytes]:
    ctx = None
    if url.startswith("https"):
        ctx = ssl.create_default_context(cafile=str(ca))
        if cert:
            ctx.load_cert_chain(*map(str, cert))
    req = urllib.request.Request(url, headers={"Authorization": auth} if auth else {})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("WWW-Authenticate", ""), e.read()


BAD = [
    ("missing", None, "No such file"),
    ("yaml", "tls_server_config: [\n", "not valid YAML at line"),
    ("unknown", "basic_auth_user: {}\n", "unknown key basic_auth_user"),
    ("unknown tls", "tls_server_config: {cert_file: server.crt, key_file: server.key, "
     "cert_fil: x}\n", "unknown key tls_server_config.cert_fil"),
    ("unsupported", "tls_server_config: {cert_file: server.crt, key_file: server.key, "
     "cipher_suites: [TLS_AES_128_GCM_SHA256]}\n", "cipher_suites is not supported"),
    ("hash", "basic_auth_users: {prom: plaintext}\n", "basic_auth_users.prom: not a bcrypt"),
    ("no key", "tls_server_config: {cert_file: server.crt}\n", "needs key_file"),
    ("no cert file", "tls_server_config: {cert_file: nothere.crt, key_file: server.key}\n",
     "cannot load cert_file"),
    ("garbage cert", "tls_server_config: {cert_file: web.yml, key_file: server.key}\n",
     "cannot load cert_file"),
    ("wrong key", "tls_server_config: {cert_file: server.crt, key_file: client.key}\n",
     "cannot load cert_file"),
    ("auth type", "tls_server_config: {cert_file: server.crt, key_file: server.key, "
     "client_auth_type: Always}\n", "client_auth_type 'Always' is not one of"),
    ("no ca", "tls_server_config: {cert_file: server.crt, key_file: server.key, "
     "client_auth_type: RequireAndVerifyClientCert}\n", "needs client_ca_file"),
    ("ca unused", "tls_server_config: {cert_file: server.crt, key_file: server.key, "
     "client_ca_file: ca.crt}\n", "client_auth_type is NoClientCert"),
    ("version", "tls_server_config: {cert_file: server.crt, key_file: server.key, "
     "min_version: TLS14}\n", "min_version 'TLS14'"),
    ("not a map", "- a\n", "must be a YAML mapping"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name, text, message", BAD, ids=[b[0] for b in BAD])
def test_a_bad_file_is_one_line_naming_it(pki: Path, tmp_path: Path, name, text, message):
    where = tmp_path / "cfg"
    where.mkdir()
    for f in pki.glob("*.*"):
        if f.name != "web.yml":
            (where / f.name).write_bytes(f.read_bytes())
    path = where / "web.yml" if text is None else _write(where, text)
    with pytest.raises(webconfig.WebConfigError) as e:
        webconfig.load(path)
    assert message in str(e.value) and str(path) in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("argv_tail, message", [
    ([], "No such file"), (["yaml"], "not valid YAML")])
def test_the_exporter_says_it_in_one_line_and_exits_2(tmp_path: Path, capsys, argv_tail,
                                                     message):
    path = tmp_path / "web.yml"
    if argv_tail:
        path.write_text("a: [\n")
    assert cli.main(["exporter", "--listen", "127.0.0.1:0", "--web.config.file",
                     str(path)]) == cli.EXIT_USAGE == 2
    err = capsys.readouterr().err
    assert message in err and "--web.config.file" in err and err.count("\n") == 1, err


@pytest.mark.slow
def test_client_auth_types_map_to_verify_modes(pki: Path):
    expected = {"NoClientCert": ssl.CERT_NONE, "RequestClientCert": ssl.CERT_NONE,
                "RequireAnyClientCert": ssl.CERT_REQUIRED,
                "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
                "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
    for name, mode in expected.items():
        ca = "" if mode == ssl.CERT_NONE else "client_ca_file: ca.crt"
        cfg = webconfig.load(_write(pki, f"""
            tls_server_config:
              cert_file: server.crt
              key_file: server.key
              client_auth_type: {name}
              {ca}
        """))
        assert cfg.tls is not None and cfg.tls.verify_mode == mode, name
        assert cfg.tls.minimum_version == ssl.TLSVersion.TLSv1_2
        assert cfg.guarded == (mode == ssl.CERT_REQUIRED)
    assert webconfig.load(_write(pki, "")).tls is None  # an empty file: plain HTTP


@pytest.mark.slow
def test_https_with_basic_auth_and_the_landing_page(pki: Path):
    cfg = webconfig.load(_write(pki, f"""
        tls_server_config: {{cert_file: server.crt, key_file: server.key}}
        basic_auth_users: {{prom: "{HASH}"}}
    """))
    with prom.start_http(make_snapshot, port=0, environ={},
                         web_config=str(pki / "web.yml")) as server:
        assert server.url.startswith("https://127.0.0.1:")
        url = server.url.replace("127.0.0.1", "localhost")
        status, ctype, body = _get(url, ca=pki / "ca.crt", auth=_basic("prom", "s3cret"))
        assert status == 200 and b"tpu_info_uncached_compile_total 7.0" in body
        for auth in (_basic("prom", "wrong"), _basic("nobody", "s3cret"), None, "Bearer x"):
            status, challenge, _ = _get(url, ca=pki / "ca.crt", auth=auth)
            assert (status, challenge) == (401, 'Basic realm="tpu-info"'), auth
        status, ctype, page = _get(url.removesuffix("metrics"), ca=pki / "ca.crt",
                                   auth=_basic("prom", "s3cret"))
        assert status == 200 and ctype.startswith("text/html")
        assert b'<a href="metrics">' in page and b"Version 0." in page
        assert f"pid {os.getpid()}".encode() in page
        # Plain HTTP to the TLS port: no HTTP answer, the connection is closed.
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                got = s.recv(100)
            except ConnectionResetError:
                got = b""
            assert got == b""
    assert cfg.users == {"prom": HASH.encode()}


@pytest.mark.slow
def test_client_certificates_are_required_and_verified(pki: Path):
    cfg = webconfig.load(_write(pki, """
        tls_server_config:
          cert_file: server.crt
          key_file: server.key
          client_auth_type: RequireAndVerifyClientCert
          client_ca_file: ca.crt
    """))
    server = BoundedHttpServer(lambda a, e: (b"ok 1\n", "text/plain", ""), "127.0.0.1", 0,
                               tls=cfg.tls)
    server.start()
    try:
        url = f"https://localhost:{server.server_address[1]}/metrics"
        assert _get(url, ca=pki / "ca.crt", cert=(pki / "client.crt", pki / "client.key")
                    )[::2] == (200, b"ok 1\n")
        for cert in (None, (pki / "stranger.crt", pki / "stranger.key")):
            with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
                _get(url, ca=pki / "ca.crt", cert=cert)
    finally:
        server.stop()
    assert server.answered == 1 and server.dropped == 2


def _auth(now: list[float]) -> basic_auth.BasicAuth:
    # bcrypt's answer without its 50-160 ms: the rules, not the hash, are tested here.
    return basic_auth.BasicAuth({"prom": b"right", "other": b"other-right"},
                                clock=lambda: now[0], checker=lambda pw, h: pw == h)


def test_a_header_that_passed_is_remembered_while_it_is_used():
    now = [100.0]
    auth = _auth(now)
    good = _basic("prom", "right")
    assert auth(good, "127.0.0.1").ok and auth.checks == 1
    for _ in range(20):  # used every 60 s for 20 minutes: never checked again
        now[0] += 60
        assert auth(good, "127.0.0.1").ok
    assert auth.checks == 1
    now[0] += basic_auth.AUTH_IDLE_S + 1  # unused that long: checked again
    assert auth(good, "127.0.0.1").ok and auth.checks == 2


def test_a_flood_of_guesses_spends_its_own_budget_and_is_told_429():
    now = [100.0]
    auth = _auth(now)
    verdicts = [auth(_basic("prom", f"guess{i}"), "127.0.0.1") for i in range(20)]
    assert [v.status for v in verdicts[:4]] == [401] * 4  # the burst: checked, wrong
    assert {v.status for v in verdicts[4:]} == {429}  # not checked: come back later
    assert all(v.retry_after_s >= 1 for v in verdicts[4:])
    assert auth.checks == basic_auth.CHECK_BURST and auth.refused_busy == 16
    # The same wrong password again is known wrong: 401, no check, no budget.
    assert auth(_basic("prom", "guess0"), "127.0.0.1").status == 401
    # Another user name from the same address, and the same name from another
    # address, have budgets of their own: their first login is checked at once.
    assert auth(_basic("other", "other-right"), "127.0.0.1").ok
    assert auth(_basic("prom", "right"), "10.0.0.2").ok
    # Made-up names share one budget per address: no state per name.
    for i in range(50):
        auth(_basic(f"nobody{i}", "x"), "127.0.0.1")
    assert auth.clients == 4  # (127.0.0.1: prom, other, unknown names), (10.0.0.2: prom)
    now[0] += 1.0  # two tokens back
    assert auth(_basic("prom", "right"), "127.0.0.1").ok


def test_the_budget_table_is_bounded_and_the_ceiling_holds():
    now = [100.0]
    auth = _auth(now)
    statuses = [auth(_basic("prom", f"g{i}"), f"10.0.{i // 250}.{i % 250}").status
                for i in range(2 * basic_auth.MAX_CLIENTS)]
    assert statuses.count(401) == basic_auth.CEILING_BURST  # the process's ceiling
    assert auth.clients <= basic_auth.MAX_CLIENTS + 1
    now[0] += 3600
    assert auth(_basic("prom", "right"), "127.0.0.1").ok


@pytest.mark.slow
def test_the_hook_runs_on_without_its_endpoint_when_the_file_is_bad(tmp_path: Path):
    program = ("import metrics, urllib.request\n"
               "metrics.install(serve='thread', port=0, prometheus_port=0)\n"
               "print('ran on', metrics.counter_value('UncachedCompile'))\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT),
               TPU_INFO_PROMETHEUS_WEB_CONFIG=str(tmp_path / "missing.yml"))
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 0 and "ran on" in done.stdout, done.stderr
    warned = [line for line in done.stderr.splitlines() if "web config" in line]
    assert len(warned) == 1 and "Prometheus endpoint not started" in warned[0], done.stderr


def test_the_exporter_has_a_landing_page_linking_metrics():
    from tpu_info.commands.exporter import ExporterOptions, HostExporter
    from tpu_info.contract.model import LocalScan

    ex = HostExporter(ExporterOptions(host_label="h1", runtime_dir="/nonexistent",
                                      libtpu_target=None), scan_chips=LocalScan)
    port = ex.start("127.0.0.1", 0)
    try:
        status, ctype, page = _get(f"http://127.0.0.1:{port}/")
        assert status == 200 and ctype == "text/html; charset=utf-8"
        assert b"<title>tpu-info exporter</title>" in page and b"Host h1" in page
        assert b'<a href="metrics">Metrics</a>' in page
        status, _, body = _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and b"tpu_info_exporter_polls_total" in body
    finally:
        ex.stop()


@pytest.mark.slow
def test_connections_that_never_handshake_do_not_keep_a_scrape_out(pki: Path):
    from tpu_info.net.bounded_http import MAX_CONNECTIONS

    cfg = webconfig.load(_write(pki, "tls_server_config: {cert_file: server.crt, "
                                     "key_file: server.key}\n"))
    server = BoundedHttpServer(lambda a, e: (b"ok 1\n", "text/plain", ""), "127.0.0.1", 0,
                               tls=cfg.tls)
    server.start()
    port = server.server_address[1]
    idle = [socket.create_connection(("127.0.0.1", port), timeout=10)
            for _ in range(MAX_CONNECTIONS + 8)]
    try:
        for s in idle[:4]:  # a ClientHello and nothing after it
            s.sendall(b"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00")
        status, _, body = _get(f"https://localhost:{port}/metrics", ca=pki / "ca.crt")
        assert (status, body) == (200, b"ok 1\n")
        assert server.connections <= MAX_CONNECTIONS
    finally:
        for s in idle:
            s.close()
        server.stop()


def _serial(port: int, ca: Path) -> str:
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as s:
        return str(s.getpeercert()["serialNumber"])


def _replace(path: Path, data: bytes) -> None:
    """As a Kubernetes Secret volume or cert-manager does: a new file in its place."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@pytest.mark.slow
def test_rotated_certificates_and_new_passwords_serve_without_a_restart(
        pki: Path, tmp_path: Path, caplog):
    where = tmp_path / "etc"
    where.mkdir()
    for name in ("server.crt", "server.key"):
        (where / name).write_bytes((pki / name).read_bytes())
    web = where / "web.yml"
    web.write_text("tls_server_config: {cert_file: server.crt, key_file: server.key}\n"
                   f"basic_auth_users: {{prom: \"{HASH}\"}}\n")
    now = [0.0]
    live = webconfig.LiveWebConfig(webconfig.load(web), clock=lambda: now[0])
    server = BoundedHttpServer(lambda a, e: (b"ok 1\n", "text/plain", ""), "127.0.0.1", 0,
                               tls=live, authorize=live)
    server.start()
    port = server.server_address[1]
    url = f"https://localhost:{port}/metrics"
    ca = pki / "ca.crt"
    try:
        first = _serial(port, ca)
        assert _get(url, ca=ca, auth=_basic("prom", "s3cret"))[0] == 200
        new_hash = bcrypt.hashpw(b"n3w", bcrypt.gensalt(4)).decode()
        _replace(where / "server.crt", (pki / "server2.crt").read_bytes())
        _replace(where / "server.key", (pki / "server2.key").read_bytes())
        _replace(web, web.read_bytes().replace(HASH.encode(), new_hash.encode()))
        assert _serial(port, ca) == first  # not looked at yet (at most once a second)
        now[0] += 2
        assert _serial(port, ca) != first and live.reloads == 1
        assert _get(url, ca=ca, auth=_basic("prom", "s3cret"))[0] == 401
        assert _get(url, ca=ca, auth=_basic("prom", "n3w"))[0] == 200

        # A broken change keeps the last good configuration, said once.
        _replace(web, b"tls_server_config: [\n")
        for _ in range(3):
            now[0] += 2
            assert _get(url, ca=ca, auth=_basic("prom", "n3w"))[0] == 200
        _replace(web, b"basic_auth_users: {}\n")  # HTTP: needs a restart
        now[0] += 2
        assert _get(url, ca=ca, auth=_basic("prom", "n3w"))[0] == 200
    finally:
        server.stop()
    said = [r.getMessage() for r in caplog.records if r.name == "tpu_info.net.webconfig"
            and r.levelname == "WARNING"]
    assert len(said) == 2 and "not valid YAML" in said[0] and "last good" in said[0], said
    assert "needs a restart" in said[1], said
    assert live.reloads == 1


def test_basic_auth_without_bcrypt_installed_is_one_line_saying_what_to_install(tmp_path,
                                                                               monkeypatch):
    import importlib.util

    from tpu_info.net import webconfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "bcrypt" else real(name, *a))
    f = tmp_path / "web.yml"
    f.write_text("basic_auth_users:\n  prometheus: $2b$10$" + "a" * 53 + "\n")
    with pytest.raises(Exception) as e:
        webconfig.load(str(f))
    assert "pip install 'xla-tpu-info[web]'" in str(e.value) and "\n" not in str(e.value)
