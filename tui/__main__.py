"""``python -m tui``: the dashboard's own entry point.

``tpu-info --watch`` hands the terminal over to this program (it execs it),
so ``tpu_info`` never imports ``tui``.

    python -m tui --target localhost:8431 --rate 0.5
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Parses ``argv`` (checked as ``tpu-info`` checks them) and runs the dashboard."""
    from tpu_info.commands.cli import EXIT_USAGE, Parser, UsageError, seconds_arg, target_arg

    p = Parser(prog="tpu-info --watch",
               description="Live dashboard of accelerators and XLA programs.")
    p.add_argument("--target", action="append", default=[], type=target_arg,
                   metavar="HOST:PORT")
    p.add_argument("--rate", type=seconds_arg("--rate", 0.1), default=1.0, metavar="S")
    p.add_argument("--timeout", type=seconds_arg("--timeout"), default=3.0, metavar="S")
    p.add_argument("--no-discovery", action="store_true")
    p.add_argument("--from", dest="from_file", metavar="FILE")
    p.add_argument("--all", dest="all_chips", action="store_true")
    try:
        args = p.parse_args(argv)
    except UsageError as e:
        print(f"tpu-info --watch: {e}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as e:  # --help
        return int(e.code or 0)
    from tui.app import run

    if args.from_file:
        from tpu_info.wire.runfile import RunFileError, read
        from tui.replay import ReplaySource

        try:
            saved = read(args.from_file)
        except RunFileError as e:
            print(f"tpu-info --watch: {e}", file=sys.stderr)
            return 1
        return run([], args.rate, discover=False, source=ReplaySource(
            args.from_file, saved.snapshot, saved.how_it_ended(), saved.ended_unix))
    return run(args.target, args.rate, discover=not args.no_discovery, timeout=args.timeout,
               all_chips=args.all_chips)


if __name__ == "__main__":
    sys.exit(main())
