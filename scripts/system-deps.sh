#!/usr/bin/env bash
# Debian packages that the standing emulated cluster needs (python -m ddlbench.netem cluster up;
# ddlbench/netem/standing.py): an OpenSSH server and client, iproute2, util-linux (unshare,
# nsenter), and for `cluster up --slurm` Slurm (slurmctld, slurmd, slurm-client) and MUNGE.
#
#   scripts/system-deps.sh [--optional]      (make cluster-deps; make test runs it --optional)
#
# Installs what is missing with apt-get, on Debian, as root; never starts the system's own ssh
# service (a policy-rc.d denies it while installing, unless the machine has one already).
# Prints one line saying what it did. Where it cannot install for one of three reasons (not
# root, not Debian, the package registry unreachable: apt's words for a network failure in its
# log, APT_NETWORK_ERROR below) it says why and exits 2; with --optional it exits 0 instead
# (the cluster's tests then skip, naming what is missing). Any other apt-get failure (no such
# package, a held lock, a broken dpkg) is an error, exit 1, --optional or not.
set -uo pipefail
optional=0
case "${1:-}" in
    --optional) optional=1 ;;
    "") ;;
    *) echo "usage: scripts/system-deps.sh [--optional]" >&2; exit 2 ;;
esac
say() { echo "system-deps: $*" >&2; }
give_up() {
    say "$* (the standing emulated cluster's tests will skip)"
    [ "$optional" = 1 ] && exit 0
    exit 2
}
fail() { say "error: $*"; exit 1; }
# What apt prints when the network fails it (resolving, connecting, a route, a timeout).
APT_NETWORK_ERROR='Temporary failure resolving|Could not resolve|Could not connect|Unable to connect|Failed to connect|Connection failed|Connection timed out|Network is unreachable|No route to host|Connection refused'

need=()
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null || need+=(openssh-client)
command -v ssh-keygen >/dev/null || need+=(openssh-client)
{ command -v ip >/dev/null || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ]; } || need+=(iproute2)
{ command -v unshare >/dev/null && command -v nsenter >/dev/null; } || need+=(util-linux)
[ -x /usr/sbin/slurmctld ] || need+=(slurmctld)
[ -x /usr/sbin/slurmd ] || need+=(slurmd)
command -v srun >/dev/null || need+=(slurm-client)
[ -x /usr/sbin/munged ] || need+=(munge)
# the real-BytePS lane's build (byteps/legacy_env.sh): ps-lite against the system's ZeroMQ
[ -f /usr/include/zmq.h ] || need+=(libzmq3-dev)
[ -f /usr/include/numa.h ] || need+=(libnuma-dev)
if [ "${#need[@]}" = 0 ]; then
    say "sshd, ssh, iproute2, unshare, Slurm, MUNGE, ZeroMQ and libnuma are installed"
    exit 0
fi
mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
[ "$(id -u)" = 0 ] || give_up "not root: cannot install ${need[*]}"
[ -f /etc/debian_version ] && command -v apt-get >/dev/null \
    || give_up "not a Debian machine: install ${need[*]} yourself"

created_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
    # Installing openssh-server (or munge, slurmd) would start the machine's own services
    # (sshd on port 22 ...): deny them.
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    created_policy=1
fi
cleanup() { [ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d; }
trap cleanup EXIT

log="$(mktemp /tmp/ddlbench-system-deps.XXXXXX.log)"
install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" \
        >>"$log" 2>&1
}
say "installing ${need[*]} (apt-get; log $log)"
if ! install; then
    # A fresh machine may have no package lists yet.
    if ! { DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$log" 2>&1 && install; }; then
        why="$(grep -m1 -E "$APT_NETWORK_ERROR" "$log")" &&
            give_up "the package registry cannot be reached: apt-get could not install" \
                    "${need[*]} (${why:0:300}; log $log)"
        fail "apt-get could not install ${need[*]}: $(grep -E '^(E|W):' "$log" | tail -1)" \
             "(log $log)"
    fi
fi
for f in /usr/sbin/sshd /usr/sbin/slurmd /usr/sbin/munged; do
    [ -x "$f" ] || fail "apt-get ran but $f is missing (log $log)"
done
say "installed ${need[*]}"
