"""Sweeps: network x task x method x engine x nworkers from a YAML file, each try its own
process group, every finished try one line in a results store, reports made from the store.

A sweep file (see configs/quick.yaml, configs/emulated.yaml, configs/paper.yaml)::

    name: quick
    extends: model-check       # optional: another sweep file (preset or path) whose keys this
                               #   file's replace, each whole (name is never inherited)
    networks: [local]          # local / loopback / {net: 5gbit}: the local launcher
                               #   (python -m ddlbench.train --nworkers N [--net PROFILE]);
                               # rdma0 / {rdma: 1}: a real cluster through the shell launchers
                               #   (horovod/horovod_mpi_cj.sh, bytescheduler/..., byteps/...)
                               # {rdma: 0, hostfile: F}: the same on the hosts of F (may
                               #   contain {nworkers}; a standing emulated cluster's host file)
                               # {net: 1gbit, optional: true}: left out, with a note, where
                               #   this machine cannot emulate (not root, no iproute2)
    tasks:                     # model, batch_size, image_size, sentence_len, num_classes, args
      - {model: resnet18, batch_size: 16, image_size: 32}
    methods:                   # ids of docs/DESIGN.md section 2, or {method: ID, setting: value}
      - wfbp                   #   settings: threshold, bucket_cap_mb, compressor, density,
      - {method: fusion, threshold: 67108864}  # partition, credit, nservers, partition_bytes,
                               #   powersgd_rank, powersgd_dense_steps, mgwfbp_min_group,
                               #   mgwfbp_profile; label, args, optional (skip if unavailable)
    nworkers: [1, 2, 4]
    skip: ["nworkers=1,network!=local"]  # --only expressions: the cells they match are left
                               #   out (here: 1 worker on the local network only)
    engines: [torch]           # torch, horovod
    tries: 5                   # runs of each cell
    min_ok: 3                  # fewer successful tries: the cell is marked (default tries/2)
    aggregate: mean            # mean, median or olympic
    timing: {warmup: 2, batches_per_iter: 5, iters: 3}
    threads: 1                 # CPU threads per worker in every run and profile (default: the
                               #   cores it is pinned to, so 1 worker on 2 cores gets 2)
    timeout: 600               # seconds per run; then the whole process group is killed
    kill_grace: 15             # seconds between SIGTERM and SIGKILL of a timed-out run
    hostfile: configs/cluster{nworkers}   # rdma networks: host file of each worker count
    extra_args: ""             # passed through to the training script
    env: {OMP_NUM_THREADS: 1}  # variables for every run; inherited suite settings (DDLBENCH_*,
                               #   DMLC_*, BYTESCHEDULER_*, HOROVOD_*) are dropped, the rest
                               #   that matters (OMP_*, NCCL_*, GLOO_*) recorded and hashed
    results: results           # results/<date>-<name>/ (the store and the reports)
    logs: logs                 # logs/<date>-<name>/<cell>_try<N>.log
    estimate_s: 60             # --dry-run's guess for a run with no history in the store
    timeline: false            # true: keep each try's Chrome trace beside its record
                               #   (records/<cell>_try<N>.trace.json); N: its first N steps
    predict:                   # benchmarks.py --predict-only: what the model predicts from
      networks: {rdma0: survey-10gbe}    # network -> topology / comm_bench files (rdma: survey)
      profiles: {resnet50: configs/profiles/h200_resnet50_bs64.json}  # default: shipped
      device_throughput: survey          # or {model: samples/s}: rescale one worker's compute
    calibrate: false           # true: profiler and comm_bench first (local networks), then
                               #   every cell predicted beside its measurement
    pace: false                # true (with calibrate): a short profiler run before each job
                               #   and each try predicted again at the machine's pace then
    calibration_check: 0.2     # with calibrate: after the tries, each network's all-reduce
                               #   (1-16 MiB) and each profile's compute timed again; a probe
                               #   more than 20% off the calibration is reported, its job
                               #   run again and its cells predicted again (false: none)
    seed: 12345                # the tries run round-robin (try 0 of every cell, then try 1,
                               #   ...), each round shuffled by this seed; default: the one
                               #   the store recorded, else chosen when the store starts
    shared_jobs: false         # true: a round's all-to-all tries of one task, network and
                               #   worker count run as one job (--method a,b,...), each
                               #   method its own replica, warm-up and record; the start-up
                               #   is paid once per job
    adaptive:                  # then more rounds for the cells whose 95% interval is wider
      target: 0.03             #   than +-3% of their median, up to max_tries tries each
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
