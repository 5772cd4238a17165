"""The launchers run a 2-worker job end to end on one machine; bad input stops them early."""
import json
import os
import subprocess
import sys

import pytest

from ddlbench.hosts import hostfile, placement
from ddlbench.errors import UsageError

from .conftest import QUICK_TIMING, REPO, TINY_BERT, describe, run, train, verify_lines

LAUNCHER = f"{REPO}/horovod/horovod_mpi_cj.sh"
SMALL = dict(dnn="bert_tiny", bs="4", senlen="16", iters="2",
             extra_args="--num-warmup-batches 1 --num-batches-per-iter 2 --timeout 60")


def total_line(stdout):
    lines = [ln for ln in stdout.splitlines() if "Total" in ln]
    assert len(lines) == 1, stdout
    return lines[0]


def test_mpi_launcher_runs_two_workers(tmp_path, load_json):
    out = tmp_path / "rec.json"
    proc = run(["bash", LAUNCHER], timeout=300, nworkers=2, method="wfbp",
               **dict(SMALL, extra_args=SMALL["extra_args"] + f" --output {out}"))
    assert proc.returncode == 0, describe(proc)
    assert total_line(proc.stdout).startswith("Total sen/sec on 2 CPU(s): ")
    rec = load_json(out)
    assert rec["environment"]["launcher"] == "mpi"
    assert rec["network"] == "rdma0" and rec["config"]["method"] == "wfbp"
    assert "mpirun -np 2 -hostfile" in proc.stderr and "NCCL_IB_DISABLE=1" in proc.stderr


def test_mpi_launcher_verifies(tmp_path):
    workload = {k: v for k, v in SMALL.items() if k != "iters"}  # a verification times nothing
    proc = run(["bash", LAUNCHER], timeout=300, nworkers=2, method="bspa2a,fusion",
               **dict(workload, extra_args="--verify 2 --threshold 100000 --timeout 60"))
    assert proc.returncode == 0, describe(proc)
    assert set(verify_lines(proc.stdout)) == {"bspa2a", "fusion"}


@pytest.mark.parametrize("rdma,expected", [
    ("1", ["NCCL_IB_DISABLE=0", "rdma=1: MPI over"]),  # UCX, or TCP where Open MPI lacks it
    ("2", ["NCCL_IB_DISABLE=1", "NCCL_NET_GDR_LEVEL=0", "NCCL_NET_GDR_READ=0",
           "NCCL_IB_CUDA_SUPPORT=0"])])  # the original's full rdma=2 set
def test_rdma_profiles(rdma, expected):
    proc = run(["bash", LAUNCHER], timeout=300, nworkers=1, rdma=rdma, method="wfbp",
               IB_INTERFACE="lo", **SMALL)
    assert proc.returncode == 0, describe(proc)
    for e in expected + ["NCCL_SOCKET_IFNAME=lo", "GLOO_SOCKET_IFNAME=lo",
                         f"DDLBENCH_NETWORK=rdma{rdma}"]:
        assert e in proc.stderr


def test_local_launcher_runs_two_workers():
    proc = train(*TINY_BERT, *QUICK_TIMING, "--method", "fusion", "--nworkers", "2")
    assert proc.returncode == 0, describe(proc)
    assert total_line(proc.stdout).startswith("Total sen/sec on 2 CPU(s): ")


def test_torchrun_joins_its_job():
    proc = run(["torchrun", "--standalone", "--nproc-per-node", "2", "-m", "ddlbench.train",
                *TINY_BERT, "--verify", "2", "--method", "wfbp,ddp", "--timeout", "60"],
               timeout=300)
    assert proc.returncode == 0, describe(proc)
    assert set(verify_lines(proc.stdout)) == {"wfbp", "ddp"}


@pytest.mark.parametrize("env,message", [
    (dict(nworkers="3"), "host file"),  # configs/cluster3 does not exist
    (dict(nworkers="4", hostfile=f"{REPO}/configs/cluster2"), "4 workers asked for, but host file"),
    (dict(nworkers="8"), "holds example hosts"),
    (dict(nworkers="2", rdma="7"), "rdma must be 0"),
    (dict(nworkers="0"), "nworkers must be a positive integer"),
    (dict(nworkers="2", bs="0"), "bs must be a positive integer"),
    (dict(nworkers="2", dnn="nonet"), "unknown model 'nonet'"),
])
def test_mpi_launcher_bad_input(env, message):
    proc = run(["bash", LAUNCHER], timeout=120, **env)
    assert proc.returncode != 0
    err = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert err and message in err[0], describe(proc)
    assert "Traceback" not in proc.stderr


