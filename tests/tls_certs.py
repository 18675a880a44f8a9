"""A throwaway PKI for the TLS tests, made with the ``openssl`` command line:
a CA, two server certificates for ``localhost``/``127.0.0.1`` (the second
to rotate to) and a client certificate, all signed by the CA, plus a second CA that signed nothing of
ours (a client certificate from it must be refused)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(name: str, cwd: Path) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
             "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=cwd)


def _leaf(name: str, ca: str, ext: str, cwd: Path) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=cwd)
    (cwd / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
             cwd=cwd)


def make_pki(where: Path) -> Path:
    """Writes ``ca``, ``server``, ``server2``, ``client`` (signed by ``ca``) and ``stranger``
    (a client signed by ``other-ca``) as ``NAME.crt``/``NAME.key`` in ``where``."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command line is not installed")
    where.mkdir(parents=True, exist_ok=True)
    _ca("ca", where)
    _ca("other-ca", where)
    for name in ("server", "server2"):
        _leaf(name, "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
              "extendedKeyUsage=serverAuth\n", where)
    _leaf("client", "ca", "extendedKeyUsage=clientAuth\n", where)
    _leaf("stranger", "other-ca", "extendedKeyUsage=clientAuth\n", where)
    return where
