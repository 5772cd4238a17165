"""The original suite's commands (HKBU-HPML/ddl-benchmarks, benchmarks.py's gen_cmd at its last
commit) run here unchanged and mean the experiment the original ran: the training script's
method and settings, read from what each launcher would run (dry run)."""
import json
import shlex
import sys

import pytest

from .conftest import REPO, describe, run

# gen_cmd's folder and variables per method (rdma, dnn, bs, nworkers as it sweeps them; the
# PS launcher's debug=0 becomes debug=1 here: print, do not run), and what the original's
# scripts then ran, in this suite's terms: method, flags (thresholds in bytes: the original
# counted elements, x4 for fp32).
A2A = "compressor={c} threshold={t} mgwfbp={m} ./horovod_mpi_cj.sh"
PS = "debug=1 compressor=none threshold={t} mgwfbp=1 bytescheduler={b} ./launch.sh"
ORIGINAL = [
    ("bspa2a", "mgwfbp", A2A.format(c="none", t=536870912, m=0), "bspa2a", {}),
    ("wfbp", "mgwfbp", A2A.format(c="none", t=0, m=0), "wfbp", {}),
    ("mgwfbp", "mgwfbp", A2A.format(c="none", t=0, m=1), "mgwfbp",
     {"--mgwfbp-min-group": "8192", "--mgwfbp-ab": "table"}),  # its alpha-beta tables
    ("bytescheduler", "bytescheduler", A2A.format(c="none", t=0, m=1), "bytescheduler",
     {"--partition": "4000000", "--credit": "16000000"}),
    ("horovod", "horovod", A2A.format(c="none", t=0, m=1), "fusion",
     {"--threshold": "67108864"}),  # Horovod's default, threshold= ignored as the original
    # (nservers = nworkers/4 = 1 as its launch.sh computed; at 4 GPUs, one machine, the
    # launcher then starts none: test_the_original_ps_runs_are_the_original_algorithm)
    ("bspps", "byteps", PS.format(t=536870912, b=0), "bspps",
     {"--threshold": str(536870912 * 4), "--nservers": "1"}),
    ("wfbpps", "byteps", PS.format(t=0, b=0), "wfbpps", {"--threshold": "0", "--nservers": "1"}),
    ("byteschedulerps", "byteps", PS.format(t=0, b=1), "byteschedulerps",
     {"--threshold": "0", "--nservers": "1"}),  # the WFBP-PS script, servers scheduling
    # the compressed runs of its a2a folder: density 0.001, 67108864 elements = 256 MiB
    ("eftopk", "mgwfbp", A2A.format(c="eftopk", t=536870912, m=0), "fusion",
     {"--compressor": "eftopk", "--density": "0.001", "--threshold": "268435456"}),
    ("signum", "mgwfbp", A2A.format(c="signum", t=536870912, m=0), "fusion",
     {"--compressor": "signavg", "--threshold": "268435456"}),  # its signSGD averaged signs
]


# What the original's gen_cmd ran for its PS methods (benchmarks.py: bspps threshold=536870912,
# byteschedulerps bytescheduler=1, else 0 and 0), per worker count: at 4 GPUs its launch.sh set
# DMLC_NUM_WORKER = nworkers/4 = 1 and BytePS with one worker machine runs no server (a local
# reduce and broadcast); at 8, two worker machines and nworkers/4 = 2 servers, which sum in
# arrival order unless BYTEPS_SERVER_ENABLE_SCHEDULE=1 (bytescheduler=1: priority). Its workers
# ran one script: pushes from the gradient hooks, each tensor alone (threshold 0) or everything
# fused and pushed once the backward is done (536870912 elements = 2147483648 bytes of fp32).
GEN_CMD_PS = {"bspps": (536870912, 0), "wfbpps": (0, 0), "byteschedulerps": (0, 1)}
ORIGINAL_PS_ALGORITHM = {
    ("bspps", 4): ("after_backward", None, 0, 2147483648),
    ("bspps", 8): ("after_backward", "arrival", 2, 2147483648),
    ("wfbpps", 4): ("from_hooks", None, 0, 0),
    ("wfbpps", 8): ("from_hooks", "arrival", 2, 0),
    ("byteschedulerps", 4): ("from_hooks", None, 0, 0),
    ("byteschedulerps", 8): ("from_hooks", "priority", 2, 0),
}


