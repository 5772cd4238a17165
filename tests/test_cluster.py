"""A standing emulated cluster (``python -m ddlbench.netem cluster``): hosts with their own
sshd and host name, reached by the real launchers over ssh from host 0 (mpirun with a host
file, the PS launcher, torchrun on every node) and by Slurm (srun, sbatch), every job
verified, every rank on its host and its traffic on that host's shaped link."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from ddlbench import collectives
from ddlbench.netem import links, standing
from ddlbench.netem.probe import ETHERNET_HEADER
from ddlbench.netem.state import _read_states

from .conftest import REPO, TINY_BERT_VOCAB, describe, env, tiny_bert_model, verify_lines
from .skip_conditions import byteps_skip_reason

REASON = links.unavailable_reason() or standing.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))
SLURM = standing.slurm_unavailable_reason()
needs_slurm = pytest.mark.skipif(SLURM is not None, reason=str(SLURM))

NAME = f"t{os.getpid() % 100000}"      # hosts t…0 ... t…3
SMALL = dict(dnn="bert_tiny", bs="4", senlen="16")
VOCAB = f"--vocab-size {TINY_BERT_VOCAB} --timeout 60"


def netem(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "ddlbench.netem", *args], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=timeout)


def on(host, *command, timeout=300, **variables):
    """``command`` on host ``host`` of the test's cluster (``cluster exec``)."""
    return netem("cluster", "exec", "--name", NAME, "--host", str(host), "--",
                 *[f"{k}={v}" for k, v in variables.items()], *command, timeout=timeout)


def host_file(tmp_path, hosts, slots):
    path = tmp_path / f"hosts{len(hosts)}x{slots}"
    path.write_text("".join(f"{h} slots={slots}\n" for h in hosts))
    return str(path)


def links_of(cluster) -> list[dict]:
    """Each host's eth0 as ``ip -s -j link`` shows it (its MTU, its byte counters)."""
    return [json.loads(subprocess.run(
        ["ip", "-n", h["namespace"], "-s", "-j", "link", "show", "eth0"],
        capture_output=True, text=True, check=True).stdout)[0] for h in cluster["hosts"]]


def counters(cluster) -> list[tuple[int, int]]:
    """(bytes sent, bytes received) so far on each host's eth0."""
    return [(ln["stats64"]["tx"]["bytes"], ln["stats64"]["rx"]["bytes"])
            for ln in links_of(cluster)]


@pytest.fixture(scope="module")
def cluster():
    proc = netem("cluster", "up", "--name", NAME, "--hosts", "4", "--net", "1gbit", "--slots",
                 "2", *([] if SLURM else ["--slurm"]))
    assert proc.returncode == 0, describe(proc)
    run_id = standing.load(NAME)["run_id"]
    try:
        yield standing.load(NAME)
    finally:
        proc = netem("cluster", "down", "--name", NAME)
        assert proc.returncode == 0, describe(proc)
        assert not [ns for ns in links.list_namespaces() if run_id in ns]
        assert NAME not in standing.standing_clusters()


def test_every_host_has_its_name_address_and_ssh_server(cluster):
    names = [h["name"] for h in cluster["hosts"]]
    assert names == [f"{NAME}{i}" for i in range(4)]
    with open(cluster["hostfile"]) as f:
        assert [ln for ln in f.read().splitlines() if not ln.startswith("#")] == \
            [f"{n} slots=2" for n in names]
    # `cleanup` (what every run's set-up does) leaves a standing cluster alone, and `status`
    # says it stands (not a stale set: it has no owner once up)
    assert netem("cleanup").returncode == 0
    listed = netem("status")
    assert f"standing cluster {NAME} (cluster down --name {NAME} removes it)" in \
        listed.stdout and "stale" not in listed.stdout, describe(listed)
    status = netem("cluster", "status", "--name", NAME)
    assert status.returncode == 0, describe(status)
    for h in cluster["hosts"]:
        assert f"{h['name']:12s} {h['address']:16s} {h['namespace']}  sshd up" in status.stdout
    # any host reaches any other by name, with no prompt; the suite's variables travel
    for src, dst in ((0, 3), (2, 0)):
        proc = on(src, "ssh", names[dst], "hostname; ip -4 -o addr show eth0; "
                  "echo carried=$DDLBENCH_PROBE_VALUE", DDLBENCH_PROBE_VALUE="x y")
        assert proc.returncode == 0, describe(proc)
        lines = proc.stdout.splitlines()
        assert lines[0] == names[dst]
        assert f" {cluster['hosts'][dst]['address']}/24 " in lines[1]
        assert lines[2] == "carried=x y"
    proc = on(1, "hostname")
    assert proc.stdout.strip() == names[1], describe(proc)


