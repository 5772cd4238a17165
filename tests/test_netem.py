"""The emulated cluster (ddlbench.netem, --net): rates measured over real namespaced TCP, methods
verified across it, nothing left behind after a run is killed, bad input refused in one line.

The tests that build namespaces skip, with the reason, where this process is not root or
iproute2 is missing. Every namespace a test's run made is removed by the ``netem_runs`` fixture
even when the test fails."""
import json
import os
import re
import signal
import statistics
import subprocess
import shutil
import sys
import tempfile
import time

import psutil
import pytest

from ddlbench import netem
from ddlbench.netem import cli as netem_command
from ddlbench.collectives import bus_factor
from ddlbench.errors import UsageError

from .conftest import (FULL_TINY_BERT, QUICK_TIMING, REPO, TINY_BERT, describe, env, run, train,
                       verify_lines)

REASON = netem.unavailable_reason()
needs_netem = pytest.mark.skipif(REASON is not None, reason=REASON or "")
RUN_RE = re.compile(r"run ([0-9a-f]{6})")
GBIT = 1e9


def netem_cli(*args, timeout=180, **extra_env):
    return run([sys.executable, "-m", "ddlbench.netem", *args], timeout=timeout, **extra_env)


def leftovers(run_id: str) -> list[str]:
    """Whatever of run ``run_id`` still exists: namespaces, /etc/netns entries, its state file,
    and links of the machine's own namespace carrying the id."""
    found = [ns for ns in netem.list_namespaces() if run_id in ns]
    if os.path.isdir(netem.ETC_NETNS):
        found += [f"/etc/netns/{d}" for d in os.listdir(netem.ETC_NETNS) if run_id in d]
    state = os.path.join(netem.state_dir(), f"{run_id}.json")
    if os.path.exists(state):
        found.append(state)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += [line.split(":")[1].strip() for line in links.splitlines() if run_id in line]
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def netem_runs():
    """A list the test appends its run ids to; whatever of them remains afterwards is removed
    (and so is any set whose owner died), so a failing test leaves nothing behind."""
    ids: list[str] = []
    yield ids
    if REASON is None:
        for run_id in ids:
            netem._remove_namespaces([ns for ns in netem.list_namespaces() if run_id in ns])
            try:
                os.unlink(os.path.join(netem.state_dir(), f"{run_id}.json"))
            except OSError:
                pass
        netem.cleanup_stale()


def run_ids(text: str) -> list[str]:
    return sorted(set(RUN_RE.findall(text)))


# --------------------------------------------------------------------------- no root needed

@pytest.mark.parametrize("spec,words", [
    ("fastest", "unknown network profile 'fastest'"),
    ("rate=0gbit", "rate must be positive"),
    ("rate=-1gbit", "rate must be positive"),
    ("0mbit", "rate must be positive"),
    ("rate=1gbyte", "malformed rate '1gbyte'"),
    ("rate=fast", "malformed rate 'fast'"),
    ("rate=1gbit,burst=lots", "malformed burst"),
    ("rate=1gbit,colour=red", "malformed network spec"),
    ("rate=", "malformed network spec"),
    ("target=10gbit,speedup=0", "speedup must be positive"),
    ("target=10gbit", "needs both target_rate and speedup"),
])
def test_bad_net_is_one_line_exit_2(spec, words):
    proc = netem_cli("probe", "--net", spec, timeout=60)
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("ddlbench: error: "), \
        describe(proc)
    assert words in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("module", ["ddlbench.train", "ddlbench.measure.profiler"])
def test_training_script_and_profiler_refuse_bad_net(module):
    proc = run([sys.executable, "-m", module, *TINY_BERT, "--nworkers", "2",
                "--net", "rate=0mbit"], timeout=120)
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.strip().count("\n") == 0, describe(proc)
    assert proc.stderr.startswith("ddlbench: error: rate must be positive"), describe(proc)


