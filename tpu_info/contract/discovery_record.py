"""The discovery record: the rules its writer and its reader share.

Each hooked process writes ``<pid>.json`` into a private runtime directory
(:func:`runtime_dir`; private as :func:`unsafe_directory_reason` checks) and
removes it at exit. ``metrics.export.discovery`` writes it;
:mod:`tpu_info.net.discovery` reads the directory and judges the records.
:func:`parse_record` says what a valid record is. A record carries
``capture_secret``, a random token only the owner (who can read the 0600
record) knows, sent as gRPC metadata (:data:`CAPTURE_TOKEN_METADATA`) to ask
for a trace capture, and ``socket``, the path of the Unix socket the
process also serves on (``<pid>.sock`` beside the record; "" for none),
which only its user can reach (:mod:`tpu_info.net.local_socket`).

Text in a record is valid UTF-8 (:func:`tpu_info.contract.safe.os_text`:
the writer's argv and host, and whatever an older or foreign writer left,
as the reader parses it). The command line is cut to a bounded size;
``argv_truncated`` counts the arguments left out (the snapshot's process
record carries them all).

A process served on that socket alone (no TCP socket can be opened on its
host, or ``TPU_INFO_BIND=unix`` asked for it) writes port 0 and says why in
``no_tcp`` (:data:`NO_TCP_UNAVAILABLE`, :data:`NO_TCP_ASKED`; the OS's words
in ``no_tcp_detail``); its :attr:`DiscoveredProcess.target` is
``unix:<socket>``. A hooked process whose server did not start writes port
0, no socket and ``failed`` (what went wrong), so ``doctor`` can say so.

Example:
    >>> from pathlib import Path
    >>> p = parse_record({"schema": 1, "pid": 42, "port": 8431, "host": "localhost",
    ...                   "argv": ["train.py"], "engine": "jax", "versions": {},
    ...                   "start_time": 0.0}, Path("/run/tpu-info/42.json"))
    >>> p.target
    'localhost:8431'
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpu_info.contract.safe import os_text

SCHEMA_VERSION = 1
ENV_RUNTIME_DIR = "TPU_INFO_RUNTIME_DIR"
ENV_XDG_RUNTIME_DIR = "XDG_RUNTIME_DIR"
MAX_RECORD_BYTES = 64 * 1024
# The gRPC metadata key a client sends the record's capture secret under.
CAPTURE_TOKEN_METADATA = "tpu-info-capture-token"
# Why a process serves on its local socket alone (the record's ``no_tcp``).
NO_TCP_UNAVAILABLE = "unavailable"  # no TCP socket can be opened on its host
NO_TCP_ASKED = "asked"  # TPU_INFO_BIND=unix
NO_TCP_REASONS = (NO_TCP_UNAVAILABLE, NO_TCP_ASKED)
# A target naming a local socket: ``unix:/path/<pid>.sock`` (grpc's own spelling).
UNIX_SCHEME = "unix:"


@dataclass(frozen=True, slots=True)
class DiscoveredProcess:
    """One hooked process's discovery record."""

    pid: int
    port: int
    host: str
    argv: tuple[str, ...]
    engine: str
    versions: Mapping[str, str]
    start_time: float
    path: Path
    schema: int = SCHEMA_VERSION
    # Only the owner reads it; never printed (repr=False), sent only to this process.
    capture_secret: str = field(default="", repr=False)
    # Engines the hook waits for (not imported yet when the record was written).
    waiting: tuple[str, ...] = ()
    # The Unix socket the process serves on too ("" for none; older hooks have none).
    socket: str = ""
    # Why it serves on that socket alone (NO_TCP_REASONS; "" when TCP serves too),
    # and the OS's words for it.
    no_tcp: str = ""
    no_tcp_detail: str = ""
    # Its server did not start: what went wrong ("" when it serves).
    failed: str = ""
    # Arguments the record leaves out (a long command line is cut to keep the
    # record small; the snapshot's process record has them all).
    argv_truncated: int = 0

    @property
    def served(self) -> bool:
        """Whether a client can reach it (its server started)."""
        return not self.failed

    @property
    def target(self) -> str:
        """``host:port`` for a gRPC client (IPv6 hosts in brackets); for a
        process served on its local socket alone, ``unix:<socket>`` (the
        socket beside the record as this reader found it); "" when its
        server did not start."""
        if self.port:
            host = f"[{self.host}]" if ":" in self.host else self.host
            return f"{host}:{self.port}"
        if self.socket:
            return UNIX_SCHEME + os.path.abspath(self.path.with_name(f"{self.pid}.sock"))
        return ""


def runtime_dir(environ: Mapping[str, str] | None = None, uid: int | None = None) -> Path:
    """The private directory for discovery records.

    ``$TPU_INFO_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/tpu-info``, else
    ``/tmp/tpu-info-<uid>``.

    Args:
        environ: the environment to read (default ``os.environ``).
        uid: the user id for the fallback (default the effective uid).
    """
    env = os.environ if environ is None else environ
    explicit = env.get(ENV_RUNTIME_DIR)
    if explicit:
        return Path(explicit)
    xdg = env.get(ENV_XDG_RUNTIME_DIR)
    if xdg:
        return Path(xdg) / "tpu-info"
    return Path("/tmp") / f"tpu-info-{os.geteuid() if uid is None else uid}"


