"""Test-only: the training script with a random delay in every method's gradient-ready hooks.

``python -m tests.jittered_train ARGS`` (what ``conftest.train`` runs when a test passes
``DDLBENCH_TEST_HOOK_JITTER_MS=J``) is ``python -m ddlbench.train ARGS`` where every hook a
method registers sleeps a random 0..J ms first, differently on each rank, to shake out
schedules whose order of collectives depends on timing. The suite itself knows nothing of it.
"""
import os
import random
import sys
import time

from ddlbench.methods.base import Method

JITTER_ENV = "DDLBENCH_TEST_HOOK_JITTER_MS"


def install(ms: float) -> None:
    """Wrap every method's ready hooks with a per-rank random sleep of up to ``ms``."""
    register = Method._register_ready_hooks

    def jittered(self, callback):
        rng = random.Random(1000 + self.comm.rank)

        def delayed(i):
            time.sleep(rng.uniform(0, ms) / 1000.0)
            callback(i)
        register(self, delayed)

    Method._register_ready_hooks = jittered


def main() -> int:
    from ddlbench import train
    from ddlbench.launch.job import run_job
    install(float(os.environ[JITTER_ENV]))
    return run_job(sys.argv[1:], "tests.jittered_train", train.parse_args, train.check,
                   train.worker)


if __name__ == "__main__":
    from ddlbench.errors import finish
    sys.exit(finish(main()))