def test_a_second_up_and_bad_input_are_one_line(cluster):
    cases = [
        (("up", "--name", NAME, "--hosts", "2"), "is up already"),
        (("up", "--name", "nosuch", "--hosts", "0"), "1 to 64 hosts"),
        (("up", "--name", "nosuch", "--hosts", "2", "--net", "loopback"), "not loopback"),
        (("up", "--name", "Bad_Name", "--hosts", "2"), "a cluster name is"),
        (("exec", "--name", "nosuch", "--", "true"), "no standing cluster named 'nosuch'"),
        (("exec", "--name", NAME, "--host", "9", "--", "true"), "hosts 0 to 3"),
        (("exec", "--name", NAME, "--"), "needs a command"),
        (("down", "--name", "nosuch"), "no standing cluster named 'nosuch'"),
    ]
    for args, message in cases:
        proc = netem("cluster", *args)
        assert proc.returncode == 2, (args, describe(proc))
        assert proc.stderr.count("\n") == 1 and message in proc.stderr, (args, describe(proc))
    assert standing.load(NAME) == cluster      # untouched


@pytest.mark.parametrize("hosts,slots,script,methods", [
    (2, 2, "./horovod/horovod_mpi_cj.sh", "bspa2a,fusion"),
    (4, 1, "./bytescheduler/horovod_mpi_cj.sh", "bytescheduler")])
def test_mpirun_over_ssh_verifies(cluster, tmp_path, hosts, slots, script, methods):
    names = [h["name"] for h in cluster["hosts"][:hosts]]
    proc = on(0, script, hostfile=host_file(tmp_path, names, slots), nworkers=hosts * slots,
              method=methods, **SMALL, extra_args=f"--verify 3 {VOCAB}")
    assert proc.returncode == 0, describe(proc)
    assert set(verify_lines(proc.stdout)) == set(methods.split(","))
    assert all(ok for steps in verify_lines(proc.stdout).values() for *_, ok in steps)
    # the cluster's entries: its interface and subnet, Open MPI's prefix for remote daemons
    assert f"GLOO_SOCKET_IFNAME=eth0 --mca btl_tcp_if_include {cluster['subnet']}" in \
        proc.stderr and "--prefix " in proc.stderr


def test_mpirun_ranks_run_on_their_hosts_and_send_over_their_links(cluster, tmp_path):
    """Two timed runs, 2 and 6 steps per round: each rank's record names its host and address,
    and the extra 4 steps put on every host's link what the ring model says (the wire bytes
    of its payload: frames of MTU + 14 bytes carrying MSS = MTU - 52), within 10%."""
    names = [h["name"] for h in cluster["hosts"]]
    sent, records = [], []
    for batches in (2, 6):
        out = tmp_path / f"record{batches}.json"
        before = counters(cluster)
        proc = on(0, "./horovod/horovod_mpi_cj.sh", hostfile=host_file(tmp_path, names, 1),
                  nworkers=4,
                  method="wfbp", iters=1, **SMALL,
                  extra_args=f"{VOCAB} --num-warmup-batches 1 --num-batches-per-iter "
                             f"{batches} --output {out}")
        assert proc.returncode == 0, describe(proc)
        sent.append([a[0] - b[0] for a, b in zip(counters(cluster), before)])
        records.append(json.loads(out.read_text()))
    for rec in records:
        assert rec["environment"]["hosts"] == names
        assert rec["environment"]["addresses"] == [h["address"] for h in cluster["hosts"]]
        assert rec["environment"]["hostname"] == names[0]
    ring = records[0]["communication_per_iteration"]["wire_sent_bytes"]["allreduce"]
    assert ring == collectives.sent_bytes("allreduce", records[0]["model"]["gradient_bytes"], 4)
    # on the wire: each MSS (MTU - 52: IPv4, TCP, timestamps) of payload in an MTU-sized
    # packet plus its Ethernet header, as the link probe counts it
    (mtu,) = {ln["mtu"] for ln in links_of(cluster)}
    expected = 4 * ring * (mtu + ETHERNET_HEADER) / (mtu - 52)
    ratios = [(long_ - short) / expected for short, long_ in zip(*sent)]
    print(f"extra bytes on each host's veth / the ring model's: {ratios}")
    assert ratios == pytest.approx([1] * 4, abs=0.10), sent


