"""A job process for pinning tests (no torch): writes where it runs to $AFFINITY_OUT.RANK.json:
its Cpus_allowed_list (/proc/self/status), os.sched_getaffinity and the spawner's plan."""
import json
import os


def main() -> None:
    with open("/proc/self/status") as f:
        allowed = next(line.split(":", 1)[1].strip() for line in f
                       if line.startswith("Cpus_allowed_list:"))
    rank = os.environ.get("RANK", "0")
    out = {"rank": int(rank), "cpus_allowed_list": allowed,
           "affinity": sorted(os.sched_getaffinity(0)),
           "plan": json.loads(os.environ.get("DDLBENCH_PLACEMENT") or "null"),
           "netns": os.readlink("/proc/self/ns/net")}
    with open(f"{os.environ['AFFINITY_OUT']}.{rank}.json", "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
