"""``tpu-info`` command line: ``main(argv) -> int`` parses and dispatches.

Exit codes: 0 all good; 1 some targets failed; 2 usage error.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from tpu_info import __version__

EXIT_OK = 0
EXIT_PARTIAL = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # One line that says what to do, no usage dump, exit code 2.
        sys.stderr.write(f"tpu-info: {message} (see 'tpu-info --help')\n")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tpu-info", description="See what your accelerators and the "
                "XLA programs on them are doing.")
    p.add_argument("-v", "--version", action="store_true", help="print the version and exit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Parses ``argv`` and runs the command; returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if args.version:
        print(f"tpu-info {__version__}")
        return EXIT_OK
    print("tpu-info: the device table is not built yet; inside a program use "
          "metrics.metrics_report()", file=sys.stderr)
    return EXIT_OK


def run() -> None:
    """Console-script entry point."""
    raise SystemExit(main())


if __name__ == "__main__":
    run()