def test_ps_launcher_over_ssh_puts_servers_on_their_own_hosts(cluster, tmp_path):
    names = [h["name"] for h in cluster["hosts"]]
    before = counters(cluster)
    proc = on(0, "./byteps/byteps_launch.sh", hostfile=host_file(tmp_path, names, 1),
              nworkers=2, nservers=2, method="wfbpps", **SMALL,
              extra_args=f"--verify 3 {VOCAB}")
    assert proc.returncode == 0, describe(proc)
    assert [ok for *_, ok in verify_lines(proc.stdout)["wfbpps"]] == [True] * 3
    received = [a[1] - b[1] for a, b in zip(counters(cluster), before)]
    # Servers t2 and t3 (keys spread over both) receive every push of 3 steps from 2 workers,
    # each more than a megabyte: far more than the ssh and rendezvous traffic of a host
    # without a server.
    gradient = 4 * sum(p.numel() for p in tiny_bert_model().parameters())
    assert received[2] + received[3] > 3 * 2 * gradient, received
    assert min(received[2:]) > 1e6, received


def test_real_byteps_over_ssh_puts_its_servers_on_their_own_hosts(cluster, tmp_path):
    """engine=byteps over ssh: BytePS's scheduler beside worker 0, its servers on hosts of
    their own (t2, t3), which receive the pushes; --verify passes."""
    lane = subprocess.run([os.path.join(REPO, "byteps", "legacy_env.sh"), "python"],
                          capture_output=True, text=True, timeout=60)
    reason = byteps_skip_reason(lane)
    if reason is not None:
        pytest.skip("real BytePS: " + reason)
    names = [h["name"] for h in cluster["hosts"]]
    before = counters(cluster)
    proc = on(0, "./byteps/byteps_launch.sh", hostfile=host_file(tmp_path, names, 1),
              nworkers=2, nservers=2, method="wfbpps", engine="byteps",
              BYTEPS_PY=lane.stdout.strip(), dnn="squeezenet1_1", bs="4", image_size="32",
              extra_args="--verify 2 --timeout 60")
    assert proc.returncode == 0, describe(proc)
    assert [ok for *_, ok in verify_lines(proc.stdout)["wfbpps"]] == [True] * 2
    received = [a[1] - b[1] for a, b in zip(counters(cluster), before)]
    # each server takes about half of 2 workers' 2 steps of 4.9 MB pushes (BytePS hashes keys)
    assert min(received[2:]) > 1e6 and received[2] + received[3] > 2 * 2 * 4.9e6, received


def test_torchrun_on_every_host_verifies(cluster, tmp_path):
    names = [h["name"] for h in cluster["hosts"][:2]]
    proc = on(0, "./torchrun/torchrun_launch.sh", hostfile=host_file(tmp_path, names, 2),
              nworkers=4, method="wfbp", **SMALL, extra_args=f"--verify 3 {VOCAB}")
    assert proc.returncode == 0, describe(proc)
    assert [ok for *_, ok in verify_lines(proc.stdout)["wfbp"]] == [True] * 3
    assert f"+ on {names[1]}: torchrun --nnodes 2 --nproc-per-node 2 --node-rank 1 " \
        f"--rdzv-backend static --rdzv-endpoint {names[0]}:" in proc.stderr


def test_an_up_killed_while_building_leaves_nothing():
    name = f"k{os.getpid() % 100000}"
    up = subprocess.Popen([sys.executable, "-m", "ddlbench.netem", "cluster", "up", "--name",
                           name, "--hosts", "3"], cwd=REPO, env=env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    run_id = None
    while run_id is None and time.monotonic() < deadline and up.poll() is None:
        run_id = next((s["run_id"] for _, s in _read_states() if s.get("cluster") == name
                       and not s.get("standing")), None)
        time.sleep(0.01)
    assert run_id, "the up never wrote its state file while building"
    up.send_signal(signal.SIGKILL)
    up.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
            any(run_id in ns for ns in links.list_namespaces())
            or any(s.get("run_id") == run_id for _, s in _read_states())):
        time.sleep(0.1)
    assert not any(run_id in ns for ns in links.list_namespaces())
    assert not any(s.get("run_id") == run_id for _, s in _read_states())
    assert name not in standing.standing_clusters()
    assert not os.path.exists(standing.directory(name))   # nor its folder
    proc = netem("cluster", "down", "--name", name)
    assert proc.returncode == 2 and "no standing cluster" in proc.stderr