def unsafe_directory_reason(st: os.stat_result, uid: int | None = None) -> str | None:
    """Why a directory with ``lstat`` result ``st`` is not private, else None."""
    uid = os.geteuid() if uid is None else uid
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not {uid}"
    if st.st_mode & 0o022:
        return f"is group or world writable (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def parse_record(data: Any, path: Path) -> DiscoveredProcess:
    """Validates a decoded record; raises ``ValueError`` saying what is wrong."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    schema = data.get("schema")
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise ValueError("missing schema version")

    def get(key: str, kind: type | tuple[type, ...]) -> Any:
        value = data.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"field {key!r} missing or not {getattr(kind, '__name__', kind)}")
        return value

    pid = get("pid", int)
    port = get("port", int)
    if not 0 <= port < 65536:
        raise ValueError(f"port {port} out of range")
    argv = get("argv", list)
    versions = get("versions", dict)
    if not all(isinstance(a, str) for a in argv):
        raise ValueError("argv is not a list of strings")
    cut = data.get("argv_truncated", 0)
    if not isinstance(cut, int) or isinstance(cut, bool) or cut < 0:
        raise ValueError("argv_truncated is not a count")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in versions.items()):
        raise ValueError("versions is not a map of strings")
    waiting = data.get("waiting", [])
    if not isinstance(waiting, list) or not all(isinstance(e, str) for e in waiting):
        raise ValueError("waiting is not a list of strings")
    secret = data.get("capture_secret", "")
    if not isinstance(secret, str) or not secret.isascii() or not secret.isprintable():
        raise ValueError("capture_secret is not a printable ASCII string")
    sock = data.get("socket", "")
    # A path to reopen: kept as the OS spells it (surrogate-escaped bytes too).
    if not isinstance(sock, str) or not os_text(sock).isprintable() \
            or (sock and Path(sock).name != f"{pid}.sock"):
        raise ValueError(f"socket is not a path ending in {pid}.sock")
    if path.name != f"{pid}.json":
        raise ValueError(f"pid {pid} does not match the file name")
    no_tcp, detail, failed = (_printable(data, k) for k in ("no_tcp", "no_tcp_detail", "failed"))
    if no_tcp and no_tcp not in NO_TCP_REASONS:
        raise ValueError(f"no_tcp is {no_tcp!r}, not one of {', '.join(NO_TCP_REASONS)}")
    if port == 0 and not sock and not failed:
        raise ValueError("port 0 with no socket: nothing serves it, and it does not say why")
    return DiscoveredProcess(
        pid=pid, port=port, host=os_text(get("host", str)), argv=tuple(map(os_text, argv)),
        engine=os_text(get("engine", str)),
        versions={os_text(k): os_text(v) for k, v in versions.items()},
        start_time=float(get("start_time", (int, float))), path=path, schema=schema,
        capture_secret=secret, waiting=tuple(map(os_text, waiting)), socket=sock,
        no_tcp=no_tcp if port == 0 else "", no_tcp_detail=detail if port == 0 else "",
        failed=failed, argv_truncated=cut,
    )


def _printable(data: dict[str, Any], key: str, limit: int = 500) -> str:
    """An optional one-line string field ("" when absent), at most ``limit`` characters."""
    value = data.get(key, "")
    if not isinstance(value, str) or not value.isprintable():
        raise ValueError(f"{key} is not a printable string")
    return value[:limit]


def process_start_unix(pid: int, proc_root: str = "/proc") -> float:
    """When ``pid`` started (Unix seconds), which the hook writes in its
    record and readers compare with it (a pid reused by a younger process is
    not the record's): now less the process's age, its age being the boot
    clock (``CLOCK_BOOTTIME``) less its start ticks, so it is exact to a
    tick (10 ms). psutil's ``create_time()`` adds the start ticks to
    ``/proc/stat``'s btime, whole seconds: up to 1 s early (issue 42 item
    4), and moved by every step of the wall clock; that is used only where
    the boot clock cannot be read. Read without importing psutil (5-30 ms of
    a one-shot's start); psutil where there is no procfs.

    Raises:
        OSError, ValueError: the process is gone or its start cannot be read.
    """
    if not os.path.exists(f"{proc_root}/self/stat"):
        import psutil

        return float(psutil.Process(pid).create_time())
    with open(f"{proc_root}/{pid}/stat", "rb") as f:
        ticks = int(f.read().rsplit(b")", 1)[1].split()[19])  # field 22: starttime
    if proc_root == "/proc" and hasattr(time, "CLOCK_BOOTTIME"):
        try:
            age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
            return time.time() - max(0.0, age)
        except OSError:
            pass
    with open(f"{proc_root}/stat", "rb") as f:
        boot = next((float(line.split()[1]) for line in f if line.startswith(b"btime ")), None)
    if boot is None:
        raise ValueError(f"no btime in {proc_root}/stat")
    return ticks / os.sysconf("SC_CLK_TCK") + boot
