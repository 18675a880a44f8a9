"""``python -m tui``: the dashboard's own entry point.

``tpu-info --watch`` hands the terminal over to this program (it execs it),
so ``tpu_info`` never imports ``tui``.

    python -m tui --target localhost:8431 --rate 0.5
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tpu-info --watch",
                                description="Live dashboard of accelerators and XLA programs.")
    p.add_argument("--target", action="append", default=[], metavar="HOST:PORT")
    p.add_argument("--rate", type=float, default=1.0, metavar="S")
    p.add_argument("--timeout", type=float, default=3.0, metavar="S")
    p.add_argument("--no-discovery", action="store_true")
    args = p.parse_args(argv)
    from tui.app import run

    return run(args.target, args.rate, discover=not args.no_discovery, timeout=args.timeout)


if __name__ == "__main__":
    sys.exit(main())
