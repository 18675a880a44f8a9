"""A real Prometheus scrapes the secured endpoints (issue 30, item 1):
``tpu-info exporter --web.config.file`` with HTTPS and basic auth, and the
hook's ``/metrics`` with HTTPS and client certificates required, through
Prometheus' own ``tls_config`` and ``basic_auth``. The scrapes with the right
credentials are up with our series; a wrong password is a 401, plain HTTP to
the TLS port and a scrape without a client certificate fail.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest

from metrics.export import prometheus as prom
from tests.conftest import ROOT, patient
from tests.hooked import terminate
from tests.metrics.export.test_prometheus import free_port, make_snapshot, prometheus_binary  # noqa: F401
from tests.metrics.export.test_prometheus import query as prom_query
from tests.tls_certs import make_pki


def _targets(api_port: int) -> dict[str, dict]:
    url = f"http://127.0.0.1:{api_port}/api/v1/targets"
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    return {t["labels"]["job"]: t for t in body["data"]["activeTargets"]}


def _start_exporter(pki: Path, tmp_path: Path) -> tuple[subprocess.Popen[str], int]:
    web = pki / "exporter-web.yml"
    web.write_text(textwrap.dedent(f"""
        tls_server_config:
          cert_file: server.crt
          key_file: server.key
        basic_auth_users:
          prometheus: "{bcrypt.hashpw(b"scrape-me", bcrypt.gensalt(10)).decode()}"
    """))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpu_info", "exporter", "--listen", "127.0.0.1:0",
         "--runtime-dir", str(tmp_path / "none"), "--host-label", "h1", "--no-libtpu",
         "--sysfs", str(tmp_path / "nosys"), "--interval", "1", "--web.config.file", str(web)],
        stderr=subprocess.PIPE, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    line = proc.stderr.readline() if proc.stderr else ""
    assert "serving https://127.0.0.1:" in line, line
    return proc, int(line.split("127.0.0.1:")[1].split("/")[0])


@pytest.mark.slow
def test_prometheus_scrapes_over_https_with_basic_auth_and_client_certificates(
        prometheus_binary: str, tmp_path: Path):  # noqa: F811
    pki = make_pki(tmp_path / "pki")
    mtls = pki / "hook-web.yml"
    mtls.write_text(textwrap.dedent("""
        tls_server_config:
          cert_file: server.crt
          key_file: server.key
          client_auth_type: RequireAndVerifyClientCert
          client_ca_file: ca.crt
    """))
    exporter, exporter_port = _start_exporter(pki, tmp_path)
    prometheus = None
    try:
        with prom.start_http(make_snapshot, port=0, environ={}, web_config=mtls) as hook:
            ca = pki / "ca.crt"
            config = tmp_path / "prometheus.yml"

            # A wrong password costs a whole bcrypt check (50-160 ms at cost 10 on a quiet
            # core); on a loaded machine that outlasts a 1 s scrape timeout, which Prometheus
            # then reports instead of the 401 this test reads: the interval follows the load.
            every = f"{math.ceil(patient(1))}s"

            def job(name: str, port: int, scheme: str = "https", **extra: object) -> dict:
                return {"job_name": name, "scheme": scheme, "scrape_interval": every,
                        "static_configs": [{"targets": [f"127.0.0.1:{port}"]}], **extra}

            config.write_text(json.dumps({"scrape_configs": [
                job("exporter-basic", exporter_port, tls_config={"ca_file": str(ca)},
                    basic_auth={"username": "prometheus", "password": "scrape-me"}),
                job("exporter-wrong-password", exporter_port, tls_config={"ca_file": str(ca)},
                    basic_auth={"username": "prometheus", "password": "guess"}),
                job("exporter-plain-http", exporter_port, scheme="http",
                    basic_auth={"username": "prometheus", "password": "scrape-me"}),
                job("hook-client-cert", hook.port, tls_config={
                    "ca_file": str(ca), "cert_file": str(pki / "client.crt"),
                    "key_file": str(pki / "client.key")}),
                job("hook-no-client-cert", hook.port, tls_config={"ca_file": str(ca)}),
                job("hook-stranger-cert", hook.port, tls_config={
                    "ca_file": str(ca), "cert_file": str(pki / "stranger.crt"),
                    "key_file": str(pki / "stranger.key")}),
            ]}))  # JSON is YAML
            api_port = free_port()
            log = tmp_path / "prometheus.log"
            prometheus = subprocess.Popen(
                [prometheus_binary, f"--config.file={config}",
                 f"--storage.tsdb.path={tmp_path / 'data'}",
                 f"--web.listen-address=127.0.0.1:{api_port}"],
                stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=tmp_path)
            want = {"exporter-basic": "up", "exporter-wrong-password": "down",
                    "exporter-plain-http": "down", "hook-client-cert": "up",
                    "hook-no-client-cert": "down", "hook-stranger-cert": "down"}
            targets: dict[str, dict] = {}
            deadline = time.monotonic() + patient(90)
            while time.monotonic() < deadline:
                assert prometheus.poll() is None, log.read_text()[-2000:]
                try:
                    targets = _targets(api_port)
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    targets = {}
                if ({j: t["health"] for j, t in targets.items()} == want
                        and "401" in targets["exporter-wrong-password"]["lastError"]):
                    break
                time.sleep(0.5)
            seen = {j: (t["health"], t["lastError"]) for j, t in targets.items()}
            assert {j: h for j, (h, _) in seen.items()} == want, seen
            assert "401" in seen["exporter-wrong-password"][1], seen
            print("\n".join(f"{j}: {h} {e}" for j, (h, e) in sorted(seen.items())))
            polls = prom_query(api_port, 'tpu_info_exporter_polls_total{job="exporter-basic"}')
            compiles = prom_query(api_port,
                                  'tpu_info_uncached_compile_total{job="hook-client-cert"}')
            assert polls and [float(c["value"][1]) for c in compiles] == [7.0]
    finally:
        terminate(prometheus)
        exporter.terminate()
        assert exporter.wait(30) == 0
