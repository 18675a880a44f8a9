"""Text from the network, made safe before anything else sees it.

Every string a target sends passes :func:`clean` when it is decoded
(:mod:`tpu_info.wire.codec`, :mod:`tpu_info.wire.libtpu`, gRPC status details in
:mod:`tpu_info.net.client`), and renderers pass what they print through it again
with a shorter limit: control characters (ESC and with it OSC titles, OSC 52
clipboard writes and CSI sequences; BEL; the C1 range U+0080-U+009F), format
characters (bidi overrides and isolates, zero-width ones) and line or
paragraph separators become U+FFFD, so no remote string can drive a terminal.

Example:
    >>> clean("a\\x1b]0;title\\x07b\\u202ec", 40)
    'a\\ufffd]0;title\\ufffdb\\ufffdc'
"""

from __future__ import annotations

import unicodedata

MAX_TEXT = 240  # longest remote string a table shows; the rest is cut with an ellipsis
MAX_WIRE_TEXT = 4096  # longest remote string a client keeps at all

# Categories that never print as themselves: controls, format characters
# (bidi, zero-width), surrogates, private use, unassigned, line/paragraph breaks.
_UNSAFE = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))


def clean(text: object, limit: int = MAX_TEXT) -> str:
    """A remote string made safe to print: control and format characters
    (escape sequences, bidi overrides included) become U+FFFD, a tab a space,
    and anything past ``limit`` characters is cut with an ellipsis.

    >>> clean("a\\x1b[31mb", 10)
    'a\\ufffd[31mb'
    """
    s = text if type(text) is str else str(text)
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    if s.isprintable():  # the common case, in C: no control, format or separator character
        return s
    return "".join(" " if c == "\t" else "\ufffd" if unicodedata.category(c) in _UNSAFE
                   else c for c in s)


def _escape_surrogate(c: str) -> str:
    code = ord(c)
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def os_text(text: str) -> str:
    """Text the OS gave (an argument, a path, a user or host name) as valid
    UTF-8, whatever its bytes: Python decodes them with ``surrogateescape``,
    so a byte that is not UTF-8 (a Latin-1 file name's ``\\xe9``) arrives as
    a lone surrogate, which protobuf, JSON output and HTML cannot carry. Each
    such byte becomes the four characters ``\\xe9`` (as
    ``bytes.decode("utf-8", "backslashreplace")`` writes it), any other lone
    surrogate ``\\udXXX``; valid text comes back as it is (the same object).
    The one rule for the OS's text wherever tpu-info reads it (the hook's
    argv, user and host, the records readers parse).

    >>> os_text("/data/caf\\udce9.txt")
    '/data/caf\\\\xe9.txt'
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return "".join(_escape_surrogate(c) if "\ud800" <= c <= "\udfff" else c for c in text)