@needs_slurm
def test_srun_verifies_on_the_slurm_nodes(cluster):
    names = [h["name"] for h in cluster["hosts"]]
    proc = on(0, "srun", "-N", "4", "--ntasks-per-node", "1", "-l", "hostname")
    assert proc.returncode == 0, describe(proc)
    assert sorted(proc.stdout.split("\n")[:-1]) == [f"{i}: {n}" for i, n in enumerate(names)]
    proc = on(0, "srun", "-N", "2", "--ntasks-per-node", "2", sys.executable, "-m",
              "ddlbench.train", "--model", "bert_tiny", "--batch-size", "4", "--sentence-len",
              "16", *VOCAB.split(), "--method", "fusion", "--verify", "3")
    assert proc.returncode == 0, describe(proc)
    assert [ok for *_, ok in verify_lines(proc.stdout)["fusion"]] == [True] * 3
    assert "verify: 4 worker(s)" in proc.stdout


@needs_slurm
def test_an_sbatch_sweep_writes_a_record_per_method(cluster, tmp_path):
    out = tmp_path / "records"
    proc = on(0, "sbatch", "--wait", "-N", "2", "--ntasks-per-node", "1", "-o",
              str(tmp_path / "job.out"), "slurm/sweep.sbatch", methods="wfbp bspa2a",
              outdir=str(out), iters=1, **SMALL,
              extra_args=f"{VOCAB} --num-warmup-batches 1 --num-batches-per-iter 1")
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert proc.returncode == 0, describe(proc) + log
    assert sorted(os.listdir(out)) == ["bspa2a.json", "wfbp.json"], log
    for method in ("wfbp", "bspa2a"):
        rec = json.loads((out / f"{method}.json").read_text())
        assert rec["config"]["method"] == method
        assert rec["environment"]["launcher"] == "slurm"
        assert rec["environment"]["hosts"] == [h["name"] for h in cluster["hosts"][:2]]


def test_bad_hosts_stop_a_launch_with_one_line(cluster, tmp_path):
    """A host that is down, more ranks than slots, a missing key: one line each, exit 2,
    nothing started."""
    names = [h["name"] for h in cluster["hosts"]]
    down = cluster["subnet"].rsplit(".", 1)[0] + ".200"      # in the subnet, nobody there
    with_down = host_file(tmp_path, [names[0], down], 1)
    cases = [
        ("./horovod/horovod_mpi_cj.sh", dict(hostfile=with_down, nworkers=2),
         f"host {down} does not answer over ssh"),
        # (one worker machine runs no server unless forced: the server goes to the host down)
        ("./byteps/byteps_launch.sh", dict(hostfile=with_down, nworkers=1, nservers=1,
                                           ps_force_servers=1),
         f"host {down} does not answer over ssh"),
        ("./torchrun/torchrun_launch.sh", dict(hostfile=with_down, nworkers=2),
         f"host {down} does not answer over ssh"),
        ("./horovod/horovod_mpi_cj.sh", dict(hostfile=cluster["hostfile"], nworkers=9),
         "9 workers asked for, but host file"),
    ]
    # the cluster's key gone: every host refuses the connection
    cases.append(("./horovod/horovod_mpi_cj.sh", dict(hostfile=cluster["hostfile"], nworkers=4),
                  "does not answer over ssh"))
    key = os.path.join(cluster["directory"], "client_key")
    for i, (script, variables, message) in enumerate(cases):
        if i == len(cases) - 1:
            os.rename(key, key + ".away")
        try:
            proc = on(0, script, method="wfbp" if "horovod" in script else "wfbpps",
                      **variables, **SMALL, extra_args=VOCAB)
        finally:
            if os.path.exists(key + ".away"):
                os.rename(key + ".away", key)
        errors = [ln for ln in proc.stderr.splitlines() if "error" in ln]
        assert proc.returncode == 2 and len(errors) == 1, (script, describe(proc))
        assert message in errors[0], (script, describe(proc))
        # nothing started: no mpirun, torchrun or PS job line before the error
        assert proc.stderr.splitlines()[-1] == errors[0] and not any(
            w in proc.stderr for w in ("+ ", "job ID")), (script, describe(proc))
    assert "Permission denied (publickey)" in errors[0]