@pytest.mark.parametrize("method,nworkers", sorted(ORIGINAL_PS_ALGORITHM))
def test_the_original_ps_runs_are_the_original_algorithm(tmp_path, monkeypatch, method,
                                                         nworkers):
    """gen_cmd's command for (method, nworkers), word for word (debug=1: printed), then what
    the PS launcher makes of it (its servers: none on one machine; the variables of worker 0)
    and the training script's flags under them: the algorithm the record carries
    (``method.algorithm``, the method's own ``algorithm()``, which its describe() writes) is
    what the original ran. 8 workers: two 'remote' hosts of 4 slots (nothing is started)."""
    from ddlbench import flags, methods
    from ddlbench.hosts import hostfile
    from ddlbench.launch import pslaunch
    from ddlbench.run_config import RunConfig
    threshold, bytescheduler = GEN_CMD_PS[method]
    hosts = f"{REPO}/configs/cluster4"
    if nworkers == 8:
        hosts = tmp_path / "hosts"
        hosts.write_text("127.0.0.2 slots=4\n127.0.0.3 slots=4\n")
    line = PS.format(t=threshold, b=bytescheduler)
    cmd = f"cd byteps; rdma=0 dnn=resnet50 bs=64 nworkers={nworkers} {line}"
    proc = run(["bash", "-c", cmd], timeout=120, hostfile=str(hosts))
    assert proc.returncode == 0, describe(proc)
    words = shlex.split(proc.stdout.strip().splitlines()[-1])
    launch = pslaunch.parse_args(words[words.index("ddlbench.launch.pslaunch") + 1:])
    listed = hostfile.parse(launch.hostfile)
    nservers = pslaunch.servers_of(launch, listed)
    argv = list(launch.train_args)
    if all(pslaunch.is_local(h.name) for h in listed):   # the local spawner, on this machine
        argv += ["--nworkers", str(nworkers)] + (["--nservers", str(nservers)] if nservers
                                                 else [])
    else:
        workers, servers, _ = pslaunch.placement(listed, nworkers, nservers)
        common, roles = pslaunch.dmlc_roles(workers, servers, nworkers, workers[0], "1")
        for k, v in {**common, **roles[0][1]}.items():
            monkeypatch.setenv(k, v)
    args = flags.parse_args(argv)
    flags.check(args)
    config = RunConfig.of(args)
    assert config.method == method
    algorithm = methods.lookup(method).algorithm(config.options[method], config.job.nservers)
    assert algorithm == dict(zip(("worker_schedule", "server_schedule", "servers",
                                  "threshold_bytes"), ORIGINAL_PS_ALGORITHM[method, nworkers]))


def test_byteps_force_distributed_starts_servers_on_one_machine():
    """BytePS's own switch, BYTEPS_FORCE_DISTRIBUTED=1, is the launcher's ps_force_servers=1:
    a one-machine PS job (the original's 4 GPUs) then pushes through a server; 0 or unset,
    none (the local reduce and broadcast, as BytePS); anything else is one line."""
    cmd = f"cd byteps; rdma=0 dnn=resnet50 bs=64 nworkers=4 {PS.format(t=0, b=0)}"
    words = {}
    for value in ("1", "0", None):
        extra = {} if value is None else {"BYTEPS_FORCE_DISTRIBUTED": value}
        proc = run(["bash", "-c", cmd], timeout=120, hostfile=f"{REPO}/configs/cluster4",
                   **extra)
        assert proc.returncode == 0, describe(proc)
        words[value] = shlex.split(proc.stdout.strip().splitlines()[-1])
    assert "--ps-force-servers" in words["1"]
    assert "--ps-force-servers" not in words["0"] and "--ps-force-servers" not in words[None]
    proc = run(["bash", "-c", cmd], timeout=120, hostfile=f"{REPO}/configs/cluster4",
               BYTEPS_FORCE_DISTRIBUTED="yes")
    assert proc.returncode == 2 and "ps_force_servers (BYTEPS_FORCE_DISTRIBUTED) must be 0 or 1, " \
        "got 'yes'" in proc.stderr, describe(proc)


