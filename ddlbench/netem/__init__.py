"""The emulated network of ``--net``: namespaced hosts on this machine (overview: cluster.py)."""
from .cluster import MAX_HOSTS, Cluster
from .links import (ETC_NETNS, NS_PREFIX, NetemError, _remove_namespaces, _which,
                    list_namespaces, require, unavailable_reason)
from .probe import probe_stream
from .profiles import Profile, check, resolve
from .spawner import run_info, start
from .state import cleanup_stale, state_dir

__all__ = ["MAX_HOSTS", "Cluster", "ETC_NETNS", "NS_PREFIX", "NetemError", "_remove_namespaces",
           "_which", "list_namespaces", "require", "unavailable_reason", "probe_stream",
           "Profile", "check", "resolve", "run_info", "start", "cleanup_stale", "state_dir"]