def test_missing_hostfile_message():
    proc = run(["bash", LAUNCHER], timeout=60, nworkers="2", hostfile="/nonexistent/hosts")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "ddlbench: error: host file /nonexistent/hosts not found"


# --------------------------------------------------------------------- placement and host files

def test_detect_open_mpi():
    p = placement.detect({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8",
                       "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
                       "MASTER_ADDR": "10.0.0.1"})
    assert (p.rank, p.world_size, p.local_rank, p.local_world_size, p.launcher) == \
        (3, 8, 1, 4, "mpi")
    assert p.master_addr == "10.0.0.1" and p.master_port is None and p.store_owner == "rank0"


def test_detect_torchrun():
    p = placement.detect({"TORCHELASTIC_RUN_ID": "x", "RANK": "1", "WORLD_SIZE": "2",
                       "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h",
                       "MASTER_PORT": "29500"})
    assert (p.rank, p.world_size, p.launcher, p.master_port, p.store_owner) == \
        (1, 2, "torchrun", 29500, "external")


def test_detect_slurm_step():
    p = placement.detect({"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1",
                       "SLURM_STEP_TASKS_PER_NODE": "4", "SLURM_JOB_ID": "123456",
                       "SLURM_STEP_NODELIST": "gpu[07-08]", "PATH": "/nonexistent"})
    assert (p.rank, p.world_size, p.local_rank, p.local_world_size, p.launcher) == \
        (5, 8, 1, 4, "slurm")
    assert p.master_addr == "gpu07" and p.master_port == 10000 + 123456 % 50000


