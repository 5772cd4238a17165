"""``python -m ddlbench.methods``: the registry from the command line (the shell launchers ask it).

    python -m ddlbench.methods table              # the README's method table
    python -m ddlbench.methods compressors        # the compressors and what each sends
    python -m ddlbench.methods defaults fusion    # option=default, one per line
    threshold=0 python -m ddlbench.methods args fusion [--skip nservers]
                                                  # the training script's flags, one per line
"""
from __future__ import annotations

import argparse
import sys

from ..errors import EXIT_USAGE, UsageError
from . import defaults, launcher_args, table


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddlbench.methods",
                                description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("table", help="the method table (Markdown)")
    sub.add_parser("compressors", help="the compressors, their options and what they send")
    d = sub.add_parser("defaults", help="a method's options and their defaults")
    d.add_argument("method")
    a = sub.add_parser("args", help="the training script's flags for a method, from the "
                                    "launcher variables named after its options")
    a.add_argument("method")
    a.add_argument("--skip", action="append", default=[], metavar="OPTION",
                   help="leave this option out (the launcher passes it itself)")
    args = p.parse_args(argv)
    try:
        if args.command == "table":
            print(table())
        elif args.command == "compressors":
            import compression
            print(compression.table())
        elif args.command == "defaults":
            for spec in defaults(args.method):
                print(f"{spec.name}={'' if spec.default is None else spec.format(spec.default)}")
        else:
            for word in launcher_args(args.method, skip=tuple(args.skip)):
                print(word)
    except UsageError as e:
        print(f"ddlbench: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return 0


if __name__ == "__main__":
    sys.exit(main())
