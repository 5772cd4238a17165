"""One of real BytePS's own processes for the real-BytePS lane: its scheduler or a server, as
``DMLC_ROLE`` says (``python -m ddlbench.launch.bpsserver --job-id ID``, started by
``ddlbench.launch.pslaunch --engine byteps``).

It runs ``import byteps.server`` (which serves until the workers leave) in the environment
``make byteps-env`` builds; what it adds is the suite's: the job id on its command line (so
``byteps/stop.sh`` finds it), and the watch on the launcher (a killed launcher takes it along,
over ssh too).
"""
from __future__ import annotations

import sys

from ..errors import ArgumentParser
from ..hosts.procs import watch_parent


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m ddlbench.launch.bpsserver")
    p.add_argument("--job-id", required=True)
    p.parse_args(argv)
    watch_parent()
    import importlib
    importlib.import_module("byteps.server")  # serves on import, returns when the job is done
    return 0


if __name__ == "__main__":
    sys.exit(main())
