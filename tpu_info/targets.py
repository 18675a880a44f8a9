"""``HOST:PORT`` targets: checked with a message that says what is wrong,
read from a file, and normalized so two spellings of one place match.

Example:
    >>> validate_target("[::1]:8431"), normalize("127.0.0.1:8431")
    ('[::1]:8431', 'localhost:8431')
"""

from __future__ import annotations

_LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]"}


def normalize(target: str) -> str:
    """``127.0.0.1:8431`` and ``localhost:8431`` name one place."""
    host, _, port = target.rpartition(":")
    return f"localhost:{port}" if host in _LOOPBACK else target




def read_targets_file(path: str) -> list[str]:
    """``host:port`` per line; ``#`` comments and blank lines are skipped.

    Raises:
        ValueError: unreadable file or a line that is not ``host:port``.
    """
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read targets file {path}: {e}") from e
    out = []
    for n, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            validate_target(text)
        except ValueError as e:
            raise ValueError(f"{path}:{n}: {e}") from e
        out.append(text)
    return out


def validate_target(target: str) -> str:
    """Checks ``host:port`` / ``[v6]:port`` and returns it.

    Raises:
        ValueError: with what is wrong and what is expected.
    """
    t = target.strip()
    if not t:
        raise ValueError("empty target; expected HOST:PORT, e.g. localhost:8431")
    host, sep, port = t.rpartition(":")
    if not sep:
        raise ValueError(f"target {target!r} has no port; expected HOST:PORT, e.g. {t}:8431")
    if t.startswith("[") != host.endswith("]") or host.count("[") > 1:
        raise ValueError(f"target {target!r} has unbalanced brackets; expected [IPv6]:PORT")
    if not host.strip("[]"):
        raise ValueError(f"target {target!r} has no host; expected HOST:PORT")
    if any(c.isspace() for c in t) or any(c in host for c in "/?#@"):
        raise ValueError(f"target {target!r} is not HOST:PORT")
    if ":" in host.strip("[]") and not host.startswith("["):
        raise ValueError(f"target {target!r}: write IPv6 addresses as [ADDR]:PORT")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"target {target!r} has port {port!r}; expected 1..65535")
    return t