@pytest.mark.parametrize("launcher", ["horovod", "bytescheduler"])
def test_shell_launcher_maps_net_to_the_local_spawner(launcher):
    proc = run(["bash", f"{REPO}/{launcher}/horovod_mpi_cj.sh"], timeout=120, nworkers="2",
               dnn="bert_tiny", bs="4", net="fastest")
    assert proc.returncode == 2, describe(proc)
    assert "-m ddlbench.train --nworkers 2 --net fastest" in proc.stderr
    assert "mpirun" not in proc.stderr and "unknown network profile" in proc.stderr
    if launcher == "bytescheduler":  # the scheduler's settings travel with it
        assert "--method bytescheduler" in proc.stderr and "--credit 16000000" in proc.stderr


def test_horovod_engine_refuses_an_emulated_network():
    proc = run(["bash", f"{REPO}/horovod/horovod_mpi_cj.sh"], timeout=120, nworkers="2",
               dnn="bert_tiny", bs="4", net="1gbit", engine="horovod",
               HOROVOD_PY=sys.executable)
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.strip().splitlines()[-1] == (
        "horovod/horovod_mpi_cj.sh: error: net= (an emulated cluster) runs on engine=torch or "
        "deepspeed only")


def test_profiles_rates_and_scaling(tmp_path, monkeypatch):
    assert netem.resolve(None).loopback and netem.resolve("loopback").loopback
    assert netem.resolve("1gbit").rate_bps == 1e9
    assert netem.resolve("2.5gbit").rate_bps == 2.5e9
    assert netem.resolve("5gbit").rate_bps == 5e9
    p = netem.resolve("rate=300mbit,burst=256kb")
    assert (p.rate_bps, p.burst) == (300e6, 256 * 1024)
    assert netem.resolve("300mbit").rate_bps == 300e6
    # Scaling: rate = target / speedup, and the record says how.
    s = netem.resolve("target=10gbit,speedup=200")
    assert s.rate_bps == pytest.approx(50e6) and s.speedup == 200
    d = s.describe()
    assert d["target_rate_bps"] == 10e9 and "target_rate / speedup" in d["scaling"]
    assert netem.resolve("10gbe-scaled-200x").rate_bps == pytest.approx(50e6)
    # A user's file adds and overrides profiles.
    extra = tmp_path / "mine.yaml"
    extra.write_text("profiles:\n  lab: {rate: 750mbit}\n  1gbit: {rate: 900mbit}\n")
    monkeypatch.setenv("DDLBENCH_NETWORKS", str(extra))
    assert netem.resolve("lab").rate_bps == 750e6 and netem.resolve("1gbit").rate_bps == 900e6
    extra.write_text("profiles:\n  lab: {rate: 750mbit, speed: 3}\n")
    with pytest.raises(UsageError, match="unknown key"):
        netem.resolve("lab")
    extra.write_text("profiles: [\n")
    with pytest.raises(UsageError, match="malformed YAML"):
        netem.resolve("lab")


def test_names_fit_the_kernel_and_carry_the_run_id():
    c = netem.Cluster(netem.MAX_HOSTS, netem.resolve("1gbit"), run_id="abcdef")
    names = [h.ifname for h in c.hosts] + [c.port(i) for i in range(c.nhosts)] + [c.bridge]
    assert all(len(n) <= 15 and "abcdef" in n for n in names)
    assert all("abcdef" in ns for ns in c.namespaces)
    assert len({h.address for h in c.hosts}) == c.nhosts
    assert all(h.address.startswith("198.18.") for h in c.hosts)
    with pytest.raises(UsageError):
        netem.Cluster(netem.MAX_HOSTS + 1, netem.resolve("1gbit"))


