#!/usr/bin/env bash
# Stands in for ssh in the tests: "fake_ssh.sh [-o X] HOST COMMAND" runs COMMAND here, so the
# parameter-server launcher's remote path (DMLC_* variables, per-host start, pkill on stop)
# is exercised on one machine with hosts named 127.0.0.2, 127.0.0.3, ...
while [ "${1:-}" = "-o" ]; do shift 2; done
host="$1"; shift
echo "$host" >> "${FAKE_SSH_LOG:-/dev/null}"
exec bash -c "$*"
