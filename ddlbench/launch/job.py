"""The entry every job-level command shares (training script, comm_bench, profiler): parse,
check, then spawn local workers or join the launcher's job; bad input is one line and exit 2."""
from __future__ import annotations

import os
import sys
import time

from ..errors import EXIT_USAGE, PSError, UsageError, say
from ..hosts.pinning import NO_PIN_FLAG
from ..hosts.placement import detect, launcher_rank, single
from ..hosts.procs import watch_parent
from .local import check_capacity, spawn_local

# How long a rank other than 0 waits before leaving on bad input (see run_job).
LINGER_S = 10.0


def run_job(argv, module: str, parse_args, check, worker,
            check_under_launcher: bool = True) -> int:
    """The entry of every job-level command (training script, comm_bench, profiler).

    Parses ``argv``; with no launcher around, checks the input and spawns ``--nworkers`` local
    copies of ``python -m MODULE`` (or runs in this process for one worker); under a launcher,
    checks that ``--nworkers`` agrees with it and runs ``worker(args, placement)``. Bad input is
    one line on stderr (from rank 0 only) and exit code 2.

    ``--no-pin`` is every job command's (taken out of ``argv`` before ``parse_args``): the
    local spawner then does not pin its processes to cores (``ddlbench.hosts.pinning``).
    """
    given, pin = list(argv), NO_PIN_FLAG not in argv
    argv = [a for a in argv if a != NO_PIN_FLAG]
    try:
        args = parse_args(argv)
        if hasattr(args, "no_pin"):  # a parser that lists it (--help), for the record
            args.no_pin = not pin
        placement = detect()
        nservers = getattr(args, "nservers", 0) or 0  # parameter servers: extra processes
        if placement is None:
            check(args)
            nworkers = args.nworkers or 1
            if nworkers > 1 or nservers > 0:
                check_capacity(nworkers + nservers)
                # The children learn the server count resolved here (a default, perhaps).
                child_argv = [*given, "--nservers", str(nservers)] if nservers else given
                return spawn_local(nworkers + nservers, child_argv, module=module,
                                   net=getattr(args, "net", None),
                                   slots=getattr(args, "slots", None), nservers=nservers,
                                   pin=pin)
            placement = single()
        else:
            watch_parent()  # a spawner or launcher killed outright takes this process along
            if args.nworkers is not None and args.nworkers + nservers != placement.world_size:
                raise UsageError(f"--nworkers {args.nworkers}" +
                                 (f" and --nservers {nservers}" if nservers else "") +
                                 f", but the {placement.launcher} launcher started "
                                 f"{placement.world_size} processes")
            if placement.launcher != "local" and check_under_launcher:
                check(args)
        return worker(args, placement)
    except UsageError as e:
        # Every rank meets the same bad input; one line is enough.
        rank = launcher_rank()
        if rank == "0":
            print(f"ddlbench: error: {e}", file=sys.stderr, flush=True)
        elif os.environ.get("DDLBENCH_LAUNCHER") != "local":
            # Another launcher (torchrun, mpirun) stops every process as soon as one exits with
            # an error: the other ranks linger so that rank 0, perhaps slower to get here, says
            # why. (This suite's local spawner waits for rank 0's line itself and names the
            # first worker to exit, so a lingering rank there would add a second line.)
            time.sleep(LINGER_S)
        return EXIT_USAGE
    except PSError as e:
        # A parameter server died or cannot be reached: each worker says which, and leaves at
        # once (its communication threads may still be blocked on the dead peer).
        rank = launcher_rank()
        say(f"ddlbench: worker {rank}: error: {e}")
        os._exit(1)
    except RuntimeError as e:
        # A peer of the job died (killed, crashed): the collective that lost it fails here. Its
        # death is the news, which the spawner or launcher reports; this worker says what it
        # met in one line instead of a traceback, and leaves.
        why = _lost_peer(e)
        if why is None:
            raise
        say(f"ddlbench: worker {launcher_rank()}: error: a peer of the job is gone ({why}); "
            f"leaving")
        os._exit(1)


# How a transport reports a peer that went away (Gloo's TCP pairs; sockets).
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def _lost_peer(e: BaseException) -> str | None:
    """The line saying that ``e`` is a lost peer, or None when it is something else."""
    text = str(e)
    for marker in _PEER_GONE:
        if marker in text:
            where = text[text.index(marker):].split(". ")[0].splitlines()[0]
            return where.strip()
    return None