def test_probe_warns_when_more_than_10_percent_off(monkeypatch, tmp_path, capsys):
    """A probe more than 10% slow is probed again (a busy machine only measures a shaped link
    slower), up to 3 in all, keeping the fastest; one too fast or within 10% stands; a warning
    when the kept one is more than 10% off."""
    lines = []
    monkeypatch.setattr(netem.Cluster, "up", lambda self, log=None: self)
    monkeypatch.setattr(netem.Cluster, "down", lambda self: None)
    for rates, kept, probes, warned in (([0.93e9], 0.93e9, 1, False),
                                        ([0.85e9, 0.95e9], 0.95e9, 2, False),
                                        ([0.85e9, 0.86e9, 0.84e9], 0.86e9, 3, True),
                                        ([0.80e9, 0.70e9, 0.89e9], 0.89e9, 3, True),
                                        ([1.15e9], 1.15e9, 1, True)):
        lines.clear()
        left = list(rates)

        def probe(cluster, seconds):
            m = left.pop(0)
            return {"kind": "tcp stream host 1 -> host 0", "seconds": 1.0, "bytes": 0,
                    "rate_bps": m * 1448 / 1514, "wire_rate_bps": m, "configured_bps": 1e9,
                    "deviation": m / 1e9 - 1, "within_tolerance": abs(m / 1e9 - 1) <= 0.1}
        monkeypatch.setattr(netem.probe, "probe_stream", probe)
        cluster = netem.start(2, "1gbit", log=lines.append)
        assert not left, rates                  # every probe it was given, and no more
        assert any("warning" in ln for ln in lines) == warned, lines
        info = json.loads(cluster.env(1)["DDLBENCH_NET_INFO"])
        assert info["probe"]["wire_rate_bps"] == kept and info["rate_bps"] == 1e9
        assert info["probe"]["probes"] == probes
        # python -m ddlbench.netem probe keeps the same probe (a CI run's 3-host stream came
        # out 19% slow on a busy machine when the command probed only once).
        left = list(rates)
        monkeypatch.setattr(netem_command, "require", lambda: None)
        out = tmp_path / f"probe{len(rates)}_{kept}.json"
        assert netem_command.main(["probe", "--net", "1gbit", "--json", str(out)]) == 0
        assert not left, rates
        stream = json.loads(out.read_text())["stream"]
        assert stream["wire_rate_bps"] == kept and stream["probes"] == probes
        printed = capsys.readouterr().out
        assert ("warning" in printed) == warned, printed
        assert (f"the fastest of {probes} probes" in printed) == (probes > 1), printed


