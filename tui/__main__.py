"""``python -m tui``: the dashboard's own entry point.

``tpu-info --watch`` hands the terminal over to this program (it execs it),
so ``tpu_info`` never imports ``tui``.

    python -m tui --target localhost:8431 --rate 0.5
    python -m tui --user alice --pid 4242,4243   # the Processes panel filtered at first
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
    p.add_argument("--user", action="append", default=[], type=_user_arg, metavar="USER",
                   help="show only these users' processes at first (names or uids: "
                        "alice,bob; repeatable)")
    p.add_argument("--pid", action="append", default=[], type=_pid_arg, metavar="PID",
                   help="show only these processes at first (4242,4243; repeatable)")
    try:
        args = p.parse_args(argv)
    except UsageError as e:
        print(f"tpu-info --watch: {e}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as e:  # --help
        return int(e.code or 0)
    from tui.app import run
    from tui.procs import ProcessFilter

    flt = ProcessFilter.of([u for us in args.user for u in us], [p for ps in args.pid for p in ps])

    if args.from_file:
        from tpu_info.wire.runfile import RunFileError, read
        from tui.replay import ReplaySource

        try:
            saved = read(args.from_file)
        except RunFileError as e:
            print(f"tpu-info --watch: {e}", file=sys.stderr)
            return 1
        return run([], args.rate, discover=False, source=ReplaySource(
            args.from_file, saved.snapshot, saved.how_it_ended(), saved.ended_unix),
            process_filter=flt)
    return run(args.target, args.rate, discover=not args.no_discovery, timeout=args.timeout,
               all_chips=args.all_chips, process_filter=flt)


def _pid_arg(text: str) -> list[int]:
    """``--pid 4242,4243``: process ids, comma-separated (as ``tpu-info --pid``)."""
    from tpu_info.commands.cli import UsageError
    from tui.procs import pid_value

    try:
        return [pid_value(part.strip()) for part in text.split(",")]
    except ValueError:
        raise UsageError(f"--pid must be process ids (positive integers, 4242,4243), got "
                         f"{text!r}") from None


def _user_arg(text: str) -> list[str]:
    """``--user alice,bob``: user names or uids, comma-separated."""
    from tpu_info.commands.cli import UsageError

    names = [part.strip() for part in text.split(",")]
    if any(not n or not n.isprintable() or any(c.isspace() for c in n) for n in names):
        raise UsageError(f"--user takes user names or uids (alice,bob), got {text!r}")
    return names


if __name__ == "__main__":
    sys.exit(main())
