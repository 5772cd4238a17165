"""A job process for the rendezvous test: joins the store as every worker does
(``ddlbench.runtime._store``); rank 0 sets a key, every rank reads it, and rank 0 leaves only
after all have (its store goes with it). Writes what it saw to $STORE_OUT.RANK.json."""
import datetime
import json
import os
import time

from ddlbench.hosts.placement import detect
from ddlbench.runtime import _store


def main() -> None:
    p = detect()
    store = _store(p, datetime.timedelta(seconds=60))
    if p.rank == 0:
        store.set("hello", f"from rank 0, pid {os.getpid()}")
    store.wait(["hello"])
    got = store.get("hello").decode()
    store.add("read", 1)
    while p.rank == 0 and store.add("read", 0) < p.world_size:
        time.sleep(0.01)
    out = {"rank": p.rank, "got": got, "store_fd": p.store_fd, "owner": p.store_owner,
           "port": p.master_port}
    with open(f"{os.environ['STORE_OUT']}.{p.rank}.json", "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
