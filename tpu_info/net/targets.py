"""``HOST:PORT`` targets: checked with a message that says what is wrong,
read from a file, and normalized so two spellings of one place match.

A host is an IPv4 address, an IPv6 address in brackets (``[::1]``, with an
optional ``%zone``), or a DNS name whose labels are 1..63 characters (253 in
all) of letters, digits, ``-`` and ``_``; an internationalized name is
returned in its ASCII (IDNA) form, which is what a resolver looks up.

A hooked process served on its local socket alone (no TCP on its host) is
the target ``unix:/path/<pid>.sock``, grpc's own spelling (a bare
``unix:<pid>.sock`` names it in the runtime directory); only this user's
sockets in a private directory are dialled (:mod:`tpu_info.net.local_socket`).
:func:`label` is how a target is shown in a table's Address column.

Example:
    >>> validate_target("[::1]:8431"), normalize("127.0.0.1:8431")
    ('[::1]:8431', 'localhost:8431')
    >>> validate_target("bücher.example:80")
    'xn--bcher-kva.example:80'
    >>> label("unix:/run/user/1000/tpu-info/4242.sock")
    'unix:4242.sock'
"""

from __future__ import annotations

import errno
import ipaddress
import os
import select
import stat
import string
import time

# This host's loopback by name; addresses are judged by ``ipaddress``.
_LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})
MAX_TARGETS_FILE_BYTES = 1 << 20
MAX_TARGETS = 4096
_MAX_DNS_NAME = 253
_DNS_CHARS = frozenset(string.ascii_letters + string.digits + "-_.")


UNIX = "unix:"
# sun_path holds 108 bytes with its NUL.
MAX_SOCKET_PATH_BYTES = 107


def is_unix(target: str) -> bool:
    """Whether ``target`` names a local socket (``unix:PATH``)."""
    return target.strip().startswith(UNIX)


def label(target: str) -> str:
    """``target`` as a table shows it: a local socket by its file name
    (``unix:4242.sock``; the whole path is in ``--json``), others as they are."""
    if is_unix(target):
        return UNIX + target.strip()[len(UNIX):].rstrip("/").rpartition("/")[2]
    return target


def normalize(target: str) -> str:
    """``127.0.0.1:8431``, ``[::1]:8431`` and ``localhost:8431`` name one place
    (any loopback host, :func:`is_loopback_host`, becomes ``localhost``)."""
    host, _, port = target.rpartition(":")
    return f"localhost:{port}" if is_loopback_host(host) else target


