"""Sweeps: network x task x method x engine x nworkers from a YAML file, each try its own
process group, every finished try one line in a results store, reports made from the store.

A sweep file (configs/quick.yaml, configs/emulated.yaml and configs/paper.yaml are
examples) maps these keys, each shown with its default, or with an example where its
comment gives the default (generated from the declarations of ddlbench/sweep/config.py,
class Sweep: ``config.describe()``; tests/test_sweep_keys.py holds the two equal)::

    name: quick                # letters, digits, '_', '.', '-', at most 229 (default: the file's
                               #   name)
    extends: model-check       # another sweep file (a preset or a path) whose keys this file's
                               #   replace, each whole (name is never inherited)
    networks: [local]          # local / loopback / {net: 5gbit}: the local launcher (python -m
                               #   ddlbench.train --nworkers N [--net PROFILE])
                               # rdma0 / {rdma: 1}: a real cluster through the shell launchers
                               #   (horovod/horovod_mpi_cj.sh, bytescheduler/..., byteps/...)
                               # {rdma: 0, hostfile: F}: the same on the hosts of F (may contain
                               #   {nworkers}; a standing emulated cluster's host file)
                               # {net: 1gbit, optional: true}: left out, with a note, where this
                               #   machine cannot emulate (not root, no iproute2)
                               # label: a network's name in tables
    tasks:                     # required; each a mapping of model, batch_size, image_size,
                               #   sentence_len, num_classes and args (training-script flags);
                               #   model and batch_size required
      - {model: resnet18, batch_size: 16, image_size: 32}
    methods:                   # required; each a method id (docs/DESIGN.md section 2) or a mapping
                               #   of method (the id), its settings (its options and its
                               #   compressor's, named as python -m ddlbench.train --help names
                               #   them, - as _; compressor), label, args (training-script flags)
                               #   and optional (true: left out, with a note, where it cannot load)
      - wfbp
      - {method: fusion, threshold: 67108864}
    nworkers: [1]              # workers of each cell
    skip: ["nworkers=1,network!=local"]  # --only expressions: the cells they match are left out
                               #   (here: 1 worker on the local network only; default: none)
    engines: [torch]           # torch, horovod, byteps, deepspeed or torchft
    tries: 5                   # runs of each cell, at most 1000 (a sweep: at most 10000 cells,
                               #   100000 runs)
    min_ok: 3                  # fewer successful tries: the cell is marked (default: half the
                               #   tries, rounded up)
    aggregate: mean            # mean, median or olympic
    timing: {warmup: 2, batches_per_iter: 5, iters: 3}  # the training script's
                               #   --num-warmup-batches, --num-batches-per-iter and --num-iters (a
                               #   key not given: its default)
    threads: 1                 # CPU threads per worker in every run and profile (default: the
                               #   cores it is pinned to, so 1 worker on 2 cores gets 2)
    timeout: 1800              # seconds per run; then the whole process group is killed
    kill_grace: 15             # seconds between SIGTERM and SIGKILL of a timed-out run (at most
                               #   600)
    hostfile: configs/cluster{nworkers}  # rdma networks: the host file of each worker count
    extra_args: ""             # passed through to the training script
    env: {OMP_NUM_THREADS: 1}  # variables for every run; inherited suite settings (DDLBENCH_*,
                               #   DMLC_*, BYTESCHEDULER_*, BYTEPS_*, HOROVOD_*) are dropped, the
                               #   rest that matters (OMP_*, NCCL_*, GLOO_*) recorded and hashed;
                               #   LD_PRELOAD and LD_AUDIT are refused
    results: results           # results/<date>-<name>/ (the store and the reports)
    logs: logs                 # logs/<date>-<name>/<cell>_try<N>.log
    estimate_s: 60             # --dry-run's guess for a run with no history in the store
    timeline: false            # true: keep each try's Chrome trace beside its record
                               #   (records/<cell>_try<N>.trace.json); N: its first N steps
    predict:                   # benchmarks.py --predict-only: what the model predicts the cells
                               #   from (ddlbench/sweep/predicted.py)
                               # networks: network -> topology or comm_bench files (rdma: the
                               #   survey's)
                               # profiles: model -> profile (default: the shipped one)
                               # device_throughput: survey or {model: samples/s}: one worker's
                               #   compute rescaled
                               # codec: codec_bench --output (the codec's time per element)
      networks: {rdma0: survey-10gbe}
      device_throughput: survey
    calibrate: false           # true: profiler and comm_bench first (local networks), then every
                               #   cell predicted beside its measurement
    extrapolate: false         # true (with calibrate): calibrate each task and network at the
                               #   sweep's smallest worker count above one only, and predict the
                               #   larger counts from it (the measured ring's steps at more
                               #   workers, the compute slowed by the workers sharing the cores):
                               #   the model's extrapolation, tested
    pace: false                # true (with calibrate): a short profiler run before each job and
                               #   each try predicted again at the machine's pace then
    calibration_check: 0.2     # with calibrate (default 0.2; false: none): after the tries, each
                               #   network's all-reduce (1-16 MiB) and each profile's compute timed
                               #   again; a probe off the calibration by more than this fraction is
                               #   reported, its job run again and its cells predicted again
    seed: 12345                # the tries run round-robin (try 0 of every cell, then try 1, ...),
                               #   each round shuffled by this seed; default: the one the store
                               #   recorded, else one chosen when the store starts
    shared_jobs: false         # true: a round's all-to-all tries of one task, network and worker
                               #   count run as one job (--method a,b,...), each method its own
                               #   replica, warm-up and record; the start-up is paid once per job
    adaptive:                  # more rounds of tries for the cells whose 95% interval is too wide
                               #   (default: none)
                               # target: the widest interval left alone, its half-width as a
                               #   fraction of the median (0.03: +-3%)
                               # max_tries: a cell's tries at most (more than tries)
      target: 0.03
      max_tries: 5

Reports give, beside the original's mean +- std table, each cell's median and 95% interval
(a bootstrap over 3 or more tries, else over the timing rounds), ties between methods and the
noise floor at 1 worker (docs/DESIGN.md section 15).
"""
from .config import (MODEL_NAMES, RDMA_LABELS, Cell, Network, Sweep, cell_hash, load,
                     method_label, presets, resolve_config, train_args)
from .runner import command, parse_total_line
from .store import append, latest, read

__all__ = ["MODEL_NAMES", "RDMA_LABELS", "Cell", "Network", "Sweep", "append",
           "cell_hash", "command", "latest", "load", "method_label", "parse_total_line",
           "presets", "read", "resolve_config", "train_args"]
