"""``python -m ddlbench.netem ...``: the command line of ``cli.py`` (helpers included)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
