#!/usr/bin/env bash
# The environment of real DeepSpeed (scripts/deepspeed_probe.py; docs/DESIGN.md section 10).
#
#   scripts/deepspeed_env.sh build [--optional]   build it (reused while its inputs are unchanged)
#   scripts/deepspeed_env.sh python               print its Python, or say why there is none
#   scripts/deepspeed_env.sh remove               delete it (and every older build of it)
#   scripts/deepspeed_env.sh where                print the directory it lives in
#
# DeepSpeed 0.19.8 runs on the suite's torch 2.14.1, but pins packages of its own (pydantic 2
# and others), so it is not installed into the suite's venv: scripts/requirements-deepspeed.txt
# (DeepSpeed and what the venv lacks) is installed beside it as scripts/target_env_lib.sh says
# (where, the key, the exit codes, --optional). No op is compiled: DeepSpeed builds its ops with
# ninja when first used, and training on the CPU uses none (scripts/deepspeed_probe.py skips the
# shared-memory op, which only inference_all_reduce uses).
name=deepspeed-env
reqs="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/requirements-deepspeed.txt"
script="${BASH_SOURCE[0]}"
# shellcheck source=target_env_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/target_env_lib.sh"

cmd_build() {
    target_env_build "export DS_ACCELERATOR=cpu" '
import deepspeed, pydantic, torch
from deepspeed.accelerator import get_accelerator
a = get_accelerator()
print("deepspeed", deepspeed.__version__, "torch", torch.__version__, "pydantic",
      pydantic.VERSION, "accelerator", a.device_name(), "backend", a.communication_backend_name())
assert a.communication_backend_name() == "gloo", a.communication_backend_name()' \
        "deepspeed does not import with its CPU accelerator on Gloo" "$@"
}

cmd_python() { legacy_python "$env_dir/bin/python" "make deepspeed-env" DeepSpeed; }

legacy_main "build [--optional], python, remove, where" "$@"
