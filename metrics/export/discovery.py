"""Writes this process's discovery record so ``tpu-info`` can find it.

:func:`publish` writes ``<pid>.json`` (pid, port, host, argv, engine,
versions, start time, schema version, the capture secret of
:func:`capture_secret`, and the path of the server's local socket,
:func:`socket_path`, when it listens there) into the private runtime directory
(:func:`tpu_info.contract.discovery_record.runtime_dir`): the directory is created with mode
0700 and refused when it is a symlink, owned by another user, or group/world
writable; the file is created 0600 under a temporary name and renamed into
place, so a reader never sees half a record. The record (and the socket
file beside it) is removed at exit:
``publish`` registers an ``atexit`` handler and, when called from the main
thread, a SIGTERM handler (see :func:`publish` for how it chains). A forked
child neither removes its parent's record nor writes one unless it publishes
its own (:mod:`metrics.recording.forksafe`).

Nothing here raises into the program: any failure is one logged warning and
``publish`` returns ``None``.

Example:
    >>> from metrics.export import discovery
    >>> path = discovery.publish(8431, "localhost", "jax", {"jax": "0.10.2"})  # doctest: +SKIP
    >>> discovery.unpublish()                                                  # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import signal
import stat
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from metrics.export import at_exec
from metrics.recording import forksafe, whoami
from tpu_info.contract import discovery_record as _record
from tpu_info.contract.discovery_record import process_start_unix
from tpu_info.contract.safe import os_text

log = logging.getLogger("metrics.export.discovery")

_lock = threading.Lock()
_published: tuple[Path, int] | None = None  # (path, pid that wrote it)
_local: tuple[Path, int] | None = None  # (the local socket's path, pid it is for)
# What the last publish wrote (directory, name, bytes, pid): an exec that
# fails after its record was removed writes it back.
_written: tuple[Path, str, bytes, int] | None = None
_at_exec_registered = False
_atexit_registered = False
_secret: tuple[int, str] | None = None  # (pid it was made for, the secret)
_secret_lock = threading.Lock()
_sigterm_installed = False
# The record's command line: the first arguments within this many characters
# as JSON (each argument cut to MAX_ARG_CHARS), the rest counted in
# ``argv_truncated``: with the other fields' bounds, the record stays well
# within what readers accept (MAX_RECORD_BYTES) whatever the command line.
MAX_ARGV_CHARS = 4096
MAX_ARG_CHARS = 1024
# sun_path holds 108 bytes with its NUL: a longer path gets no local socket.
_MAX_SOCKET_PATH = 107


def ensure_private_dir(path: Path) -> int:
    """Creates ``path`` (mode 0700) if needed and opens it.

    Returns:
        A file descriptor of the directory (the caller closes it).

    Raises:
        OSError: it cannot be created or opened, or it is not private (a
            symlink, another user's, or group/world writable).
    """
    if not path.parent.exists():
        os.makedirs(path.parent, mode=0o755, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    else:
        os.chmod(path, 0o700)  # whatever the umask did
    reason = _record.unsafe_directory_reason(os.lstat(path))
    if reason:
        raise OSError(f"{path} {reason}")
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW
    fd = os.open(path, flags)
    try:  # the same checks on what we opened, in case it was swapped
        reason = _record.unsafe_directory_reason(os.fstat(fd))
        if reason:
            raise OSError(f"{path} {reason}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_atomically(dir_fd: int, name: str, payload: bytes) -> None:
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
    try:
        try:
            os.fchmod(fd, 0o600)
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def socket_path(runtime_dir: str | os.PathLike[str] | None = None) -> str | None:
    """Where this process's gRPC server listens for its own user:
    ``<pid>.sock`` in the private runtime directory (created if needed), or
    ``None`` when the directory is not private or the path is too long for a
    Unix socket (then clients use TCP alone). Never raises."""
    directory = Path(runtime_dir) if runtime_dir is not None else _record.runtime_dir()
    path = str(directory.absolute() / f"{os.getpid()}.sock")
    if len(path.encode()) > _MAX_SOCKET_PATH:
        log.info("tpu-info: no local socket: %s is longer than a Unix socket path may be", path)
        return None
    try:
        os.close(ensure_private_dir(directory))
    except Exception as e:  # noqa: BLE001 - TCP still serves everyone
        log.info("tpu-info: no local socket in %s: %s", directory, e)
        return None
    global _local
    with _lock:
        _local = (Path(path), os.getpid())  # removed at exit, record or not
    _register_cleanup(sigterm=False)
    return path


def _socket_beside(record_path: Path) -> Path:
    return record_path.with_suffix(".sock")


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


def process_start_time() -> float:
    """This process's start time, Unix seconds (now, if it cannot be read)."""
    try:
        return process_start_unix(os.getpid())  # psutil's number, without importing it
    except Exception:  # noqa: BLE001 - psutil missing or /proc unreadable
        return time.time()


def capture_secret() -> str:
    """This process's capture secret: 256 random bits, made on first use.

    It is written only into the 0600 discovery record, so only the owner (and
    root) can read it; the server grants ``Capture`` to callers who send it
    (:mod:`metrics.export.owner`). A forked child gets a secret of its own.
    """
    global _secret
    with _secret_lock:
        if _secret is None or _secret[0] != os.getpid():
            _secret = (os.getpid(), secrets.token_urlsafe(32))
        return _secret[1]


def record(
    port: int,
    host: str,
    engine: str,
    versions: Mapping[str, str],
    *,
    pid: int | None = None,
    argv: Sequence[str] | None = None,
    start_time: float | None = None,
    waiting: Sequence[str] = (),
    socket: str = "",
    no_tcp: tuple[str, str] = ("", ""),
    failed: str = "",
) -> dict[str, Any]:
    """The JSON-ready record ``publish`` writes (``waiting``: engines the hook
    waits for, hooked once the program imports them; ``socket``: the path of
    the server's local socket, "" for none; ``no_tcp``: why it serves on that
    socket alone and the OS's words, see
    :data:`tpu_info.contract.discovery_record.NO_TCP_REASONS`; ``failed``:
    why its server did not start)."""
    extra: dict[str, Any] = {}
    args, cut = bounded_argv(whoami.argv() if argv is None else [os_text(str(a)) for a in argv])
    if cut:
        extra["argv_truncated"] = cut
    if no_tcp[0]:
        extra.update(no_tcp=no_tcp[0], no_tcp_detail=_one_line(no_tcp[1]))
    if failed:
        extra["failed"] = _one_line(failed)
    return {
        "schema": _record.SCHEMA_VERSION,
        "pid": os.getpid() if pid is None else pid,
        "port": int(port),
        "host": os_text(host),
        "argv": args,
        "engine": engine,
        "waiting": [os_text(str(e))[:64] for e in list(waiting)[:16]],
        "versions": {os_text(str(k))[:64]: os_text(str(v))[:128]
                     for k, v in list(versions.items())[:32]},
        "start_time": process_start_time() if start_time is None else float(start_time),
        "capture_secret": capture_secret(),
        "socket": socket,
        **extra,
    }


def bounded_argv(argv: Sequence[str]) -> tuple[list[str], int]:
    """The command line as the record keeps it, and how many arguments it
    leaves out: each argument at most :data:`MAX_ARG_CHARS` characters (a
    longer one cut, ending in ``…``), then the first ones within
    :data:`MAX_ARGV_CHARS` in all as JSON writes them (argv[0] always). A job given thousands of
    shard paths keeps a record readers accept (``MAX_RECORD_BYTES``); the
    whole argv is in the process record of its snapshots."""
    kept: list[str] = []
    total = 0
    for arg in argv:
        if len(arg) > MAX_ARG_CHARS:
            arg = arg[:MAX_ARG_CHARS - 1] + "…"
        total += len(json.dumps(arg)) + 3  # escaped as the record writes it; comma, indent
        if kept and total > MAX_ARGV_CHARS:
            break
        kept.append(arg)
    return kept, len(argv) - len(kept)


def _one_line(text: str, limit: int = 500) -> str:
    """``text`` as the record keeps it: printable, one line, at most ``limit`` characters."""
    return "".join(c if c.isprintable() else " " for c in text)[:limit]


def publish(
    port: int,
    host: str,
    engine: str,
    versions: Mapping[str, str],
    runtime_dir: str | os.PathLike[str] | None = None,
    *,
    start_time: float | None = None,
    argv: Sequence[str] | None = None,
    register_cleanup: bool = True,
    sigterm: bool = True,
    waiting: Sequence[str] = (),
    no_tcp: tuple[str, str] = ("", ""),
    failed: str = "",
) -> Path | None:
    """Writes (or rewrites) this process's discovery record.

    Args:
        port: the port of the gRPC server.
        host: the host a client on this machine dials (e.g. ``127.0.0.1``).
        engine: the installed engine names, comma separated.
        versions: engine and Python versions.
        waiting: engines not imported yet that the hook waits for.
        no_tcp: why the server listens on its local socket alone (port 0),
            and the OS's words; ``("", "")`` when it serves TCP too.
        failed: why the server did not start (port 0, no socket), for ``doctor``.
        runtime_dir: the directory (default :func:`tpu_info.contract.discovery_record.runtime_dir`).
        start_time: the process's start time, Unix seconds (default: read
            from the OS; readers use it to tell a reused pid).
        argv: the command line (default ``sys.argv``).
        register_cleanup: remove the record at exit and on SIGTERM. The
            SIGTERM handler is installed only from the main thread and only
            when the program has not chosen to ignore SIGTERM. If the program
            had its own handler, ours calls it and lets it decide (the record
            goes at exit, through ``atexit``); otherwise ours removes the
            record and the process dies by SIGTERM, as it would without the
            hook (status -15 to its parent; no ``atexit`` work runs).
        sigterm: with ``register_cleanup``, also install that SIGTERM
            handler. ``False`` when the serving helper removes the record
            once the process is gone: a Python handler runs only when the
            main thread next runs Python code, so the process would outlive
            the signal by as long as the engine's call it was in.

    The record names ``<pid>.sock`` beside it (:func:`socket_path`) when a
    socket is there: this process's server listens on it.

    Returns:
        The record's path, or ``None`` (with one logged warning) when it
        could not be written.
    """
    global _published
    directory = Path(runtime_dir) if runtime_dir is not None else _record.runtime_dir()
    pid = os.getpid()
    name = f"{pid}.json"
    sock = _socket_beside(directory.absolute() / name)
    try:
        payload = json.dumps(
            record(port, host, engine, versions, pid=pid, argv=argv, start_time=start_time,
                   waiting=waiting, socket=str(sock) if _is_socket(sock) and not failed else "",
                   no_tcp=no_tcp, failed=failed),
            indent=1,
        ).encode("utf-8")
        dir_fd = ensure_private_dir(directory)
        try:
            _write_atomically(dir_fd, name, payload)
        finally:
            os.close(dir_fd)
    except Exception as e:  # noqa: BLE001 - discovery never breaks the program
        log.warning("tpu-info: not publishing a discovery record in %s: %s "
                    "(set TPU_INFO_RUNTIME_DIR to a private directory)", directory, e)
        return None
    path = directory / name
    global _written
    with _lock:
        _published = (path, pid)
        _written = (directory, name, payload, pid)
    if register_cleanup:
        _register_cleanup(sigterm)
    return path


def publish_failure(error: str, engine: str, versions: Mapping[str, str]) -> Path | None:
    """Writes a record saying this process is hooked but its server did not
    start (``error``), so ``tpu-info doctor`` can tell; removed at exit like
    any record (a SIGTERM leaves it to readers, which remove a dead pid's
    record). Never raises."""
    try:
        return publish(0, "", engine, versions, sigterm=False, failed=error)
    except Exception:  # noqa: BLE001 - the server's failure is reported anyway
        return None


def published() -> Path | None:
    """The record this process wrote and has not removed, if any."""
    with _lock:
        return _published[0] if _published and _published[1] == os.getpid() else None


def unpublish() -> None:
    """Removes this process's record and its local socket's file (idempotent;
    never raises; the server may go on serving connections it accepted).

    A forked child that inherited the state leaves its parent's record alone.
    """
    global _published, _local
    with _lock:
        entry, _published = _published, None
        local, _local = _local, None
    mine = os.getpid()
    socks = [_socket_beside(entry[0])] if entry is not None and entry[1] == mine else []
    if local is not None and local[1] == mine and local[0] not in socks:
        socks.append(local[0])  # a socket whose record was never written (a full disk)
    if entry is not None and entry[1] == mine:
        try:
            entry[0].unlink()
        except FileNotFoundError:
            pass
        except Exception as e:  # noqa: BLE001
            log.warning("tpu-info: could not remove discovery record %s: %s", entry[0], e)
    for sock in socks:
        if not _is_socket(sock):
            continue
        try:
            sock.unlink()
        except OSError:
            pass


def _before_exec() -> None:
    """The process becomes another program (no atexit): its record and
    socket go now; kept aside to write back if the exec fails."""
    unpublish()


def _exec_failed() -> None:
    global _published
    written = _written
    if written is None or written[3] != os.getpid():
        return
    directory, name, payload, pid = written
    try:
        dir_fd = ensure_private_dir(directory)
        try:
            _write_atomically(dir_fd, name, payload)
        finally:
            os.close(dir_fd)
        with _lock:
            _published = (directory / name, pid)
    except Exception as e:  # noqa: BLE001
        log.warning("tpu-info: could not write the discovery record back: %s", e)


def _register_cleanup(sigterm: bool = True) -> None:
    global _atexit_registered, _sigterm_installed, _at_exec_registered
    with _lock:
        if not _atexit_registered:
            atexit.register(unpublish)
            _atexit_registered = True
        first_exec, _at_exec_registered = not _at_exec_registered, True
    if first_exec:
        at_exec.register(_before_exec, _exec_failed)
    with _lock:
        if (not sigterm or _sigterm_installed
                or threading.current_thread() is not threading.main_thread()):
            return
        _sigterm_installed = True
    try:
        previous = signal.getsignal(signal.SIGTERM)
        if previous is signal.SIG_IGN:
            return  # the program ignores SIGTERM; atexit still cleans up
        signal.signal(signal.SIGTERM, _make_sigterm_handler(previous))
    except Exception as e:  # noqa: BLE001
        log.warning("tpu-info: no SIGTERM cleanup of the discovery record: %s", e)


def _make_sigterm_handler(previous: Any) -> Any:
    owner = os.getpid()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != owner:  # a forked child: as if we were not here
            forksafe.act_as(previous, signum, frame)
            return
        if callable(previous):
            # The program handles SIGTERM itself (say, checkpoint then exit):
            # it stays discoverable meanwhile, and atexit removes the record.
            previous(signum, frame)
            return
        # The record goes first (one unlink), then the program dies by the
        # signal as it would without us: no SystemExit unwinding the program,
        # no atexit work of its libraries, none of a grace period spent.
        unpublish()
        forksafe.act_as(previous, signum, frame)

    setattr(on_sigterm, forksafe.PREVIOUS, previous)
    return on_sigterm


def _forget_in_child() -> None:
    """A forked child has no record of its own yet (the parent's is not
    its to remove), and may install its own SIGTERM cleanup when it publishes."""
    global _lock, _published, _local, _sigterm_installed, _at_exec_registered
    _lock = threading.Lock()  # another thread of the parent may have held it
    if _published is not None:  # the parent's local socket: only the parent serves it
        forksafe.close_unix_sockets_at(str(_socket_beside(_published[0])))
    elif _local is not None:
        forksafe.close_unix_sockets_at(str(_local[0]))
    _published = _local = None
    _sigterm_installed = _at_exec_registered = False


forksafe.in_child(_forget_in_child)