def _train_flags(printed):
    """Every flag of the command a launcher prints (its last line: mpirun's or the PS
    launcher's, with the training script's flags)."""
    words = shlex.split(printed.strip().splitlines()[-1])
    flags = {}
    for i, w in enumerate(words):
        if w.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else ""
            flags[w] = "" if nxt.startswith("--") else nxt
    return flags


@pytest.mark.parametrize("name,folder,line,method,expected", ORIGINAL,
                         ids=[row[0] for row in ORIGINAL])
def test_an_original_command_means_the_original_experiment(name, folder, line, method, expected):
    cmd = f"cd {folder}; rdma=0 dnn=resnet50 bs=64 nworkers=4 {line}"
    proc = run(["bash", "-c", cmd], timeout=120, dry_run="1")
    assert proc.returncode == 0, describe(proc)
    flags = _train_flags(proc.stdout)
    assert flags["--method"] == method, describe(proc)
    assert (flags["--model"], flags["--batch-size"]) == ("resnet50", "64")
    for flag, value in expected.items():
        assert flags.get(flag) == value, (flag, describe(proc))
    if method in ("bspa2a", "wfbp", "mgwfbp", "bytescheduler"):
        assert flags["--compressor"] == "none"
        assert "--threshold" not in flags  # no fusion threshold: none of these fuse by one
    if folder in ("mgwfbp", "horovod", "bytescheduler"):
        assert "NCCL_DEBUG=INFO" in proc.stdout  # its launchers always set it
    if folder == "byteps":
        assert proc.stderr.startswith("byteps/launch.sh: debug=1 (the original's default)")
        # its byteps/ scripts: SGD at lr 0.01 for every model, not scaled by the workers
        assert flags["--optimizer"] == "original-ps" and "--lr" not in flags, describe(proc)
    else:  # its horovod/, mgwfbp/ and bytescheduler/ optimizers are --optimizer auto's
        assert "--optimizer" not in flags and "--lr" not in flags, describe(proc)
    assert "--cudnn-benchmark" in flags  # every one of its scripts set cudnn.benchmark = True


# What the original's rdma switch set on top of rdma=0's experiment (its launchers; gen_cmd swept
# rdmas=[0, 1, 2]): NCCL over InfiniBand for rdma=1, NCCL over TCP with GPUDirect off on the
# fabric for rdma=2; the network label the training script reads (DDLBENCH_NETWORK), by which
# MG-WFBP plans with the original's 56Gbps alpha-beta table (its --rdma) on both.
RDMA_EXPORTS = {1: {"NCCL_IB_DISABLE=0", "DDLBENCH_NETWORK=rdma1"},
                2: {"NCCL_IB_DISABLE=1", "NCCL_NET_GDR_LEVEL=0", "NCCL_NET_GDR_READ=0",
                    "NCCL_IB_CUDA_SUPPORT=0", "DDLBENCH_NETWORK=rdma2"}}


@pytest.mark.parametrize("rdma", [1, 2])
def test_an_original_command_on_the_fast_networks(rdma):
    """The original's MG-WFBP command with rdma=1 and rdma=2: the same training command as at
    rdma=0, mpirun given the network's settings, and the 56Gbps table chosen for it."""
    from ddlbench import planning
    line = A2A.format(c="none", t=0, m=1)
    procs = {r: run(["bash", "-c", f"cd mgwfbp; rdma={r} dnn=resnet50 bs=64 nworkers=4 {line}"],
                    timeout=120, dry_run="1") for r in (0, rdma)}
    for proc in procs.values():
        assert proc.returncode == 0, describe(proc)
    assert _train_flags(procs[rdma].stdout) == _train_flags(procs[0].stdout)
    words = shlex.split(procs[rdma].stdout.strip().splitlines()[-1])
    mpirun = words[:words.index("-m")]
    exported = {mpirun[i + 1] for i, w in enumerate(mpirun) if w == "-x"}
    nccl = {w for w in exported if w.startswith(("NCCL_IB", "NCCL_NET", "DDLBENCH_NETWORK"))}
    assert nccl == RDMA_EXPORTS[rdma], mpirun
    # rdma=1: one line says which MPI transport stands in for the original's openib BTL
    assert ("rdma=1: MPI over" in procs[rdma].stderr) == (rdma == 1), describe(procs[rdma])
    assert planning.original_ab_table(f"rdma{rdma}") == "56Gbps"
    assert planning.original_ab_table("rdma0") == "10Gbps"


