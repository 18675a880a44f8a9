"""Prometheus exporter-toolkit's web configuration file: TLS and basic auth
for the ``/metrics`` endpoints (``tpu-info exporter --web.config.file`` and
the hook's ``$TPU_INFO_PROMETHEUS_WEB_CONFIG``).

The same YAML as node_exporter's ``--web.config.file``::

    tls_server_config:
      cert_file: server.crt          # relative paths: to the file's directory
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: clients-ca.crt
      min_version: TLS12             # TLS10..TLS13; default TLS12
    basic_auth_users:
      prometheus: $2b$10$...         # bcrypt hashes (htpasswd -nBC 10 USER)

:func:`load` reads and checks it all at once (certificates loaded, hashes
parsed) and raises :class:`WebConfigError`, one line naming the file, for a
missing file, bad YAML, an unknown or unsupported key, a bad hash or a
certificate that does not load. :class:`LiveWebConfig` reads it again when
it or a file it names changes (rotated certificates, new users), as
exporter-toolkit does. :class:`~tpu_info.net.basic_auth.BasicAuth` checks
``Authorization`` headers on the serving thread: a header that passed is
remembered while it is used, and bcrypt checks are rationed per client
(address and user name) under one ceiling for the process; a client over
its budget gets 429 with ``Retry-After``, not 401.

Python's ``ssl`` only ever verifies a client certificate it asks for, so
``RequireAnyClientCert`` and ``VerifyClientCertIfGiven`` verify against
``client_ca_file`` (required with them), and ``RequestClientCert`` asks for
nothing (Go's would ask and ignore the answer): each is at least as strict
as exporter-toolkit's.

Example:
    >>> cfg = load_text("basic_auth_users: {}\\n", "web.yml")
    >>> cfg.tls is None, cfg.scheme
    (True, 'http')
"""

from __future__ import annotations

import logging
import os
import re
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tpu_info.contract.errors import TpuInfoError
from tpu_info.net.basic_auth import PASSED, BasicAuth, Verdict

log = logging.getLogger("tpu_info.net.webconfig")

RELOAD_CHECK_S = 1.0  # the files' stat() at most this often, on the serving thread

CLIENT_AUTH = {  # exporter-toolkit's names -> (verify_mode, needs client_ca_file)
    "NoClientCert": (ssl.CERT_NONE, False),
    "RequestClientCert": (ssl.CERT_NONE, False),
    "RequireAnyClientCert": (ssl.CERT_REQUIRED, True),
    "VerifyClientCertIfGiven": (ssl.CERT_OPTIONAL, True),
    "RequireAndVerifyClientCert": (ssl.CERT_REQUIRED, True),
}
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
            "max_version")
TOP_KEYS = ("tls_server_config", "basic_auth_users")
# exporter-toolkit's keys that tpu-info refuses rather than ignore (a
# security setting silently dropped would be worse than none).
UNSUPPORTED = ("http_server_config", "cert", "key", "client_ca", "client_allowed_sans",
               "cipher_suites", "curve_preferences", "prefer_server_cipher_suites")
_BCRYPT = re.compile(r"^\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")


class WebConfigError(TpuInfoError):
    """The web configuration file cannot be used (one line, naming the file)."""


def _fail(path: str, what: str) -> WebConfigError:
    return WebConfigError(f"web config {path}: {what}")


@dataclass(frozen=True)
class WebConfig:
    """A checked web configuration.

    Attributes:
        path: the file it came from.
        tls: the server's TLS context, None for plain HTTP.
        users: user -> bcrypt hash; empty: no basic auth.
        files: the file and those it names (certificates, keys, CA).
    """

    path: str
    tls: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    files: tuple[str, ...] = ()

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    @property
    def guarded(self) -> bool:
        """Whether a client needs a password or a verified certificate."""
        return bool(self.users) or (self.tls is not None
                                    and self.tls.verify_mode == ssl.CERT_REQUIRED)

    def authorizer(self) -> BasicAuth | None:
        """A checker of ``Authorization`` headers, None without users."""
        return BasicAuth(self.users) if self.users else None


