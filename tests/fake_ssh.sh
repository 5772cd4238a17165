#!/usr/bin/env bash
# Stands in for ssh in the tests: "fake_ssh.sh [-o X] HOST COMMAND" runs COMMAND here, so the
# parameter-server launcher's remote path (DMLC_* variables, per-host start, pkill on stop)
# is exercised on one machine with hosts named 127.0.0.2, 127.0.0.3, ...
while [ "${1:-}" = "-o" ]; do shift 2; done
host="$1"; shift
# One line per call: the host and the role it starts, if any (DMLC_ROLE=worker/server).
role="$(grep -o 'DMLC_ROLE=[a-z]*' <<< "$*" | head -n 1 || true)"
echo "$host${role:+ $role}" >> "${FAKE_SSH_LOG:-/dev/null}"
exec bash -c "$*"