@pytest.mark.parametrize("launcher,env,ab", [
    ("mgwfbp/horovod_mpi_cj.sh", {}, "table"),  # the original planned with its tables
    ("mgwfbp/horovod_mpi_cj.sh", dict(mgwfbp_ab="measured"), "measured"),
    ("mgwfbp/horovod_mpi_cj.sh", dict(DDLBENCH_MGWFBP_AB="measured"), "measured"),
    ("horovod/horovod_mpi_cj.sh", dict(method="mgwfbp"), "measured"),  # the suite's own default
])
def test_mgwfbp_alpha_beta_source_per_launcher(launcher, env, ab):
    proc = run(["bash", f"{REPO}/{launcher}"], timeout=60, nworkers="2", dry_run="1", **env)
    assert proc.returncode == 0, describe(proc)
    assert _train_flags(proc.stdout)["--mgwfbp-ab"] == ab, describe(proc)


@pytest.mark.parametrize("env,message", [
    (dict(mgwfbp="2"), "mgwfbp must be 0 or 1, got '2'"),
    (dict(mgwfbp_ab="tables"), "mgwfbp_ab must be one of table, measured, got 'tables'"),
    (dict(threshold="64M"), "threshold must be a number of elements >= 0, got '64M'"),
    (dict(method="wfbp"), "method= is not a variable of this launcher"),
])
def test_the_mgwfbp_launcher_refuses_bad_variables(env, message):
    proc = run(["bash", f"{REPO}/mgwfbp/horovod_mpi_cj.sh"], timeout=60, nworkers="2",
               dry_run="1", **env)
    assert proc.returncode == 2
    assert message in proc.stderr.strip().splitlines()[-1], describe(proc)


def test_the_byteps_launcher_prints_by_default_and_counts_elements():
    proc = run(["bash", f"{REPO}/byteps/launch.sh"], timeout=60, nworkers="8",
               threshold="1000", hostfile=f"{REPO}/configs/cluster8")
    # debug=1: printed, nothing run; nservers nworkers/4; 1000 elements = 4000 bytes
    assert proc.returncode == 0, describe(proc)
    flags = _train_flags(proc.stdout)
    assert (flags["--nservers"], flags["--threshold"]) == ("2", "4000"), describe(proc)
    proc = run(["bash", f"{REPO}/byteps/launch.sh"], timeout=60, debug="yes")
    assert proc.returncode == 2 and "debug must be 0 or 1, got 'yes'" in proc.stderr


def test_the_original_envs_conf_is_read_in_this_suites_names(tmp_path):
    """A user's configs/envs.conf from the original (here through DDLBENCH_ENVS_CONF): its PY,
    MPIPATH, interfaces and MPI subnet reach mpirun as cluster.conf's settings would."""
    conf = tmp_path / "envs.conf"
    conf.write_text(f"export PY={sys.executable}\nexport IB_INTERFACE=ib0\n"
                    "export ETH_INTERFACE=enp136s0f0,enp137s0f0\n"
                    "export MPIPATH=/opt/openmpi-4.0.1\n"
                    "export ETH_MPI_BTC_TCP_IF_INCLUDE=192.168.0.1/24\n"
                    "export LAUNCHBIN=/opt/bin/bpslaunch\n")
    proc = run(["bash", f"{REPO}/horovod/horovod_mpi_cj.sh"], timeout=60, nworkers="2",
               method="wfbp", dry_run="1", DDLBENCH_ENVS_CONF=str(conf))
    assert proc.returncode == 0, describe(proc)
    words = shlex.split(proc.stdout.strip().splitlines()[-1])
    assert words[0] == "/opt/openmpi-4.0.1/bin/mpirun"
    assert words[words.index("--prefix") + 1] == "/opt/openmpi-4.0.1"
    assert words[words.index("btl_tcp_if_include") + 1] == "192.168.0.1/24"
    assert "NCCL_SOCKET_IFNAME=enp136s0f0,enp137s0f0" in words
    assert words[words.index("ddlbench.train") - 2] == sys.executable


