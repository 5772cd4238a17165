"""The spawner's side: an emulated cluster up and probed for a run, and the record's ``net``."""
from __future__ import annotations

import json
import os

from ..errors import UsageError
from .cluster import Cluster, _stderr
from .probe import probe_best, probe_line
from .profiles import resolve
from .units import format_rate


def start(nhosts: int, spec: str, log=None) -> Cluster | None:
    """For the local spawner: None for loopback, else a cluster that is up and probed (the
    probe's result printed, and a warning when it is more than 10% off). The caller runs
    ``down()`` when its processes are gone."""
    profile = resolve(spec)
    if profile.loopback:
        return None
    log = log or _stderr
    cluster = Cluster(nhosts, profile)
    cluster.up(log=log)
    try:
        log(cluster.summary())
        if nhosts >= 2:
            seconds = float(os.environ.get("DDLBENCH_NET_PROBE_S", "1.0"))
            if seconds > 0:
                cluster.probe = probe_best(cluster, seconds)
                log(probe_line(cluster))
                if not cluster.probe["within_tolerance"]:
                    wire = format_rate(cluster.probe["wire_rate_bps"])
                    log(f"warning: the probe's {wire} on the wire is "
                        f"{abs(cluster.probe['deviation']) * 100:.0f}% off the profile's "
                        f"{format_rate(profile.rate_bps)} (a busy or slow machine?); the run "
                        f"goes on, and its record says so")
    except BaseException:
        cluster.down()
        raise
    return cluster


def run_info(spec: str | None) -> dict:
    """The record's ``net`` entry: what the spawner measured (passed in DDLBENCH_NET_INFO),
    else what the profile says (loopback, or one process with nothing to emulate)."""
    raw = os.environ.get("DDLBENCH_NET_INFO")
    if raw:
        try:
            return json.loads(raw)
        except ValueError:
            pass
    try:
        info = resolve(spec).describe()
    except UsageError as e:
        return {"profile": spec, "error": str(e)}
    if info["emulated"]:
        info["emulated"] = False
        info["note"] = "one process: nothing to emulate"
    info["probe"] = None
    return info