def shown(text: str) -> str:
    """``text`` as it may appear in a one-line message: characters a terminal
    would act on (escapes, NUL, newlines, C1 controls) written as ``\\xNN``."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def read_targets_file(path: str, timeout: float | None = None) -> list[str]:
    """``host:port`` per line; ``#`` comments and blank lines are skipped.

    A regular file is read at once; a pipe, a FIFO (``--targets-file
    <(cmd)``) or a character device until its end, for at most ``timeout``
    seconds (None: no limit), so a FIFO nobody writes to never blocks.
    At most :data:`MAX_TARGETS_FILE_BYTES` + 1 bytes are read from any of them.

    Raises:
        ValueError: unreadable, binary or oversized file (more than
            :data:`MAX_TARGETS_FILE_BYTES` or :data:`MAX_TARGETS` targets), a
            pipe or device whose end did not come within ``timeout``, or a
            line that is not ``host:port``.
    """
    name = shown(path)
    try:
        raw = _read_bounded(path, MAX_TARGETS_FILE_BYTES + 1, timeout)
    except TimeoutError:
        raise ValueError(f"targets file {name} is not a regular file and its end did not "
                         f"come within {timeout:.3g}s (a FIFO nobody writes to?); give a "
                         "file of HOST:PORT lines") from None
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        raise ValueError(f"cannot read targets file {name}: "
                         f"{getattr(e, 'strerror', None) or e}") from e
    if len(raw) > MAX_TARGETS_FILE_BYTES:
        raise ValueError(f"targets file {name} is larger than "
                         f"{MAX_TARGETS_FILE_BYTES // 1024} KiB; expected HOST:PORT lines")
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(f"cannot read targets file {name}: not UTF-8 text "
                         f"(byte {e.start})") from e
    out = []
    for n, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            out.append(validate_target(text))
        except ValueError as e:
            raise ValueError(f"{name}:{n}: {e}") from e
        if len(out) > MAX_TARGETS:
            raise ValueError(f"targets file {name} names more than {MAX_TARGETS} targets")
    return out


def _read_bounded(path: str, limit: int, timeout: float | None) -> bytes:
    """At most ``limit`` bytes of ``path``; a pipe or device is read until its
    end within ``timeout`` (TimeoutError), a directory or socket refused."""
    # Opening a FIFO without O_NONBLOCK waits for a writer, however long.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "it is a directory")
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
            raise OSError(errno.EINVAL, "it is not a regular file, a pipe or a character device")
        if stat.S_ISREG(mode):
            os.set_blocking(fd, True)
            with os.fdopen(fd, "rb", closefd=False) as f:
                return f.read(limit)
        end = None if timeout is None else time.monotonic() + timeout
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        chunks: list[bytes] = []
        have = 0
        while have < limit:
            # Poll first: a FIFO that never had a writer reads as its end.
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError
            if not poller.poll(None if left is None else max(1, int(left * 1000))):
                continue  # the loop's deadline check ends it
            try:
                chunk = os.read(fd, min(limit - have, 1 << 16))
            except BlockingIOError:
                continue
            if not chunk:
                break  # the end: the writer closed it
            chunks.append(chunk)
            have += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _check_dns_name(host: str, target: str) -> str:
    """The ASCII form of DNS name ``host``; ValueError when it cannot be one."""
    try:
        ascii_host = host.encode("idna").decode("ascii")
        # Nameprep maps some characters to dots ('\u2024' -> '.'): the ASCII
        # form must be a name too, as getaddrinfo encodes it again.
        ascii_host.encode("idna")
    except UnicodeError:
        raise ValueError(f"target {shown(target)}: host is not a valid DNS name (labels of "
                         "1..63 characters, separated by dots)") from None
    bad = sorted(set(ascii_host) - _DNS_CHARS)
    if bad:
        raise ValueError(f"target {shown(target)}: host has {shown(''.join(bad))!r}; "
                         "expected letters, digits, '-', '_' and '.'")
    if len(ascii_host.rstrip(".")) > _MAX_DNS_NAME:
        raise ValueError(f"target {shown(target)}: host is longer than {_MAX_DNS_NAME} "
                         "characters")
    return ascii_host


def validate_target(target: str) -> str:
    """Checks ``host:port`` / ``[v6]:port`` and returns it (a DNS name in ASCII).

    Raises:
        ValueError: with what is wrong and what is expected.
    """
    t = target.strip()
    if not t:
        raise ValueError("empty target; expected HOST:PORT, e.g. localhost:8431")
    if is_unix(t):
        return _validate_unix(t, target)
    if not t.isprintable() or any(c.isspace() for c in t):
        raise ValueError(f"target {shown(target)} is not HOST:PORT (it has spaces or "
                         "control characters)")
    if t.startswith("[") and t.endswith("]"):
        raise ValueError(f"target {target!r} has no port; expected [IPv6]:PORT")
    host, sep, port = t.rpartition(":")
    if not sep:
        raise ValueError(f"target {target!r} has no port; expected HOST:PORT, e.g. {t}:8431")
    if t.startswith("[") != host.endswith("]") or host.count("[") > 1 \
            or host.count("]") > 1:
        raise ValueError(f"target {target!r} has unbalanced brackets; expected [IPv6]:PORT")
    if not host.strip("[]"):
        raise ValueError(f"target {target!r} has no host; expected HOST:PORT")
    if any(c in host for c in "/?#@"):
        raise ValueError(f"target {target!r} is not HOST:PORT")
    if ":" in host.strip("[]") and not host.startswith("["):
        raise ValueError(f"target {target!r}: write IPv6 addresses as [ADDR]:PORT")
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ValueError(f"target {target!r} has port {port!r}; expected 1..65535")
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"target {target!r}: {host} is not an IPv6 address") from None
        return f"{host}:{int(port)}" if port != str(int(port)) else t
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        host = _check_dns_name(host, target)
    return f"{host}:{int(port)}"


def _validate_unix(t: str, target: str) -> str:
    """``unix:PATH``: a path a Unix socket can have (whose socket it is, is
    checked when it is dialled)."""
    path = t[len(UNIX):].removeprefix("//")  # unix:///abs is unix:/abs
    if not path or not path.isprintable():
        raise ValueError(f"target {shown(target)}: expected unix:PATH, the socket of a "
                         "hooked process (tpu-info lists them)")
    if len(path.encode()) > MAX_SOCKET_PATH_BYTES:
        raise ValueError(f"target {shown(target)}: a socket path is at most "
                         f"{MAX_SOCKET_PATH_BYTES} bytes")
    return UNIX + path


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets)
    is this host's loopback: ``localhost``, ``127.0.0.0/8``, ``::1`` or
    IPv4-mapped loopback."""
    host = host.strip().strip("[]").lower()
    if host in _LOOPBACK_NAMES:
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return addr.is_loopback or bool(mapped is not None and mapped.is_loopback)