def test_detect_nothing_and_bad_values():
    assert placement.detect({"PATH": "/bin"}) is None
    with pytest.raises(UsageError, match="OMPI_COMM_WORLD_RANK='x' is not an integer"):
        placement.detect({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"})


def test_hostfile_parsing(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# comment\nnode1 slots=4  # trailing\n\nnode2\nnode3 slots=2 max_slots=8\n")
    hosts = hostfile.parse(str(f))
    assert [(h.name, h.slots) for h in hosts] == [("node1", 4), ("node2", 1), ("node3", 2)]
    assert hostfile.total_slots(hosts) == 7 and hostfile.rendezvous_address(hosts) == "node1"
    with pytest.raises(UsageError, match="8 workers asked for, but host file .* has only 7"):
        hostfile.check(str(f), 8)
    f.write_text("node1 slots=zero\n")
    with pytest.raises(UsageError, match="bad slot count"):
        hostfile.parse(str(f))
    f.write_text("# only comments\n")
    with pytest.raises(UsageError, match="lists no hosts"):
        hostfile.parse(str(f))


def test_shipped_hostfiles():
    for n in (1, 2, 4):
        hosts = hostfile.check(f"{REPO}/configs/cluster{n}", n)
        assert hostfile.rendezvous_address(hosts) == "127.0.0.1"
    for n in (8, 16, 32, 64):
        with pytest.raises(UsageError, match="example hosts"):
            hostfile.parse(f"{REPO}/configs/cluster{n}")
        text = open(f"{REPO}/configs/cluster{n}").read()
        assert sum(int(l.split("slots=")[1]) for l in text.splitlines()
                   if "slots=" in l and not l.startswith("#")) == n


# ompi_info and ucx_info stand-ins beside a stand-in mpirun: what this Open MPI has, what UCX
# sees (an InfiniBand transport or only TCP and shared memory).
OMPI_INFO = {"ucx": "MCA pml: ob1\nMCA pml: ucx\nMCA btl: tcp\n",
             "openib": "MCA pml: ob1\nMCA btl: openib\nMCA btl: tcp\n",
             "tcp": "MCA pml: ob1\nMCA btl: tcp\n"}
UCX_INFO = {"ib": "#      Transport: rc_mlx5\n#         Device: mlx5_0:1\n",
            "none": "#      Transport: tcp\n#      Transport: posix\n"}


@pytest.mark.parametrize("ompi,ucx,pml,btl,line", [
    ("ucx", "ib", "ucx", "self,sm,tcp", "rdma=1: MPI over UCX on InfiniBand (the original's "
     "openib BTL is gone from Open MPI 5)"),
    ("ucx", "none", "ob1", "self,sm,tcp",
     "rdma=1: MPI over TCP on lo with pml ob1: this Open MPI has no openib BTL (the "
     "original's) and UCX sees no InfiniBand device here (forced, it would abort); NCCL "
     "still uses InfiniBand"),
    ("openib", "none", "ob1", "openib,vader,self",
     "rdma=1: MPI over the openib BTL (pml ob1, btl openib,vader,self), as the original"),
    ("tcp", "ib", "ob1", "self,sm,tcp", "rdma=1: MPI over TCP on lo with pml ob1: this Open "
     "MPI has neither the openib BTL (the original's) nor UCX; NCCL still uses InfiniBand"),
])
def test_rdma1_transport_falls_back_where_ucx_sees_no_device(tmp_path, ompi, ucx, pml, btl,
                                                             line):
    import shlex
    for name, text in (("mpirun", "exit 0\n"), ("ompi_info", f"printf '{OMPI_INFO[ompi]}'\n"),
                       ("ucx_info", f"printf '{UCX_INFO[ucx]}'\n")):
        path = tmp_path / name
        path.write_text("#!/bin/sh\n" + text)
        path.chmod(0o755)
    proc = run(["bash", LAUNCHER], timeout=60, nworkers=1, rdma="1", method="wfbp",
               IB_INTERFACE="lo", MPIRUN=str(tmp_path / "mpirun"), dry_run="1")
    assert proc.returncode == 0, describe(proc)
    assert f"horovod/horovod_mpi_cj.sh: {line}" in proc.stderr.splitlines(), describe(proc)
    words = shlex.split(proc.stdout.strip().splitlines()[-1])
    mca = {words[i + 1]: words[i + 2] for i, w in enumerate(words) if w == "--mca"}
    assert (mca["pml"], mca["btl"]) == (pml, btl), words
    assert (mca.get("btl_openib_allow_ib") == "1") == (ompi == "openib")


def _spawn_store_probes(tmp_path, name: str, torch_2_0: bool = False):
    """Two store probes (``tests/store_probe.py``) through the local spawner, run in a fresh
    interpreter (with ``torch_2_0``, as if its torch took no listening socket): the spawner's
    exit code and whether it imported torch, then what each rank saw."""
    patch = ("import ddlbench.launch.local as L; L._takes_listen_fd = lambda: False; "
             if torch_2_0 else "")
    code = (f"import sys; from ddlbench.launch.local import spawn_local; {patch}"
            "rc = spawn_local(2, [], module='tests.store_probe'); "
            "print(rc, 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120,
                          env=dict(os.environ, STORE_OUT=str(tmp_path / name)))
    ran = [json.load(open(tmp_path / f"{name}.{r}.json")) for r in range(2)] \
        if proc.returncode == 0 else None
    return proc, ran


def test_the_local_spawner_hands_the_store_to_rank_0_and_never_imports_torch(tmp_path):
    """The local spawner only parses and launches: it opens the rendezvous socket on a port the
    kernel chose and rank 0 serves the store on it (torch >= 2.1 takes a listening socket), so
    the spawner never imports torch (2 s of every job's start-up). Every rank reaches the store
    on that port; only rank 0 is given the socket. On torch 2.0 the spawner hosts it."""
    proc, got = _spawn_store_probes(tmp_path, "s")
    assert proc.stdout.split() == ["0", "False"], describe(proc)
    assert {g["got"] for g in got} == {got[0]["got"]} and got[0]["got"].startswith("from rank 0")
    assert got[0]["port"] == got[1]["port"] and got[0]["port"] > 0
    assert got[0]["owner"] == "rank0" and isinstance(got[0]["store_fd"], int)
    assert got[1]["store_fd"] is None
    # torch 2.0 (the Horovod environment) takes no listening socket: the spawner hosts the store
    proc, got = _spawn_store_probes(tmp_path, "t", torch_2_0=True)
    assert proc.stdout.split() == ["0", "True"], describe(proc)
    assert [(g["owner"], g["store_fd"]) for g in got] == [("external", None)] * 2