def load(path: str | os.PathLike[str]) -> WebConfig:
    """Reads and checks the file (certificates loaded, hashes parsed).

    Raises:
        WebConfigError: anything wrong with it, in one line.
    """
    shown = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise _fail(shown, getattr(e, "strerror", None) or str(e)) from None
    return load_text(text, shown)


def load_text(text: str, path: str) -> WebConfig:
    """:func:`load` of ``text`` (relative file names: to ``path``'s directory)."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise _fail(path, f"not valid YAML{where}: "
                    f"{getattr(e, 'problem', None) or e}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise _fail(path, "must be a YAML mapping (tls_server_config, basic_auth_users)")
    _keys(path, doc, TOP_KEYS, "")
    base = os.path.dirname(os.path.abspath(path))
    tls = _tls(path, base, doc.get("tls_server_config"))
    named = doc.get("tls_server_config") or {}
    files = [os.path.join(base, named[k]) for k in ("cert_file", "key_file", "client_ca_file")
             if tls is not None and named.get(k)]
    return WebConfig(path, tls, _users(path, doc.get("basic_auth_users")),
                     (os.path.abspath(path), *files))


def _keys(path: str, doc: Mapping[Any, Any], known: tuple[str, ...], where: str) -> None:
    for key in doc:
        if key in known:
            continue
        if key in UNSUPPORTED:
            raise _fail(path, f"{where}{key} is not supported by tpu-info (supported: "
                        f"{', '.join(known)})")
        raise _fail(path, f"unknown key {where}{key!s} (known: {', '.join(known)})")


def _tls(path: str, base: str, doc: Any) -> ssl.SSLContext | None:
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise _fail(path, "tls_server_config must be a mapping")
    _keys(path, doc, TLS_KEYS, "tls_server_config.")
    for key, value in doc.items():
        if value is not None and not isinstance(value, str):
            raise _fail(path, f"tls_server_config.{key} must be a string")
    cert, key = doc.get("cert_file") or "", doc.get("key_file") or ""
    if not cert and not key and not any(doc.get(k) for k in TLS_KEYS):
        return None  # as exporter-toolkit: an empty section is plain HTTP
    if not cert or not key:
        raise _fail(path, f"tls_server_config needs {'key_file' if cert else 'cert_file'}")
    auth = doc.get("client_auth_type") or "NoClientCert"
    if auth not in CLIENT_AUTH:
        raise _fail(path, f"client_auth_type {auth!r} is not one of {', '.join(CLIENT_AUTH)}")
    mode, needs_ca = CLIENT_AUTH[auth]
    ca = doc.get("client_ca_file") or ""
    if needs_ca and not ca:
        raise _fail(path, f"client_auth_type {auth} needs client_ca_file (tpu-info verifies "
                    "every client certificate it asks for)")
    if ca and mode == ssl.CERT_NONE:
        raise _fail(path, f"client_ca_file is set but client_auth_type is {auth}: set "
                    "VerifyClientCertIfGiven or RequireAndVerifyClientCert")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    for bound in ("min_version", "max_version"):
        name = doc.get(bound)
        if name is None:
            continue
        if name not in TLS_VERSIONS:
            raise _fail(path, f"tls_server_config.{bound} {name!r} is not one of "
                        f"{', '.join(TLS_VERSIONS)}")
        setattr(ctx, "minimum_version" if bound == "min_version" else "maximum_version",
                TLS_VERSIONS[name])
    if doc.get("min_version") is None:
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2  # exporter-toolkit's default
    cert, key = os.path.join(base, cert), os.path.join(base, key)
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise _fail(path, f"cannot load cert_file {cert} with key_file {key}: "
                    f"{getattr(e, 'strerror', None) or e.args[-1]}") from None
    if ca:
        ca = os.path.join(base, ca)
        try:
            ctx.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as e:
            raise _fail(path, f"cannot load client_ca_file {ca}: "
                        f"{getattr(e, 'strerror', None) or e.args[-1]}") from None
    ctx.verify_mode = mode
    return ctx


def _users(path: str, doc: Any) -> dict[str, bytes]:
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise _fail(path, "basic_auth_users must be a mapping of user to bcrypt hash")
    users = {}
    for user, hashed in doc.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise _fail(path, f"basic_auth_users: bad user name {user!r}")
        if not isinstance(hashed, str) or not _BCRYPT.match(hashed):
            raise _fail(path, f"basic_auth_users.{user}: not a bcrypt hash (make one with "
                        "htpasswd -nBC 10 USER)")
        users[user] = hashed.encode("ascii")
    if users:
        import importlib.util

        if importlib.util.find_spec("bcrypt") is None:
            raise _fail(path, "basic_auth_users needs the bcrypt package: "
                        "pip install 'xla-tpu-info[web]'")
    return users


def _stamp(files: tuple[str, ...]) -> tuple[tuple[int, int, int] | None, ...]:
    out: list[tuple[int, int, int] | None] = []
    for f in files:
        try:
            st = os.stat(f)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


class LiveWebConfig:
    """A :class:`WebConfig` read again when its file or one it names changes
    (looked at, by ``stat``, at most every :data:`RELOAD_CHECK_S` on the
    serving thread): rotated certificates serve the next connection, new
    users and passwords the next request. A change that cannot be used is
    logged once and the last good configuration stays; so is one that
    switches between HTTP and HTTPS (that needs a restart: Prometheus
    scrapes with one scheme).

    It is both the server's ``tls`` (:meth:`wrap_socket`) and its
    ``authorize`` (calling it with a header and the client's address gives a
    :class:`~tpu_info.net.basic_auth.Verdict`; in when no users are set).

    Args:
        config: the configuration loaded at start (:func:`load`).
        clock: monotonic seconds (injected for tests).
    """

    def __init__(self, config: WebConfig, clock: Any = time.monotonic) -> None:
        self._config = config
        self._auth = config.authorizer()
        self._stamp = _stamp(config.files)
        self._clock = clock
        self._checked = clock()
        self._said: object = None
        self.reloads = 0

    @property
    def config(self) -> WebConfig:
        """The configuration in force."""
        return self._config

    def wrap_socket(self, sock: Any, server_side: bool = False,
                    do_handshake_on_connect: bool = True) -> ssl.SSLSocket:
        """The current TLS context's ``wrap_socket``."""
        self.refresh()
        assert self._config.tls is not None
        return self._config.tls.wrap_socket(sock, server_side=server_side,
                                            do_handshake_on_connect=do_handshake_on_connect)

    def __call__(self, header: str, peer: str = "") -> Verdict:
        self.refresh()
        return PASSED if self._auth is None else self._auth(header, peer)

    def refresh(self) -> None:
        """Reads the file again when it or a file it names changed."""
        now = self._clock()
        if now - self._checked < RELOAD_CHECK_S:
            return
        self._checked = now
        stamp = _stamp(self._config.files)
        if stamp == self._stamp or stamp == self._said:
            return
        try:
            new = load(self._config.path)
        except WebConfigError as e:
            self._said = stamp
            log.warning("tpu-info: %s; still serving with the last good one", e)
            return
        if (new.tls is None) != (self._config.tls is None):
            self._said = stamp
            log.warning("tpu-info: web config %s: switching between HTTP and HTTPS needs a "
                        "restart; still serving %s", new.path, self._config.scheme)
            return
        # The stamp from before reading: a change made while it was read is seen next time.
        self._stamp = stamp if new.files == self._config.files else _stamp(new.files)
        self._config, self._auth = new, new.authorizer()
        self.reloads += 1
        log.info("tpu-info: web config %s read again", new.path)
