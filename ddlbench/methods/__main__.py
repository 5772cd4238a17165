"""``python -m ddlbench.methods``: the registry from the command line (the shell launchers ask it).

    python -m ddlbench.methods table              # the README's method table
    python -m ddlbench.methods compressors        # the compressors and what each sends
    python -m ddlbench.methods defaults fusion    # option=default, one per line
    threshold=0 python -m ddlbench.methods args fusion [--skip nservers] [--architecture a2a]
                                                  # the training script's flags, one per line
"""
from __future__ import annotations

import sys

from ..errors import EXIT_USAGE, ArgumentParser, UsageError
from . import A2A, PS, architecture, defaults, launcher_args, registry, table


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m ddlbench.methods",
                       description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("table", help="the method table (Markdown)")
    sub.add_parser("compressors", help="the compressors, their options and what they send")
    d = sub.add_parser("defaults", help="a method's options and their defaults")
    d.add_argument("method")
    n = sub.add_parser("names", help="the method ids, one line (of one architecture: "
                                     "--architecture a2a|ps)")
    n.add_argument("--architecture", choices=(A2A, PS), default=None)
    a = sub.add_parser("args", help="the training script's flags for a method, from the "
                                    "launcher variables named after its options")
    a.add_argument("method")
    a.add_argument("--skip", action="append", default=[], metavar="OPTION",
                   help="leave this option out (the launcher passes it itself)")
    a.add_argument("--architecture", choices=(A2A, PS), default=None,
                   help="refuse a method of the other architecture (a launcher of one kind)")
    args = p.parse_args(argv)
    try:
        if args.command == "table":
            print(table())
        elif args.command == "compressors":
            import compression
            print(compression.table())
        elif args.command == "names":
            print(" ".join(names_of(args.architecture) if args.architecture
                           else list(registry())))
        elif args.command == "defaults":
            for spec in defaults(args.method):
                print(f"{spec.name}={'' if spec.default is None else spec.format(spec.default)}")
        else:
            if args.architecture and architecture(args.method) != args.architecture:
                kind = {A2A: "all-to-all", PS: "parameter-server"}[args.architecture]
                raise UsageError(f"method {args.method} is not a {kind} method; this launcher "
                                 f"runs {', '.join(names_of(args.architecture))}")
            for word in launcher_args(args.method, skip=tuple(args.skip)):
                print(word)
    except UsageError as e:
        print(f"ddlbench: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def names_of(arch: str) -> list[str]:
    return [n for n, cls in registry().items() if cls.architecture == arch]


if __name__ == "__main__":
    sys.exit(main())