def test_unavailable_reasons(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "needs root" in netem.unavailable_reason()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(netem.links, "_which", lambda tool: None)
    assert "needs iproute2" in netem.unavailable_reason()
    with pytest.raises(netem.NetemError, match="iproute2"):
        netem.require()
    assert netem.start(2, "loopback") is None  # loopback needs neither


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _pythons() -> list[str]:
    """Interpreters of this Python's version, this one first: a venv under a root home (mode
    700) is not one another user can start; the system's usually is."""
    version = "python%d.%d" % sys.version_info[:2]
    found = [sys.executable, getattr(sys, "_base_executable", sys.executable)]
    found += [os.path.join(d, version) for d in ("/usr/bin", "/usr/local/bin")]
    return [p for i, p in enumerate(found) if os.path.isfile(p) and p not in found[:i]]


def unprivileged_python(tmp_root: str, pythons=None) -> tuple[list[str], dict]:
    """A command that runs Python as user nobody with ddlbench importable, and its
    environment. ddlbench is copied to a folder anyone can read (the clone may be in a root
    home). Skips only where setpriv is missing or no interpreter of this version can be started
    by another user; ddlbench.netem failing to import there is a failure."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed: cannot drop to an unprivileged user")
    tried = []
    for python in _pythons() if pythons is None else pythons:
        # (its standard library too: one that cannot read its own home may fall back on
        # another's, or on none)
        proc = subprocess.run([*NOBODY, python, "-c", "import json, socket, subprocess"],
                              cwd="/", capture_output=True, text=True, timeout=60)
        if proc.returncode == 0:
            break
        why = proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"]
        tried.append(f"{python}: {why[-1]}")
    else:
        pytest.skip("no Python %d.%d that user nobody can start: %s"
                    % (*sys.version_info[:2], "; ".join(tried)))
    os.chmod(tmp_root, 0o755)
    for folder in ("ddlbench", "configs"):   # (configs/networks.yaml: the profiles)
        shutil.copytree(os.path.join(REPO, folder), os.path.join(tmp_root, folder),
                        ignore=shutil.ignore_patterns("__pycache__"))
    for d, dirs, files in os.walk(tmp_root):
        for name in dirs + files:
            os.chmod(os.path.join(d, name), 0o755)
    e = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": tmp_root,
         "PYTHONDONTWRITEBYTECODE": "1", "HOME": tmp_root}
    proc = subprocess.run([*NOBODY, python, "-c", "import ddlbench.netem"], cwd=tmp_root,
                          env=e, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"ddlbench.netem does not import as user nobody with " \
        f"{python}:\n{describe(proc)}"
    return [*NOBODY, python], e


def test_not_root_is_one_line():
    if os.geteuid() != 0:
        proc = netem_cli("probe", "--net", "1gbit", timeout=60)
    else:
        root = tempfile.mkdtemp(prefix="ddlbench-nobody-")
        try:
            cmd, e = unprivileged_python(root)
            proc = subprocess.run([*cmd, "-m", "ddlbench.netem", "probe", "--net", "1gbit"],
                                  cwd=root, env=e, capture_output=True, text=True, timeout=60)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.count("\n") == 1 and "needs root" in proc.stderr, describe(proc)


@pytest.mark.skipif(os.geteuid() != 0, reason="drops from root to user nobody: needs root")
def test_an_import_error_as_the_unprivileged_user_fails_and_does_not_skip(monkeypatch):
    """The injected fault: ddlbench.netem fails to import in the copy nobody runs."""
    real = shutil.copytree

    def broken_copy(src, dst, *args, **kw):
        out = real(src, dst, *args, **kw)
        if os.path.basename(dst) == "netem":
            with open(os.path.join(dst, "__init__.py"), "a") as f:
                f.write("\nimport ddlbench_no_such_module\n")
        return out
    monkeypatch.setattr(shutil, "copytree", broken_copy)
    root = tempfile.mkdtemp(prefix="ddlbench-nobody-")
    try:
        with pytest.raises(AssertionError, match="does not import as user nobody"):
            try:
                unprivileged_python(root)
            except pytest.skip.Exception as skipped:
                pytest.fail(f"skipped where it should fail: {skipped}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="drops from root to user nobody: needs root")
def test_no_interpreter_nobody_can_start_is_the_one_skip():
    """An interpreter that does not start as user nobody is passed over, and when none is
    left the skip names each one tried and why."""
    root = tempfile.mkdtemp(prefix="ddlbench-nobody-")
    try:
        os.chmod(root, 0o755)
        python = os.path.join(root, "python")
        with open(python, "w") as f:
            f.write("#!/bin/sh\necho 'cannot read its home' >&2\nexit 1\n")
        os.chmod(python, 0o755)
        with pytest.raises(pytest.skip.Exception,
                           match=f"no Python .* user nobody can start: {python}: cannot read"):
            unprivileged_python(root, pythons=[python])
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- emulated cluster

@needs_netem
@pytest.mark.parametrize("hosts", [2, 3])
def test_allreduce_bus_bandwidth_at_1gbit(hosts, tmp_path, netem_runs):
    """A shaped link never carries more than its rate (15% over at most: the probe's own
    measuring), and a machine busy elsewhere only measures it slower (CI ran a 3-host stream
    19% slow; the same probe on the idle machine, back to back: all-reduces 6% to 33% slow):
    one probe, its rates at most 15% over 1 Gbit/s and at least half of it, a bound of what
    was shaped (bits for bytes would be 8 times off), not of the machine's pace."""
    out = tmp_path / "probe.json"
    proc = netem_cli("probe", "--net", "1gbit", "--hosts", str(hosts), "--allreduce",
                     "--bytes", "16M", "--iters", "4", "--seconds", "1", "--json", str(out))
    netem_runs += run_ids(proc.stdout + proc.stderr)
    assert proc.returncode == 0, describe(proc)
    res = json.loads(out.read_text())
    ar, stream = res["allreduce"], res["stream"]
    assert ar["bytes"] == 16 << 20 and len(ar["times_s"]) == 4
    assert -0.5 <= ar["busbw_bps"] / GBIT - 1 <= 0.15, ar
    # The tbf limits frames (IP packet and Ethernet header): payload is at most MSS/(MTU+14).
    assert stream["mss"] + 52 == stream["mtu"] == 1500, stream     # TCP timestamps on
    assert stream["wire_rate_bps"] == stream["rate_bps"] * 1514 / 1448
    assert stream["deviation"] == round(stream["wire_rate_bps"] / GBIT - 1, 4)
    assert -0.5 <= stream["deviation"] <= 0.15, stream
    assert res["net"]["hosts"] == hosts and res["net"]["rate_bps"] == GBIT
    assert res["net"]["run_id"] == netem_runs[-1] and not any(map(leftovers, netem_runs))


@needs_netem
def test_wfbp_verifies_over_2_5gbit(netem_runs):
    proc = train(*TINY_BERT, "--nworkers", "2", "--net", "2.5gbit", "--verify", "2",
                 "--method", "wfbp")
    netem_runs += run_ids(proc.stderr)
    assert proc.returncode == 0, describe(proc)
    steps = verify_lines(proc.stdout)["wfbp"]
    assert [s[0] for s in steps] == [1, 2] and all(s[3] for s in steps), proc.stdout
    assert "2 emulated hosts, profile 2.5gbit" in proc.stderr and "probe: tcp stream" in proc.stderr
    assert len(netem_runs) == 1 and not leftovers(netem_runs[0])


@needs_netem
def test_ps_per_machine_over_1gbit(tmp_path, netem_runs):
    """2 emulated machines x 2 workers (--slots 2) and a server on a host of its own: the
    server receives exactly one push per machine per partition. (The same layout verifies
    without emulation in test_ps.py's reference cells.)"""
    machines = ["--nworkers", "4", "--slots", "2", "--nservers", "1", "--net", "1gbit"]
    out = tmp_path / "rec.json"
    proc = train(*TINY_BERT, *machines, "--method", "wfbpps", "--num-warmup-batches", "1",
                 "--num-batches-per-iter", "1", "--num-iters", "1", "--output", str(out),
                 timeout=280, DDLBENCH_NET_PROBE_S="0.3")
    netem_runs += run_ids(proc.stderr)
    assert proc.returncode == 0, describe(proc)
    assert "3 emulated hosts, profile 1gbit" in proc.stderr   # 2 worker machines, 1 server
    rec = json.loads(out.read_text())
    assert rec["method"]["pushers"] == [0, 2] and rec["net"]["hosts"] == 3
    server, = rec["servers"]
    steps = 2   # warm-up 1, timed 1 x 1
    assert server["pushes_received"] == 2 * rec["method"]["partitions"] * steps
    assert server["bytes_received"] == 2 * rec["model"]["gradient_bytes"] * steps
    assert len(netem_runs) == 1 and not any(leftovers(r) for r in netem_runs)


@needs_netem
@pytest.mark.parametrize("slots,hosts", [(None, 2), ("1", 2), ("2", 1)])
def test_profiler_measures_the_interference_over_the_emulated_link(slots, hosts, tmp_path,
                                                                   netem_runs, load_json):
    """The profiler's workers run as emulated hosts with --net, as the training script's do,
    --slots to a host as its --slots places them: the profile records the link, the slots and
    the hosts the spawner raised (one worker per host without --slots, both on one with
    --slots 2), and both slowdowns of the CPU interference. Across hosts its all-reduces cross
    the 1 Gbit/s link (alone and beside compute, none faster than the link carries a ring's
    share of their bytes beyond the shaper's burst; over loopback they take a tenth of that)."""
    out = tmp_path / "prof.json"
    proc = run([sys.executable, "-m", "ddlbench.measure.profiler", *TINY_BERT, "--nworkers", "2",
                *(["--slots", slots] if slots else []),
                "--net", "1gbit", "--network", "lan", "--warmup", "0", "--iters", "1",
                "--comm-iters", "2", "--interference-iters", "1", "--timeout", "60",
                "--output", str(out)], timeout=240, DDLBENCH_NET_PROBE_S="0.3")
    netem_runs += run_ids(proc.stderr)
    assert proc.returncode == 0, describe(proc)
    prof = load_json(out)
    net, x = prof["net"], prof["interference"]
    assert (net["profile"], net["emulated"], net["hosts"], prof["network"], prof["slots"]) == \
        ("1gbit", True, hosts, "lan", slots and int(slots))
    assert x["bytes"] == max(t["bytes"] for t in prof["tensors"])   # the word embeddings
    assert all(isinstance(x[k], float) for k in ("compute_slowdown", "comm_slowdown")), x
    assert len(x["per_rank"]) == 2
    if hosts == 2:
        floor = (bus_factor("allreduce", 2) * x["bytes"] - net["burst_bytes"]) * 8 / GBIT
        assert floor > 0.002
        assert x["comm_s"] >= floor and x["comm_beside_compute_s"] >= floor, (x, floor)
    assert len(netem_runs) == 1 and not leftovers(netem_runs[0])


@needs_netem
def test_overlap_orders_the_methods_over_1gbit(tmp_path, netem_runs):
    """The timeline against the cost model on an emulated 1 Gbit/s link, 2 workers each in a
    namespace of its own: bspa2a all-reduces the whole gradient after backward, so it hides
    (close to) nothing and its exposed time is the ring all-reduce's, M / rate for 2 workers at
    the probed rate, within 25%; wfbp, fusion and ddp with 1 MB buckets (their defaults, 64 and
    25 MB, hold all 17.7 MB of BERT-Tiny in one bucket: no overlap, as the cost model says) and
    mgwfbp start all-reduces during backward and hide a part, never all: the word embeddings'
    gradient, 88% of the bytes, is ready last and nothing computes after it. The merged trace's
    aligned clocks line the all-reduces' ends up across the namespaces."""
    # One job times the methods one after the other on the same emulated hosts (fusion's
    # threshold and DDP's bucket cap are theirs alone; a trace file routes DDP's buckets
    # through the suite's hook).
    chosen = ["bspa2a", "wfbp", "fusion", "mgwfbp", "ddp"]
    proc = train(*FULL_TINY_BERT, *QUICK_TIMING, "--nworkers", "2", "--net", "1gbit",
                 "--method", ",".join(chosen), "--threshold", "1000000", "--bucket-cap-mb", "1",
                 "--output", str(tmp_path / "{method}.json"),
                 "--timeline", str(tmp_path / "{method}.trace.json"),
                 timeout=600, DDLBENCH_NET_PROBE_S="0.5")
    netem_runs += run_ids(proc.stderr)
    assert proc.returncode == 0, describe(proc)
    got = {m: (json.loads((tmp_path / f"{m}.json").read_text()),
               json.loads((tmp_path / f"{m}.trace.json").read_text())) for m in chosen}
    assert got["fusion"][0]["method"]["threshold_bytes"] == 1000000
    assert got["ddp"][0]["config"]["bucket_cap_mb"] == 1
    rec, trace = got["bspa2a"]
    bsp = rec["timeline"]["mean"]
    # The ring all-reduce's time: each link carries bus_factor x M (M for 2 workers).
    ring_s = (rec["model"]["gradient_bytes"] * bus_factor("allreduce", 2) * 8
              / rec["net"]["probe"]["rate_bps"])
    assert bsp["overlap"] < 0.05, bsp
    # (Not less exposed time: on this small model at 1 Gbit/s wfbp's 46 messages' start-ups
    # can cost more than the backward pass hides, as the cost model says.)
    for method in ("wfbp", "fusion", "mgwfbp", "ddp"):
        m = got[method][0]["timeline"]
        assert m["comm_observed"] and bsp["overlap"] + 0.02 < m["mean"]["overlap"] < 0.9, \
            (method, m["mean"], bsp)
    # One all-reduce per step on each rank: its end is the same moment on both (the ring's
    # last exchange), up to the clock offsets' uncertainty and a few ms of wake-up.
    ends = {}
    for e in trace["traceEvents"]:
        if e.get("cat") == "comm":
            ends.setdefault(e["pid"], []).append((e["ts"] + e["dur"], e["dur"]))
    assert sorted(ends) == [0, 1] and len(ends[0]) == len(ends[1]) == 4, ends
    slack_us = sum(trace["metadata"]["uncertainty_us"].values()) + 5000
    transfer_us = []
    for (end0, dur0), (end1, dur1) in zip(sorted(ends[0]), sorted(ends[1])):
        assert abs(end0 - end1) <= slack_us, (end0, end1, slack_us)
        # The rank that reached the all-reduce last spent it on the transfer alone (the
        # other's span also holds its wait for that rank to finish backward).
        transfer_us.append(min(dur0, dur1))
    exposed_s = statistics.median(transfer_us) / 1e6   # all of it exposed (overlap ~0)
    assert 0.75 <= exposed_s / ring_s <= 1.25 and ring_s * 1e6 > 10 * slack_us, \
        (transfer_us, ring_s, slack_us)
    assert len(netem_runs) == 1 and not leftovers(netem_runs[0])


def start_long_run(tmp_path):
    """A 2-worker run at 1gbit that would take minutes; returns once both workers train."""
    out, err = open(tmp_path / "out", "w"), open(tmp_path / "err", "w")
    proc = subprocess.Popen([sys.executable, "-m", "ddlbench.train", *TINY_BERT, "--nworkers",
                             "2", "--net", "1gbit", "--method", "wfbp", "--timeout", "60",
                             "--num-warmup-batches", "100000"],
                            cwd=REPO, env=env(DDLBENCH_NET_PROBE_S="0.3"), stdout=out,
                            stderr=err)
    deadline = time.monotonic() + 120
    while "Running warmup" not in (tmp_path / "out").read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the run did not start (exit {proc.poll()}):\n"
                                 f"{(tmp_path / 'err').read_text()[-2000:]}")
        time.sleep(0.2)
    ids = run_ids((tmp_path / "err").read_text())
    assert len(ids) == 1, (tmp_path / "err").read_text()
    pids = [int(p) for i in range(2) for p in subprocess.run(
        ["ip", "netns", "pids", f"{netem.NS_PREFIX}{ids[0]}-h{i}"], capture_output=True,
        text=True).stdout.split()]
    assert len(pids) == 2, pids
    return proc, ids[0], pids


