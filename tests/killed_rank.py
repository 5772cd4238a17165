"""A stand-in job for the local spawner's naming (tests/test_hostile_cases.py): the last rank
(a parameter server when the job has servers) kills itself with SIGKILL; the others wait."""
import os
import signal
import time

if __name__ == "__main__":
    if int(os.environ["RANK"]) == int(os.environ["WORLD_SIZE"]) - 1:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
