#!/usr/bin/env bash
# The environment of real torchft (the lane `--engine torchft`; docs/DESIGN.md section 10).
#
#   scripts/torchft_env.sh build [--optional]   build it (reused while its inputs are unchanged)
#   scripts/torchft_env.sh python               print its Python, or say why there is none
#   scripts/torchft_env.sh remove               delete it (and every older build of it)
#   scripts/torchft_env.sh where                print the directory it lives in
#
# torchft 0.2.0 (a manylinux wheel with its Rust lighthouse and manager compiled in) runs on the
# suite's torch 2.14.1; it is not installed into the suite's venv: scripts/requirements-torchft.txt
# (torchft and the OpenTelemetry and protobuf packages it imports) is installed beside it as
# scripts/target_env_lib.sh says (where, the key, the exit codes, --optional).
name=torchft-env
reqs="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/requirements-torchft.txt"
script="${BASH_SOURCE[0]}"
# shellcheck source=target_env_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/target_env_lib.sh"

cmd_build() {
    # the check: torchft imports on this torch, and its Rust lighthouse starts and stops
    target_env_build "" '
import torch, torchft
from importlib.metadata import version
from torchft.coordination import LighthouseServer
from torchft.local_sgd import DiLoCo
lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1)
address = lighthouse.address()
lighthouse.shutdown()
print("torchft", version("torchft"), "torch", torch.__version__, "lighthouse", address)' \
        "torchft does not import or start its lighthouse" "$@"
}

cmd_python() { legacy_python "$env_dir/bin/python" "make torchft-env" torchft; }

legacy_main "build [--optional], python, remove, where" "$@"