def _train_pids(cluster) -> dict[str, list[int]]:
    """Each host's processes of the training script."""
    out = {}
    for h in cluster["hosts"]:
        pids = links.namespace_pids(h["namespace"])
        out[h["name"]] = [p for p in pids if b"ddlbench.train" in _cmdline(p)]
    return out


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _kill_mid_run(cluster, tmp_path, script, victim_host, **variables):
    """Start a long job through ``script``; once it trains (rank 0 printed "Running
    benchmark"), kill the training processes on ``victim_host`` (SIGKILL). Returns (the
    launcher's process after it ended, seconds from the kill to its end)."""
    args = [sys.executable, "-m", "ddlbench.netem", "cluster", "exec", "--name", NAME, "--",
            *[f"{k}={v}" for k, v in dict(variables, **SMALL, iters=1000,
                                             extra_args=VOCAB).items()], script]
    job = subprocess.Popen(args, cwd=REPO, env=env(), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    out, training = [], threading.Event()

    def read():
        for line in job.stdout:
            out.append(line)
            if line.startswith("Running benchmark"):
                training.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert training.wait(180), (job.poll(), "".join(out))
        victims = _train_pids(cluster)[victim_host]
        assert victims
        for p in victims:
            os.kill(p, signal.SIGKILL)
        killed = time.monotonic()
        err = job.stderr.read()
        job.wait(60)
        took = time.monotonic() - killed
        reader.join(10)
        return subprocess.CompletedProcess(args, job.returncode, "".join(out), err), took
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def _nothing_left(cluster) -> bool:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_train_pids(cluster).values()):
        time.sleep(0.2)
    return not any(_train_pids(cluster).values())


@pytest.mark.parametrize("launcher", ["mpirun", "ps"])
def test_a_host_killed_mid_run_stops_the_whole_job(cluster, tmp_path, launcher):
    names = [h["name"] for h in cluster["hosts"]]
    if launcher == "mpirun":
        proc, took = _kill_mid_run(cluster, tmp_path, "./horovod/horovod_mpi_cj.sh", names[2],
                                   hostfile=host_file(tmp_path, names, 1), nworkers=4,
                                   method="wfbp")
        named = f"on node {names[2]}"
    else:   # workers on hosts 0 and 1, servers on 2 and 3: a server dies
        proc, took = _kill_mid_run(cluster, tmp_path, "./byteps/byteps_launch.sh", names[3],
                                   hostfile=host_file(tmp_path, names, 1), nworkers=2,
                                   nservers=2, method="wfbpps")
        named = f"server 1 on {names[3]}"
    print(f"{launcher}: the job ended {took:.1f} s after the kill")
    assert proc.returncode != 0 and took < 30, (took, describe(proc))
    assert named in proc.stderr, describe(proc)
    assert _nothing_left(cluster), _train_pids(cluster)


def test_stop_sh_stops_a_ps_job_on_every_host(cluster, tmp_path):
    names = [h["name"] for h in cluster["hosts"]]
    hosts = host_file(tmp_path, names, 1)
    job = subprocess.Popen(
        [sys.executable, "-m", "ddlbench.netem", "cluster", "exec", "--name", NAME, "--",
         f"hostfile={hosts}", "nworkers=2", "nservers=2", "method=wfbpps", "job=stopme1",
         *[f"{k}={v}" for k, v in SMALL.items()], "iters=1000", f"extra_args={VOCAB}",
         "./byteps/byteps_launch.sh"], cwd=REPO, env=env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(_train_pids(cluster).values()):
            time.sleep(0.2)
        assert all(_train_pids(cluster).values()), job.poll()
        proc = on(0, "./byteps/stop.sh", hostfile=hosts, job="stopme1")
        assert proc.returncode == 0, describe(proc)
        assert [f"stopped the processes of job stopme1 on {n}" for n in names] == \
            proc.stdout.splitlines()
        job.communicate(timeout=60)
        assert job.returncode != 0
        assert _nothing_left(cluster), _train_pids(cluster)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def test_without_an_ssh_server_up_says_what_is_missing(monkeypatch):
    monkeypatch.setattr(standing, "SSHD", "/nonexistent/sshd")
    with pytest.raises(links.NetemError, match=r"needs an OpenSSH server \(sshd\): install "
                                                r"openssh-server \(`make cluster-deps`"):
        standing.up("nosshd", 2, "1gbit")
    assert "nosshd" not in standing.standing_clusters()
