"""``tpu-info report --html FILE``: the snapshot as one self-contained HTML page.

The page is :func:`tpu_info.outputs.html.report_html` of the snapshot; the
file is written whole or not at all (a temporary file beside it, renamed
into place: :func:`tpu_info.commands.files.write_all`), so a full disk never
leaves a cut page where an older one was. A file that cannot be written is
one line on stderr and exit code 1.

Example:
    >>> import tempfile, pathlib
    >>> from tpu_info.contract.model import Snapshot
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "r.html"
    >>> write_report(str(out), "h:1", Snapshot(0.0), print)  # doctest: +ELLIPSIS
    wrote ... KB): open it in a browser; it loads nothing from the network
    0
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpu_info.contract.model import Snapshot

EXIT_OK = 0
EXIT_WRITE = 1  # as `tpu-info profile` when its file cannot be written


def write_report(path: str, target: str, snapshot: Snapshot,
                 say: Callable[[object], None]) -> int:
    """Writes the page of ``snapshot`` (read from ``target``) to ``path``;
    returns the exit code. ``say`` prints one error line."""
    from pathlib import Path

    from tpu_info.commands.files import write_all
    from tpu_info.outputs.html import report_html

    out = Path(path)
    data = report_html(snapshot, target).encode("utf-8")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_all([(out, data)])
    except OSError as e:
        say(f"cannot write the report to {path}: {e.strerror or e} (nothing written; free "
            "space or choose another --html FILE)")
        return EXIT_WRITE
    print(f"wrote {path} ({len(data) / 1024:.0f} KB): open it in a browser; it loads nothing "
          "from the network")
    return EXIT_OK