def wait_gone(pids, timeout=30):
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


@needs_netem
@pytest.mark.parametrize("how", ["sigkill-worker", "sigint-launcher"])
def test_killed_run_leaves_nothing(how, tmp_path, netem_runs, monkeypatch):
    proc, run_id, pids = start_long_run(tmp_path)
    netem_runs.append(run_id)
    assert leftovers(run_id)  # the set exists while it runs
    # A cleanup keeping its state elsewhere knows nothing of this run, but leaves it alone:
    # its workers are running in it.
    monkeypatch.setenv("DDLBENCH_NETEM_STATE", str(tmp_path / "other-state"))
    assert run_id not in netem.cleanup_stale()
    monkeypatch.delenv("DDLBENCH_NETEM_STATE")
    assert leftovers(run_id) and not any(not alive(p) for p in pids)
    if how == "sigkill-worker":
        os.kill(pids[1], signal.SIGKILL)
    else:
        proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=60)
    # SIGINT: 128 + 2; a killed worker: its 137, or its peer's failure if that came first
    assert code == 130 if how == "sigint-launcher" else code != 0
    assert not leftovers(run_id)
    assert not wait_gone(pids)


@needs_netem
def test_stale_set_of_a_killed_launcher_is_removed_at_next_start(tmp_path, netem_runs,
                                                                 load_json):
    proc, run_id, pids = start_long_run(tmp_path)
    netem_runs.append(run_id)
    # A set every guard of which is gone: the run's watcher (`netem reap`) killed first (as an
    # OOM killer or `kill -9 -1` would), the workers stopped (still there for the cleanup to
    # find, their parent-death SIGTERM pending, not using the CPU meanwhile), then the launcher.
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    reapers = [p for p in psutil.process_iter(["cmdline"])
               if "reap" in (p.info["cmdline"] or []) and run_id in (p.info["cmdline"] or [])]
    assert len(reapers) == 1
    reapers[0].kill()  # (a zombie until the launcher, its parent, is gone)
    proc.kill()  # SIGKILL: no chance to clean up
    proc.wait(timeout=30)
    assert any(ns.endswith("-sw") for ns in leftovers(run_id))  # stale, workers orphaned
    # The next run: it removes the stale set first, then runs, and records the network.
    out = tmp_path / "rec.json"
    nxt = train(*TINY_BERT, *QUICK_TIMING, "--nworkers", "2", "--net", "1gbit",
                "--method", "fusion", "--output", str(out))
    netem_runs += run_ids(nxt.stderr)
    assert nxt.returncode == 0, describe(nxt)
    assert f"did not clean up: {run_id}" in nxt.stderr, describe(nxt)
    assert not leftovers(run_id)
    assert not wait_gone(pids)  # the orphaned workers were stopped with their namespaces
    net = load_json(out)["net"]
    assert net["profile"] == "1gbit" and net["emulated"] and net["rate_bps"] == GBIT
    assert net["hosts"] == 2 and net["run_id"] != run_id and net["run_id"] in netem_runs
    # The record carries this run's probe as it measured it, and the run warned exactly when it
    # was more than the tolerance (10%) off. (How close a shaped link comes to its rate is
    # test_allreduce_bus_bandwidth_at_1gbit's to check; CI, busy, once measured this one 11% slow
    # three probes running.)
    probe = net["probe"]
    assert probe["configured_bps"] == GBIT and 1 <= probe["probes"] <= 3, probe
    assert probe["deviation"] == round(probe["wire_rate_bps"] / GBIT - 1, 4), probe
    off = abs(probe["wire_rate_bps"] / GBIT - 1)
    assert probe["within_tolerance"] == (off <= netem.probe.PROBE_TOLERANCE), probe
    assert ("warning: the probe's" in nxt.stderr) != probe["within_tolerance"], describe(nxt)
    assert all(not leftovers(r) for r in netem_runs)


@needs_netem
def test_sigterm_of_the_probe_cleans_up(netem_runs):
    proc = subprocess.Popen([sys.executable, "-m", "ddlbench.netem", "probe", "--net", "1gbit",
                             "--seconds", "60"], cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        ids = run_ids(first)
        netem_runs += ids
        assert len(ids) == 1, first
        time.sleep(1.0)  # the probe's helpers are running in the namespaces
        assert leftovers(ids[0])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not leftovers(ids[0])