@pytest.mark.timeout(300)
@pytest.mark.parametrize("folder,line,method", [
    ("mgwfbp", A2A.format(c="none", t=536870912, m=0), "bspa2a"),
    ("byteps", PS.format(t=0, b=0).replace("debug=1", "debug=0"), "wfbpps"),
], ids=["mgwfbp-bspa2a", "byteps-wfbpps"])
def test_an_original_command_runs_with_a_small_model(tmp_path, load_json, folder, line, method):
    """Two of the original's commands run for real (2 workers, tiny BERT, one short round):
    the record says the method and settings the original's scripts used."""
    out = tmp_path / "rec.json"
    extra = f"--num-warmup-batches 1 --num-batches-per-iter 1 --timeout 60 --output {out}"
    cmd = (f"cd {folder}; rdma=0 dnn=bert_tiny bs=4 senlen=16 nworkers=2 iters=1 "
           f"extra_args={shlex.quote(extra)} {line}")
    proc = run(["bash", "-c", cmd], timeout=280)
    assert proc.returncode == 0, describe(proc)
    assert "Total sen/sec on 2 CPU(s): " in proc.stdout
    rec = load_json(out)
    assert rec["config"]["method"] == method, describe(proc)
    opt = rec["optimizer"]
    if folder == "byteps":  # its byteps/ scripts: SGD 0.01 for BERT too, not scaled, no momentum
        assert (opt["class"], opt["lr"], opt["momentum"], opt["auto"]) == ("SGD", 0.01, 0, False)
    else:  # BERT as its horovod/ and mgwfbp/ scripts trained it: AdamW, lr 2e-5, eps 1e-8
        assert (opt["class"], opt["lr"], opt["eps"], opt["auto"]) == ("AdamW", 2e-5, 1e-8, True)
    assert rec["config"]["cudnn_benchmark"] is True  # as each of the original's scripts
    if method == "wfbpps":
        # As BytePS with one worker machine: no server, a local reduce and broadcast.
        assert rec["method"]["nservers"] == 0 and rec["config"]["nworkers"] == 2
        assert rec["method"]["parameter_servers"] == ("none (one machine: local reduce and "
                                                      "broadcast, as BytePS)")
        assert rec["method"]["pushers"] == [] and rec["servers"] is None


def test_the_original_driver_runs_from_this_checkout_with_its_settings_narrowed(tmp_path):
    """scripts/run_original.py imports a checkout's benchmarks.py unchanged, sets the four
    module-level settings a user edits, and calls its main() from this checkout's root (its
    commands are relative: cd mgwfbp, cd byteps). Here a stand-in original records what it
    was given; a folder without benchmarks.py is one line."""
    original = tmp_path / "original"
    original.mkdir()
    seen = tmp_path / "seen.json"
    (original / "benchmarks.py").write_text(
        "import json, os\n"
        "nworkers=[4, 8, 16, 32]; rdmas=[0, 1, 2]; tasks=[('resnet50', 64)]; NUM_OF_TRIES=5\n"
        "def main():\n"
        f"    json.dump({{'cwd': os.getcwd(), 'nworkers': nworkers, 'rdmas': rdmas,\n"
        f"               'tasks': tasks, 'tries': NUM_OF_TRIES}}, open({str(seen)!r}, 'w'))\n")
    (original / "plots.py").write_text("")   # a file only the original has (its identity)
    proc = run([sys.executable, "scripts/run_original.py", str(original), "--nworkers", "4,8",
                "--tasks", "bert_tiny:8", "--tries", "1"], timeout=60)
    assert proc.returncode == 0, describe(proc)
    assert json.loads(seen.read_text()) == {"cwd": REPO, "nworkers": [4, 8], "rdmas": [0],
                                            "tasks": [["bert_tiny", 8]], "tries": 1}
    proc = run([sys.executable, "scripts/run_original.py", str(tmp_path)], timeout=60)
    assert proc.returncode == 2 and "has no benchmarks.py" in proc.stderr, describe(proc)
