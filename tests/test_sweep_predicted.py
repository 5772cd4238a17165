"""benchmarks.py --predict-only: a sweep's cells predicted by the performance model
(ddlbench/sweep/predicted.py), stored and reported like measured tries, nothing run."""
import json
import os
from dataclasses import replace

import pytest

import benchmarks
from ddlbench.model import predict, simulate, topology
from ddlbench.measure.profile_file import read_profile
from ddlbench.sweep import store

from .conftest import REPO

PROFILE = os.path.join(REPO, "configs", "profiles", "h200_resnet50_bs64.json")


def _sweep(tmp_path, text):
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return str(path)


def test_every_cell_is_the_simulators_prediction(tmp_path, capsys):
    path = _sweep(tmp_path, """
name: pred
networks: [{rdma: 0}, {rdma: 1}]
tasks: [{model: resnet50, batch_size: 64}]
methods: [wfbp, {method: fusion, threshold: 8388608}, bspps, {method: wfbp, compressor: fp16,
          label: wfbp-fp16}, bytescheduler]
nworkers: [1, 4, 8]
engines: [torch, horovod]
timing: {batches_per_iter: 3}
predict: {device_throughput: {resnet50: 253.1}}
""")
    out = tmp_path / "out"
    assert benchmarks.main(["--config", path, "--predict-only", "--results", str(out),
                            "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "engine(s) horovod left out" in err and "30 cells predicted" in err
    entries, bad = store.read(store.store_path(str(out)))
    assert bad == 0 and entries[0]["kind"] == "sweep" and entries[0]["predicted"]
    tries = entries[1:]
    assert len(tries) == 2 * 5 * 3 and all(e["status"] == "ok" for e in tries)
    prof = read_profile(PROFILE)
    work = predict.rescaled(predict.workload_of(prof), 64, 253.1)
    for e in tries:
        cfg = e["config"]
        P, mid = cfg["nworkers"], cfg["method"]["method"]
        net = topology.load({0: "survey-10gbe", 1: "survey-100gib"}[cfg["network"]["profile"]])
        if mid == "bspps" and P <= 4:
            # one machine (4 devices each): no server, BytePS's local all-reduce (bspa2a)
            p = simulate.predict("bspa2a", work, net.link("allreduce", P))
            assert e["predicted"]["ps_local"] == "bspa2a"
        elif mid == "bspps":
            p = simulate.predict(mid, work, None, servers=net.ps(P), local=net.local_reduce(P))
            assert e["predicted"]["ps_local"] is None
        elif mid == "bytescheduler":     # a timing round of the sweep's 3 steps
            p = simulate.predict(mid, work, net.link("allreduce", P), batches_per_iter=3)
        else:
            codec = simulate.Codec(cfg["method"].get("compressor", "none"), P)
            p = simulate.predict(mid, work, net.link("allreduce", P), codec=codec,
                                 threshold=cfg["method"].get("threshold", 64 << 20))
        assert e["throughput"] == pytest.approx(p.throughput(64, P), rel=1e-12), e["cell"]
        assert e["predicted"]["bottleneck"] == p.bottleneck
        assert e["record"]["timeline"]["mean"] == pytest.approx(p.metrics)
    # one worker, no communication cost: the rescaled device's throughput (BSP-PS too: one
    # worker is one machine, no server)
    one = [e for e in tries if e["config"]["nworkers"] == 1 and e["label"] in ("wfbp", "bspps")]
    assert [round(e["throughput"], 6) for e in one] == [253.1] * 4
    readme = (out / "README.md").read_text()
    assert "(predicted)" in readme and "not measured" in readme
    assert not os.path.exists(os.path.join(str(out), "records"))     # nothing ran
    # ranked by the model's figures, no interval, tied only where the figures are equal (at
    # 1 worker every method is the device's 253.1): at 8 workers each network has one (best),
    # the highest prediction, and the conclusion says so
    from ddlbench.sweep import aggregate
    table = aggregate.load(str(out))
    for rows in aggregate.groups(table).values():
        for n in (1, 4, 8):
            rk = aggregate.ranking(rows, n)
            top = max(r.cells[n].median for r in rows if n in r.cells)
            assert rk.best.cells[n].median == top
            assert all(r.cells[n].median == top for r in rk.tied)
            assert {r.cells[n].basis for r in rows if n in r.cells} == {"model"}
        assert aggregate.ranking(rows, 8).distinguishable
    assert "by the model's prediction" in readme and "their intervals overlap" not in readme
    # predictions are remade whole: a second run leaves one set of lines
    assert benchmarks.main(["--config", path, "--predict-only", "--results", str(out),
                            "--quiet", "--only", "nworkers=4"]) == 0
    assert len(store.read(store.store_path(str(out)))[0]) == 1 + 10


def test_the_paper_preset_predicts_without_a_cluster(tmp_path, capsys):
    out = tmp_path / "paper"
    assert benchmarks.main(["--config", "paper", "--predict-only", "--results", str(out),
                            "--quiet", "--only", "model=resnet50,nworkers<=4"]) == 0
    entries, _ = store.read(store.store_path(str(out)))
    thr = {(e["config"]["network"]["profile"], e["label"], e["config"]["nworkers"]):
           e["throughput"] for e in entries[1:]}
    # the survey's 1-GPU throughput, as the preset's device_throughput: survey asks
    assert thr[(0, "bspa2a", 1)] == pytest.approx(253.1, rel=1e-12)
    assert len(thr) == 3 * 7 * 2
    assert json.loads((out / "predicted.json").read_text())["predict"] == \
        {"device_throughput": "survey"}


@pytest.mark.parametrize("text,message", [
    ("networks: [local]\n", "no network description for network local"),
    ("networks: [{rdma: 0}]\npredict: {profiles: {resnet50: /nonexistent.json}}\n",
     "cannot read MG-WFBP profile /nonexistent.json"),
    ("networks: [{rdma: 0}]\npredict: {gpu: 1}\n", "predict: unknown key 'gpu'"),
    ("networks: [{rdma: 0}]\ntasks: [{model: resnet50, batch_size: 32}]\n",
     "no profile of resnet50 at batch 32"),
])
def test_what_a_prediction_lacks_is_one_line(tmp_path, capsys, text, message):
    tasks = "" if "tasks" in text else "tasks: [{model: resnet50, batch_size: 64}]\n"
    path = _sweep(tmp_path, f"name: bad\n{tasks}methods: [wfbp]\nnworkers: [2]\n{text}")
    assert benchmarks.main(["--config", path, "--predict-only", "--results",
                            str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not os.path.exists(tmp_path / "out" / "results.jsonl")


# ---------------------------------------------------------------------------- calibrate: true

def _comm_record(P, alpha, beta, op="allreduce", **extra):
    return {"kind": "comm_bench", "nworkers": P, "results": [
        {"op": op, "nworkers": P, "fit": {"alpha_s": alpha, "beta_s_per_byte": beta}, **extra}]}


# each network's all-reduce fit, and its burst: one at a time c1 a message over the line, all
# at once c2 more for each message that waited
FITS = {"loopback": (1e-4, 1e-9), "1gbit": (2e-4, 8e-9)}
BURST_COSTS = {"loopback": (1e-3, 2e-3), "1gbit": (3e-3, -1e-3)}
# the CPU interference each network's profile measured (over loopback the cores carry the
# all-reduces; over 1 Gbit/s the link sets their pace)
INTERFERENCE = {"loopback": (0.7, 0.9), "1gbit": (0.3, 0.04)}
# each network's push/pull queueing cost per byte of a partition waiting behind another
QUEUED = {"loopback": 1e-9, "1gbit": 2e-10}


def _calibrated(folder, jobs, ps_interference: dict | None = None) -> dict:
    """The calibration ``jobs``' files in ``folder``, as the profiler, codec_bench and
    comm_bench write them, each with its ok line in the store; returns the profile of the
    first network (each network's has that network's ``INTERFERENCE``, and where
    ``ps_interference`` names the network, that ``interference_ps``)."""
    (folder / "calibration").mkdir(parents=True)
    prof = json.loads(open(PROFILE).read())
    prof.update(model="resnet18", workload={"batch_size": 8, "image_size": 32},
                optimizer_s=0.004)
    fits, costs = FITS, BURST_COSTS
    burst_sizes = [4096, 8192, 4096]
    first = None
    for j in jobs:
        net = j.network.name
        if j.kind == "profile":
            kappa, mu = INTERFERENCE[net]
            body = dict(prof, network=net, interference={
                "compute_slowdown": kappa, "comm_slowdown": mu, "bytes": 4096})
            if net in (ps_interference or {}):
                body["interference_ps"] = ps_interference[net]
            first = first or body
        elif j.kind == "codec":     # as codec_bench --output writes it
            body = {"models": {"resnet18": {"compressors": {"powersgd": {
                "encode_s_per_element": 2e-9, "decode_s_per_element": 1e-9}}}}}
        elif j.kind == "comm":
            body = _comm_record(2, *fits[net])
        elif j.kind == "burst":
            a, b = fits[net]
            one = sum(a + b * m for m in burst_sizes) + 3 * costs[net][0]
            body = {"kind": "comm_bench", "nworkers": 2, "results": [
                {"op": "burst", "nworkers": 2, "sizes": burst_sizes, "one_at_a_time_s": one,
                 "burst_s": one + 2 * costs[net][1]}]}
        else:   # its two partitions in flight took QUEUED's cost per byte of the second
            a, b = fits[net]
            pipeline = simulate.ServerLinks(a / 2, b, 0.0, 1, 2).message(8192000, 4096000)
            rows = [{"size_bytes": 8192000, "time_s": pipeline + QUEUED[net] * 4096000}]
            body = _comm_record(2, a, 2 * b, op="pushpull", nservers=1, rows=rows,
                                partition_bytes=4096000, ps_clients="machine", pushers=[0, 1])
        (folder / "calibration" / f"{j.name}.json").write_text(json.dumps(body))
        store.append(store.store_path(str(folder)), {"kind": "calibration", "job": j.name,
                                                     "status": "ok"})
    return first


def test_a_calibrated_sweep_predicts_each_cell_before_its_tries(tmp_path, monkeypatch, capsys):
    """calibrate: true: the jobs a sweep needs (a profile per network, task and workers;
    a compressor's codec time per task, workers and settings; comm_bench per network and
    workers, timing each size by its mean; a burst of the task's tensors per network and
    workers of the all-to-all cells; push/pull for PS cells on several machines: over the
    loopback the workers are on one machine and a PS method runs no server), each run once (a job with its
    file and an ok line is not run again: here all are, so nothing but the fake tries runs);
    every cell's prediction from those files alone, in the store before the tries, and beside
    the measurement in README, CSV and a plot."""
    from ddlbench.sweep import calibrate, config as sweep_config
    monkeypatch.setenv(sweep_config.PROGRAM_ENV, "tests.fake_train")
    results = tmp_path / "results"
    path = _sweep(tmp_path, f"""
name: cal
networks: [loopback, {{net: 1gbit}}, {{rdma: 0}}]
tasks: [{{model: resnet18, batch_size: 8, image_size: 32}}]
methods: [wfbp, wfbpps, {{method: fusion, compressor: powersgd, powersgd_rank: 2}}]
nworkers: [2]
tries: 1
calibrate: true
results: {results}
logs: {tmp_path / 'logs'}
""")
    sweep = sweep_config.load(path, runs=False)
    cells = sweep.cells()
    jobs, notes = calibrate.jobs(cells)
    assert [j.name for j in jobs] == [
        "loopback_resnet18-bs8-px32_n2.profile", "1gbit_resnet18-bs8-px32_n2.profile",
        "resnet18-bs8-px32_n2_powersgd-powersgd_rank2.codec",
        "loopback_n2.comm", "1gbit_n2.comm",
        "loopback_resnet18-bs8-px32_n2.burst", "1gbit_resnet18-bs8-px32_n2.burst",
        "1gbit_n2_kdefault-machine.pushpull"]
    assert "rdma0 are a real cluster's" in notes[0]
    # a profile per network: its workers run over that network (the CPU interference is
    # the network's), with 8 passes each alone and beside all-reduces
    over = [jobs[i].command("OUT") for i in (0, 1)]
    assert [c[c.index("--network") + 1] for c in over] == ["loopback", "1gbit"]
    assert "--net" not in over[0] and over[1][over[1].index("--net") + 1] == "1gbit"
    assert all(c[c.index("--interference-iters") + 1] == "8" for c in over)
    # the task has a PS cell: over 1 Gbit/s (a machine per worker) its servers (one on 2
    # workers), clients and default partition, for the interference beside their push/pull;
    # over the loopback (one machine: no server) none; the compute probes start no servers
    assert "--nservers" not in over[0]
    assert over[1][over[1].index("--nservers"):over[1].index("--nservers") + 4] == [
        "--nservers", "1", "--ps-clients", "machine"]
    assert not any("--partition-bytes" in c for c in over)
    assert "--nservers" not in calibrate.Job("check", jobs[0].network, 2,
                                             of=jobs[0]).command("OUT")
    a2a = next(c for c in cells if c.architecture != "ps")
    assert "--nservers" not in calibrate.profile_job(a2a).command("OUT")
    assert calibrate.profile_job(a2a).name == jobs[0].name
    cmd = jobs[2].command("OUT")
    assert cmd[1:] == ["-m", "ddlbench.measure.codec_bench", "--model", "resnet18", "--compressor",
                       "powersgd", "--nworkers", "2", "--iters", "3", "--threads", "1",
                       "--powersgd-rank", "2", "--output", "OUT"]
    cmd = jobs[4].command("OUT")
    assert cmd[1:3] == ["-m", "ddlbench.measure.comm_bench"] and cmd[cmd.index("--net") + 1] == "1gbit"
    assert cmd[cmd.index("--max-bytes") + 1] == str(64 << 20)   # resnet18's 46.8 MB
    assert cmd[cmd.index("--stat") + 1] == "mean"
    # the all-gather too only where a compressor there gathers (PowerSGD all-reduces)
    assert cmd[cmd.index("--ops") + 1] == "allreduce"
    topk = replace(cells[0], method={"method": "fusion", "compressor": "topk"})
    comm = [j for j in calibrate.jobs([topk])[0] if j.kind == "comm"]
    assert [j.name for j in comm] == [f"{topk.network.name}_n2_allgather.comm"]
    cmd = comm[0].command("OUT")
    assert cmd[cmd.index("--ops") + 1] == "allreduce,allgather"
    # the burst: the task's model and input shape on the network
    cmd = jobs[6].command("OUT")
    assert (cmd[cmd.index("--ops") + 1], cmd[cmd.index("--model") + 1],
            cmd[cmd.index("--image-size") + 1], cmd[cmd.index("--net") + 1]) == \
        ("burst", "resnet18", "32", "1gbit")
    assert cmd[cmd.index("--stat") + 1] == "mean"     # like the per-size rows it corrects
    # push/pull: powers of two up to one partition (BytePS's 4,096,000 B) and the partition,
    # then two partitions and the task's gradient (ResNet-18's 46.8 MB), all in flight at once
    cmd = jobs[7].command("OUT")
    assert cmd[cmd.index("--ops") + 1] == "pushpull" and "--partition-bytes" not in cmd
    assert cmd[cmd.index("--max-bytes") + 1] == str(2 << 20)
    assert cmd[cmd.index("--sizes") + 1] == "4096000,8192000,46800000"
    # the calibration files, as the profiler and comm_bench write them, already there
    folder = results / "2026-01-01-cal"
    # 1 Gbit/s's profile measured the interference beside push/pulls too: the leader (rank
    # 0) slowed more than the other rank
    beside_ps = {"op": "pushpull", "ps_clients": "machine", "compute_slowdown": 1.5,
                 "comm_slowdown": 0.2, "per_rank": [[2.0, 0.2], [1.0, 0.2]]}
    prof = _calibrated(folder, jobs, {"1gbit": beside_ps})
    assert benchmarks.main(["--config", path, "--results", str(folder), "--quiet",
                            "--only", "network=loopback|1gbit"]) == 0
    entries, bad = store.read(store.store_path(str(folder)))
    assert bad == 0
    kinds = [e["kind"] for e in entries]
    preds = [e for e in entries if e["kind"] == "prediction"]
    # nothing calibrated again; the predictions come before every try
    assert kinds.count("calibration") == len(jobs) and len(preds) == 6
    assert max(i for i, k in enumerate(kinds) if k == "prediction") < kinds.index("try")
    fits, costs = FITS, BURST_COSTS
    for e in preds:
        cell = next(c for c in cells if c.hash == e["hash"])
        # the cell's network's profile: its interference
        kappa, mu = INTERFERENCE[cell.network.name]
        work = predict.workload_of(dict(prof, interference={
            "compute_slowdown": kappa, "comm_slowdown": mu}), 0.004)
        a, b = fits[cell.network.name]
        link = simulate.Link(a, b, per_message_s=costs[cell.network.name][0],
                             queued_s=costs[cell.network.name][1])
        if cell.method["method"] == "wfbpps" and cell.network.name == "loopback":
            # one machine: the local all-reduce (as BytePS), on the loopback's all-reduce
            expected = simulate.predict("wfbp", work, link)
            assert e["throughput"] != pytest.approx(simulate.predict(
                "wfbp", work, simulate.Link(a, b)).throughput(8, 2))
        elif cell.method["method"] == "wfbpps":
            servers = simulate.ServerLinks(a / 2, b, 0.0, 1, 2,
                                           queued_s_per_byte=QUEUED[cell.network.name])
            local = simulate.Link(0.0, 0.0)
            # beside push/pulls: the leader's compute
            ps_work = replace(work, compute_slowdown=2.0, comm_slowdown=0.2)
            assert e["throughput"] != pytest.approx(simulate.predict(
                "wfbpps", work, None, servers=servers, local=local).throughput(8, 2))
            work = ps_work
            expected = simulate.predict("wfbpps", work, None, servers=servers, local=local)
            # the queueing cost is in: without it the prediction differs
            assert e["throughput"] != pytest.approx(simulate.predict(
                "wfbpps", work, None, servers=simulate.ServerLinks(a / 2, b, 0.0, 1, 2),
                local=local).throughput(8, 2))
        elif cell.method["method"] == "fusion":     # the codec's times in the prediction
            expected = simulate.predict("fusion", work, link,
                                        codec=simulate.Codec("powersgd", 2,
                                                             {"powersgd_rank": 2}, 2e-9,
                                                             1e-9, None))
            assert e["throughput"] < simulate.predict("fusion", work, link,
                                                      codec=simulate.Codec(
                                                          "powersgd", 2,
                                                          {"powersgd_rank": 2}, 0.0, 0.0,
                                                          None)).throughput(8, 2)
        else:
            expected = simulate.predict("wfbp", work, link)
            # the burst's costs are in: without them the prediction differs
            assert e["throughput"] != pytest.approx(
                simulate.predict("wfbp", work, simulate.Link(a, b)).throughput(8, 2))
        assert e["throughput"] == pytest.approx(expected.throughput(8, 2), rel=1e-12)
    folder_s = str(folder)
    readme = open(os.path.join(folder_s, "README.md")).read()
    assert "## Predicted vs measured" in readme and "Median |error|" in readme
    # what the sweep says names the model's error per group (its figures: the report's own)
    assert readme.count("the model, calibrated before the runs, came within") == 2
    # the best-method score leads what the sweep says and the section (two groups here)
    lead = readme[readme.index("## What this sweep says"):].splitlines()[2]
    assert lead.startswith("The model's answer to the question: best method: the model picks "
                           "the measured best in ") and "/2 groups exactly" in lead
    section = readme[readme.index("## Predicted vs measured"):].splitlines()
    assert section[2].startswith(lead.split(": ", 1)[1].split(" (Predicted")[0])
    assert readme.count("picked the same best") >= int(lead.split(" in ")[1].split("/")[0])
    assert "plots/predicted_vs_measured.png" in readme
    assert os.path.exists(os.path.join(folder_s, "plots", "predicted_vs_measured.png"))
    header = open(os.path.join(folder_s, "results.csv")).readline().strip()
    assert header.endswith(",predicted,predicted_error")


def test_a_paced_sweep_predicts_each_try_at_the_probes_pace(tmp_path, monkeypatch):
    """pace: true: before each job of tries a pace probe (the profiler, briefly, at the job's
    task and workers) whose compute over the calibration profile's is the machine's pace; each
    of the job's cells gets that try's prediction from the same files with every compute time
    scaled by it, in the store before the try. A failed probe costs that try its paced
    prediction, never the try; a cell's paced figure needs every try's. README and CSV show
    both predictions."""
    import csv
    from ddlbench.sweep import calibrate, config as sweep_config
    monkeypatch.setenv(sweep_config.PROGRAM_ENV, "tests.fake_train")
    monkeypatch.setattr(calibrate, "PROFILER", "tests.fake_profiler")
    monkeypatch.setenv("FAKE_PACE", json.dumps({"wfbp_n2_try0": 1.5, "wfbp_n2_try1": 0.8,
                                                "fusion_n2_try0": 2.0,
                                                "fusion_n2_try1": "fail"}))
    path = _sweep(tmp_path, f"""
name: paced
networks: [loopback]
tasks: [{{model: resnet18, batch_size: 8, image_size: 32}}]
methods: [wfbp, fusion]
nworkers: [2]
tries: 2
calibrate: true
pace: true
results: {tmp_path / 'results'}
logs: {tmp_path / 'logs'}
""")
    sweep = sweep_config.load(path, runs=False)
    assert sweep.pace
    cells = sweep.cells()
    folder = tmp_path / "results" / "2026-01-01-paced"
    prof = _calibrated(folder, calibrate.jobs(cells)[0])
    # the calibration profile of both ranks: rank 1 computes 1.1 times as long
    rank0 = prof["forward_s"] + sum(prof["backward_s"])
    prof["rank_compute_s"] = [rank0, 1.1 * rank0]
    profile = folder / "calibration" / "loopback_resnet18-bs8-px32_n2.profile.json"
    profile.write_text(json.dumps(prof))
    monkeypatch.setenv("FAKE_PROFILE", str(profile))
    # the probe's command: the profiler at the job's placement, briefly, compute alone
    cmd = calibrate.pace_job([cells[0]], 1).command("OUT")
    assert cmd[1:3] == ["-m", "tests.fake_profiler"]
    assert cmd[cmd.index("--iters") + 1] == "4" and "--no-interference" in cmd
    assert cmd[cmd.index("--nworkers") + 1] == "2" and cmd[cmd.index("--model") + 1] == \
        "resnet18"
    assert benchmarks.main(["--config", path, "--results", str(folder), "--quiet"]) == 0
    entries, bad = store.read(store.store_path(str(folder)))
    assert bad == 0
    probes = {e["job"]: e for e in entries if e["kind"] == "calibration"
              and e["job"].endswith(".pace")}
    assert sorted(probes) == [f"loopback_resnet18-bs8-px32_{m}_n2_try{i}.pace"
                              for m in ("fusion", "wfbp") for i in (0, 1)]
    assert probes["loopback_resnet18-bs8-px32_fusion_n2_try1.pace"]["status"] == "failed"
    assert probes["loopback_resnet18-bs8-px32_wfbp_n2_try0.pace"]["pace"] == \
        pytest.approx(1.5, rel=1e-12)
    tries = {(e["cell"].split("_")[-2], e["try"]): e for e in entries if e["kind"] == "try"}
    assert len(tries) == 4 and all(e["status"] == "ok" for e in tries.values())
    paced = {(e["cell"].split("_")[-2], e["try"]): e for e in entries
             if e["kind"] == "prediction" and "try" in e}
    assert sorted(paced) == [("fusion", 0), ("wfbp", 0), ("wfbp", 1)]
    kinds = [(e["kind"], e.get("cell"), e.get("try")) for e in entries]
    a, b = FITS["loopback"]
    link = simulate.Link(a, b, per_message_s=BURST_COSTS["loopback"][0],
                         queued_s=BURST_COSTS["loopback"][1])
    work = predict.workload_of(prof, 0.004)
    for (method, i), e in paced.items():
        pace = {("wfbp", 0): 1.5, ("wfbp", 1): 0.8, ("fusion", 0): 2.0}[(method, i)]
        assert e["pace"] == pytest.approx(pace, rel=1e-12) and e["attempt"] == 1
        # the probe's pace, and the calibration's slowest rank (the probe's own spread, the
        # same here, does not count twice)
        expected = simulate.predict(method, predict.scaled(work, pace * 1.1, host=True), link)
        assert e["throughput"] == pytest.approx(expected.throughput(8, 2), rel=1e-9)
        # before its try, after the probe
        assert kinds.index(("prediction", e["cell"], i)) < kinds.index(("try", e["cell"], i))
    assert paced[("wfbp", 0)]["throughput"] < paced[("wfbp", 1)]["throughput"]
    # the prediction before the tries is unpaced, one per cell
    static = [e for e in entries if e["kind"] == "prediction" and "try" not in e]
    assert len(static) == 2 and all(e["predicted"]["pace"] == 1.0 for e in static)
    assert all(e["predicted"]["slowest_rank"] == pytest.approx(1.1) for e in static)
    assert static[0]["throughput"] == pytest.approx(simulate.predict(
        static[0]["cell"].split("_")[-2], predict.scaled(work, 1.1, host=True),
        link).throughput(8, 2), rel=1e-9)
    # reports: the wfbp cell's paced figure is the mean of its tries' (the sweep's statistic)
    readme = open(folder / "README.md").read()
    table = readme[readme.index("## Predicted vs measured"):].splitlines()
    row = next(x for x in table if x.startswith("| ResNet-18") and "| wfbp |" in x)
    measured = (tries[("wfbp", 0)]["throughput"] + tries[("wfbp", 1)]["throughput"]) / 2
    q = (paced[("wfbp", 0)]["throughput"] + paced[("wfbp", 1)]["throughput"]) / 2
    assert f"| {q:.1f} | {100 * (q - measured) / measured:+.1f}% |" in row
    row = next(x for x in table if x.startswith("| ResNet-18") and "| fusion |" in x)
    assert "| - |  |" in row                  # a try without a paced prediction
    assert f"Paced: median |error| {100 * abs(q - measured) / measured:.1f}% over 1 cell" \
        in readme
    rows = list(csv.DictReader(open(folder / "results.csv")))
    by = {(r["method"], int(r["try"])): r for r in rows}
    assert float(by[("wfbp", 0)]["pace"]) == pytest.approx(1.5)
    assert float(by[("wfbp", 0)]["paced_predicted"]) == pytest.approx(
        paced[("wfbp", 0)]["throughput"], rel=1e-4)
    assert by[("fusion", 1)]["paced_predicted"] == "" and by[("fusion", 1)]["predicted"]


def test_pace_needs_calibrate(tmp_path, capsys):
    path = _sweep(tmp_path, """
name: nocal
networks: [loopback]
tasks: [{model: resnet18, batch_size: 8}]
methods: [wfbp]
nworkers: [2]
pace: true
""")
    assert benchmarks.main(["--config", path, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "pace: true needs calibrate: true" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("pace", [0.0, -1.0, float("inf"), float("nan")])
def test_a_pace_must_be_a_positive_number(pace):
    from ddlbench.errors import UsageError
    from ddlbench.sweep.predicted import Predictor
    with pytest.raises(UsageError, match="a pace must be a positive number"):
        Predictor(None, pace=pace)


def test_the_calibration_check_times_the_calibration_again_after_the_tries(
        tmp_path, monkeypatch, capsys):
    """calibration_check (on with calibrate, tolerance 0.2): after the tries each profile and
    comm job this session ran is timed again at its placement (the compute alone, as a pace
    probe; the all-reduce at 1-16 MiB); its time over the calibration's is in the store, a
    probe more than 20% off either way is marked and said on stderr, its job runs once more
    and the cells that read it are predicted again (marked (r)); a failed probe says why and
    breaks nothing, a failed second calibration leaves the first in place; jobs done before
    this session are not probed. Every job's and try's line carries the CPU time the
    hypervisor stole meanwhile."""
    import psutil
    from ddlbench.sweep import calibrate, config as sweep_config
    monkeypatch.setenv(sweep_config.PROGRAM_ENV, "tests.fake_train")
    monkeypatch.setattr(calibrate, "PROFILER", "tests.fake_profiler")
    monkeypatch.setattr(calibrate, "COMM_BENCH", "tests.fake_comm_bench")
    path = _sweep(tmp_path, f"""
name: checked
networks: [loopback, {{net: 1gbit}}]
tasks: [{{model: resnet18, batch_size: 8, image_size: 32}}]
methods: [wfbp]
nworkers: [2]
tries: 1
calibrate: true
results: {tmp_path / 'results'}
logs: {tmp_path / 'logs'}
""")
    sweep = sweep_config.load(path, runs=False)
    assert sweep.calibration_check == 0.2
    cells = sweep.cells()
    jobs = calibrate.jobs(cells)[0]
    folder = tmp_path / "results" / "2026-01-01-checked"
    _calibrated(folder, jobs)
    # the bursts were calibrated before (their lines stay); profiles and links run now
    store_file = store.store_path(str(folder))
    kept = [ln for ln in open(store_file) if ".burst" in ln]
    open(store_file, "w").writelines(kept)
    template = tmp_path / "profile.json"
    template.write_text((folder / "calibration" /
                         "loopback_resnet18-bs8-px32_n2.profile.json").read_text())
    monkeypatch.setenv("FAKE_PROFILE", str(template))
    monkeypatch.setenv("FAKE_FITS", json.dumps(FITS))
    # 1gbit's link calibrated slow (twice its time), then as usual; after the tries
    # loopback's link 1.15 times as slow as calibrated (inside 20%) and 1gbit's half (off:
    # calibrated again); loopback's compute 1.5 times (off, and its second calibration
    # fails: the first stands); 1gbit's compute probe fails
    monkeypatch.setenv("FAKE_CALLS", str(tmp_path))
    monkeypatch.setenv("FAKE_LINK", json.dumps({"loopback_n2.comm.check": 1.15,
                                                "1gbit_n2.comm.check": 1.0,
                                                "1gbit_n2.comm": [2.0, 1.0]}))
    monkeypatch.setenv("FAKE_PACE", json.dumps({
        "loopback_resnet18-bs8-px32_n2.profile.check": 1.5,
        "loopback_resnet18-bs8-px32_n2.profile": [1.0, "fail"],
        "1gbit_resnet18-bs8-px32_n2.profile.check": "fail"}))
    # the probes' commands: the compute alone at the profile's placement and network; the
    # all-reduce at the powers of two from 1 to 16 MiB (at most the comm job's largest)
    by = {j.name: j for j in jobs}
    cmd = calibrate.Job("check", by["1gbit_n2.comm"].network, 2,
                        of=by["1gbit_n2.comm"]).command("OUT")
    assert cmd[1:3] == ["-m", "tests.fake_comm_bench"] and cmd[-4:] == [
        "--max-bytes", str(16 << 20), "--min-bytes", str(1 << 20)]
    assert cmd[cmd.index("--ops") + 1] == "allreduce" and cmd[cmd.index("--net") + 1] == \
        "1gbit"
    small = calibrate.Job("check", by["1gbit_n2.comm"].network, 2,
                          of=calibrate.Job("comm", by["1gbit_n2.comm"].network, 2,
                                           max_bytes=1 << 16)).command("OUT")
    assert small[-4:] == ["--max-bytes", str(1 << 16), "--min-bytes", str(1 << 16)]
    prof = by["1gbit_resnet18-bs8-px32_n2.profile"]
    cmd = calibrate.Job("check", prof.network, 2, of=prof).command("OUT")
    assert cmd == calibrate.Job("pace", prof.network, 2, task=prof.task,
                                tag="x").command("OUT")
    assert "--no-interference" in cmd and cmd[cmd.index("--net") + 1] == "1gbit"

    assert benchmarks.main(["--config", path, "--results", str(folder),
                            "--progress", "lines"]) == 0
    err = capsys.readouterr().err
    entries, bad = store.read(store_file)
    assert bad == 0
    kinds = [(e["kind"], e.get("job")) for e in entries]
    probes = {e["checks"]: e for e in entries if e.get("checks")}
    assert sorted(probes) == ["1gbit_n2.comm", "1gbit_resnet18-bs8-px32_n2.profile",
                              "loopback_n2.comm", "loopback_resnet18-bs8-px32_n2.profile"]
    # after the tries
    last_try = max(i for i, (k, _) in enumerate(kinds) if k == "try")
    assert all(kinds.index(("calibration", e["job"])) > last_try for e in probes.values())
    assert all(e["job"] == f"{e['checks']}.check" for e in probes.values())
    ratios = {k: e.get("ratio") for k, e in probes.items()}
    assert ratios["loopback_n2.comm"] == pytest.approx(1.15, rel=1e-12)
    assert ratios["1gbit_n2.comm"] == pytest.approx(0.5, rel=1e-12)
    assert ratios["loopback_resnet18-bs8-px32_n2.profile"] == pytest.approx(1.5, rel=1e-12)
    assert probes["loopback_n2.comm"]["sizes"] == [1 << k for k in range(20, 25)]
    a, b = FITS["1gbit"]
    assert probes["1gbit_n2.comm"]["calibrated_s"] == pytest.approx(
        2 * sum(a + b * (1 << k) for k in range(20, 25)), rel=1e-12)
    assert sorted(k for k, e in probes.items() if e.get("off")) == [
        "1gbit_n2.comm", "loopback_resnet18-bs8-px32_n2.profile"]
    failed = probes["1gbit_resnet18-bs8-px32_n2.profile"]
    assert failed["status"] == "failed" and "ratio" not in failed
    # the two off calibrated again after the probes; the cell reading the link predicted
    # again from the new one (the old beside it); the profile's second run failed: its first
    # calibration is back in place and its cell keeps its prediction
    tail = entries[max(i for i, e in enumerate(entries) if e.get("checks")) + 1:]
    assert [(e["kind"], e.get("job") or e.get("cell"), e["status"] if "status" in e else
             e.get("recalibrated")) for e in tail] == [
        ("calibration", "loopback_resnet18-bs8-px32_n2.profile", "failed"),
        ("calibration", "1gbit_n2.comm", "ok"),
        ("prediction", "1gbit_resnet18-bs8-px32_wfbp_n2", ["1gbit_n2.comm"])]
    assert all(e["recalibrated"] is True for e in tail[:2])
    cal = folder / "calibration"
    assert json.loads((cal / "loopback_resnet18-bs8-px32_n2.profile.json").read_text()) == \
        json.loads(template.read_text())
    assert not (cal / "loopback_resnet18-bs8-px32_n2.profile.before-check.json").exists()
    before = json.loads((cal / "1gbit_n2.comm.before-check.json").read_text())
    now = json.loads((cal / "1gbit_n2.comm.json").read_text())
    assert before["results"][0]["fit"]["alpha_s"] == pytest.approx(2 * a, rel=1e-12)
    assert now["results"][0]["fit"]["alpha_s"] == pytest.approx(a, rel=1e-12)
    first = {e["cell"]: e["throughput"] for e in entries if e["kind"] == "prediction"
             and not e.get("recalibrated")}
    new = tail[2]["throughput"]
    assert len(first) == 2 and new > first["1gbit_resnet18-bs8-px32_wfbp_n2"]
    assert [ln for ln in err.splitlines() if "calibration check" in ln] == [
        "benchmarks.py: calibration check: loopback_resnet18-bs8-px32_n2.profile took 1.50 "
        "times as long now as in the calibration: calibrating it again",
        "benchmarks.py: calibration check: 1gbit_n2.comm took 0.50 times as long now as in "
        "the calibration: calibrating it again",
        "benchmarks.py: calibration check: 1 cell(s) predicted again; calibrating "
        "loopback_resnet18-bs8-px32_n2.profile again failed (its first calibration stands)"]
    # the hypervisor's steal on every command's line (None where the kernel has none)
    ran = [e for e in entries if e["kind"] == "try" or (
        e["kind"] == "calibration" and ".burst" not in e["job"])]
    assert len(ran) == 2 + 4 + 4 + 2 and all("cpu_steal" in e for e in ran)
    has_steal = hasattr(psutil.cpu_times(), "steal")
    assert all((0 <= e["cpu_steal"] <= 1) if has_steal else e["cpu_steal"] is None
               for e in ran)
    readme = open(folder / "README.md").read()
    section = readme[readme.index("## Calibration check"):]
    section = section[:section.index("\n## ")]
    assert "| 1gbit_n2.comm | " in section and \
        "| 0.50 | **off**: calibrated again |" in section
    assert "| loopback_n2.comm | " in section and "| 1.15 |  |" in section
    assert "| 1.50 | **off**: calibrating again failed, the first calibration stands |" in \
        section
    assert "| 1gbit_resnet18-bs8-px32_n2.profile | - | none: exit code 1 |" in section
    assert "2 of 3 probes off by more than 20%." in section
    assert ("CPU time stolen by the hypervisor" in section) == has_steal
    table = readme[readme.index("## Predicted vs measured"):readme.index(
        "## Calibration check")]
    row = next(x for x in table.splitlines() if "| 1gbit (emulated) |" in x)
    assert f"| {new:.1f} (r) |" in row, row
    row = next(x for x in table.splitlines() if "| loopback |" in x)
    assert "(r)" not in row and "(r): predicted again after the tries" in table
    # a session that calibrates nothing probes nothing, and predicts nothing again
    assert benchmarks.main(["--config", path, "--results", str(folder), "--quiet"]) == 0
    entries = store.read(store_file)[0]
    assert sum(bool(e.get("checks")) for e in entries) == 4
    assert sum(e["kind"] == "prediction" for e in entries) == 3
    # by hand: a job's file deleted, the next session runs it, predicts the cells that read
    # it again (the 1gbit cell; not loopback's), probes it, and the latest prediction is the
    # one reported
    os.unlink(cal / "1gbit_n2.comm.json")
    monkeypatch.setenv("FAKE_LINK", json.dumps({"1gbit_n2.comm": 0.5}))
    assert benchmarks.main(["--config", path, "--results", str(folder), "--quiet"]) == 0
    entries = store.read(store_file)[0]
    again = entries[len(entries) - 3:]
    assert [(e["kind"], e.get("job") or e.get("cell")) for e in again] == [
        ("calibration", "1gbit_n2.comm"), ("prediction", "1gbit_resnet18-bs8-px32_wfbp_n2"),
        ("calibration", "1gbit_n2.comm.check")]
    assert again[2]["ratio"] == pytest.approx(1.0, rel=1e-12) and not again[2]["off"]
    assert again[1]["throughput"] > new
    readme = open(folder / "README.md").read()
    table = readme[readme.index("## Predicted vs measured"):].splitlines()
    row = next(x for x in table if "| 1gbit (emulated) |" in x)
    assert f"| {again[1]['throughput']:.1f} |" in row, row


def test_steal_is_the_share_of_all_cpu_time_given_to_other_guests():
    from collections import namedtuple
    from ddlbench.sweep.runner import steal_share
    T = namedtuple("T", "user nice system idle iowait irq softirq steal guest guest_nice")
    before = T(100, 0, 50, 800, 0, 0, 0, 10, 5, 0)
    # 200 jiffies passed, 20 of them stolen; guest time (inside user) is not counted twice
    after = T(160, 0, 70, 900, 0, 0, 0, 30, 45, 0)
    assert steal_share(before, after) == 0.1
    assert steal_share(before, before) is None
    Old = namedtuple("Old", "user system idle")      # a kernel that does not say
    assert steal_share(Old(1, 1, 1), Old(2, 2, 2)) is None


def _one_cell(tmp_path, text: str) -> str:
    """A sweep file of one wfbp cell with ``text``'s keys."""
    return _sweep(tmp_path, f"""
name: check
networks: [loopback]
tasks: [{{model: resnet18, batch_size: 8}}]
methods: [wfbp]
nworkers: [2]
{text}
""")


@pytest.mark.parametrize("text, message", [
    ("calibrate: true\ncalibration_check: -0.1", "calibration_check must be false or a "
                                                  "fraction >= 0"),
    ("calibrate: true\ncalibration_check: yes please", "calibration_check must be false"),
    ("calibrate: true\ncalibration_check: true", "calibration_check must be false"),
    ("calibration_check: 0.2", "calibration_check needs calibrate: true"),
])
def test_a_bad_calibration_check_is_one_line(tmp_path, capsys, text, message):
    path = _one_cell(tmp_path, text)
    assert benchmarks.main(["--config", path, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("text, tolerance", [
    ("calibrate: true", 0.2), ("calibrate: true\ncalibration_check: false", 0.0),
    ("calibrate: true\ncalibration_check: 0.5", 0.5), ("calibrate: false", 0.0),
    ("calibration_check: false", 0.0)])
def test_the_calibration_check_is_on_with_calibrate(tmp_path, text, tolerance):
    from ddlbench.sweep import config as sweep_config
    sweep = sweep_config.load(_one_cell(tmp_path, text), runs=False)
    assert sweep.calibration_check == tolerance
    assert sweep.header()["calibration_check"] == tolerance


def test_an_extrapolating_sweep_calibrates_the_smallest_count_and_predicts_the_rest(
        tmp_path, monkeypatch):
    """extrapolate: true (issue 45 item 3): the calibration jobs are those of 2 workers only,
    none of 3 or 4; the cells of 3 and 4 workers are predicted from them: the all-reduce as
    the measured ring's steps at more workers (the bursts' per-message and queueing costs
    kept), the compute slowed as the workers share the cores (2 here: 1.5 and 2 times), and
    push/pull with as many more pushers and servers as workers; the README gives the error
    by worker count."""
    from ddlbench.collectives import ring_collective, ring_link
    from ddlbench.hosts import pinning
    from ddlbench.sweep import calibrate, config as sweep_config
    monkeypatch.setenv(sweep_config.PROGRAM_ENV, "tests.fake_train")
    monkeypatch.setattr(pinning, "available_cores", lambda: [0, 1])
    results = tmp_path / "results"
    path = _sweep(tmp_path, f"""
name: ext
networks: [{{net: 1gbit}}]
tasks: [{{model: resnet18, batch_size: 8, image_size: 32}}]
methods: [wfbp, wfbpps]
nworkers: [2, 3, 4]
threads: 1
tries: 1
calibrate: true
extrapolate: true
calibration_check: false
results: {results}
logs: {tmp_path / 'logs'}
""")
    sweep = sweep_config.load(path, runs=False)
    cells = sweep.cells()
    jobs, _ = calibrate.jobs(cells)
    assert [j.name for j in jobs] == [
        "1gbit_resnet18-bs8-px32_n2_t1.profile", "1gbit_n2.comm",
        "1gbit_resnet18-bs8-px32_n2.burst", "1gbit_n2_kdefault-machine.pushpull"]
    folder = results / "2026-01-01-ext"
    prof = _calibrated(folder, jobs)
    assert benchmarks.main(["--config", path, "--results", str(folder), "--quiet"]) == 0
    entries, bad = store.read(store.store_path(str(folder)))
    kinds = [e["kind"] for e in entries]
    assert bad == 0 and kinds.count("calibration") == len(jobs)     # nothing else calibrated
    preds = {(e["cell"].split("_")[-2], int(e["cell"].split("_n")[-1])): e
             for e in entries if e["kind"] == "prediction"}
    assert sorted(preds) == [(m, n) for m in ("wfbp", "wfbpps") for n in (2, 3, 4)]
    a, b = FITS["1gbit"]
    c1, c2 = BURST_COSTS["1gbit"]
    kappa, mu = INTERFERENCE["1gbit"]
    base = predict.workload_of(dict(prof, interference={"compute_slowdown": kappa,
                                                        "comm_slowdown": mu}), 0.004)
    for (method, n), e in preds.items():
        work = predict.scaled(base, n / 2, host=True) if n > 2 else base
        step = ring_link("allreduce", a, b, 2)
        link = simulate.Link(*ring_collective("allreduce", step["alpha_s"],
                                              step["beta_s_per_byte"], n),
                             per_message_s=c1, queued_s=c2)
        if method == "wfbp":
            expected = simulate.predict("wfbp", work, link)
        else:
            servers = simulate.ServerLinks(a / 2, b, 0.0, 1 if n == 2 else 2, n,
                                           queued_s_per_byte=QUEUED["1gbit"])
            expected = simulate.predict("wfbpps", work, None, servers=servers,
                                        local=simulate.Link(0.0, 0.0))
        assert e["throughput"] == pytest.approx(expected.throughput(8, n), rel=1e-9), (method, n)
        assert e["predicted"].get("calibrated_at") == (None if n == 2 else 2)
        assert e["predicted"].get("sharing") == (None if n == 2 else n / 2)
    readme = (folder / "README.md").read_text()
    assert "Extrapolated (extrapolate: true): calibrated at 2 workers only" in readme
    assert "Median |error| by workers: 2: " in readme and "; 4: " in readme


def test_extrapolate_needs_calibrate_and_no_pace(tmp_path, capsys):
    for extra, message in (("", "extrapolate: true needs calibrate: true"),
                           ("calibrate: true\npace: true\n",
                            "pace: true and extrapolate: true do not go together")):
        path = _sweep(tmp_path, "name: bad\ntasks: [{model: resnet18, batch_size: 8}]\n"
                                f"methods: [wfbp]\nnworkers: [2, 4]\nextrapolate: true\n{extra}")
        assert benchmarks.main(["--config", path, "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err


def test_mgwfbp_plans_from_the_calibration_profile_when_asked(tmp_path, capsys):
    """``mgwfbp_profile: calibration``: each MG-WFBP run gets its cell's calibration profile
    (in the results folder; a placeholder in a dry run) instead of profiling again, the file
    the cell's prediction reads; without calibrate (or with extrapolate, which calibrates
    another worker count, or beside a real cluster's network, calibrated by hand) it is one
    line and exit 2."""
    from ddlbench.sweep import calibrate, config as sweep_config, runner
    text = ("name: mg\nnetworks: [loopback]\ntasks: [{model: resnet18, batch_size: 8}]\n"
            "methods: [wfbp, {method: mgwfbp, mgwfbp_profile: calibration}]\nnworkers: [2]\n")
    sweep = sweep_config.load(_sweep(tmp_path, text + "calibrate: true\n"), runs=False)
    mg = next(c for c in sweep.cells() if c.method["method"] == "mgwfbp")
    profile = calibrate.profile_job(mg)
    assert profile.name in [j.name for j in calibrate.jobs(sweep.cells())[0]]
    res = str(tmp_path / "res")
    cmd, _ = runner.job_command(sweep, [mg], "REC", calibrate.profile_file(mg, res))
    assert cmd[cmd.index("--mgwfbp-profile") + 1] == profile.path(res)
    assert calibrate.profile_file(mg, None) == f"<calibration>/{profile.name}.json"
    for extra in ("nworkers: [2]\n", "calibrate: true\nextrapolate: true\nnworkers: [2, 3]\n",
                  "calibrate: true\nnworkers: [2]\nnetworks: [loopback, rdma0]\n"):
        path = _sweep(tmp_path, text.replace("nworkers: [2]\n", "").replace(
            "networks: [loopback]\n", "" if "networks" in extra else "networks: [loopback]\n")
            + extra)
        assert benchmarks.main(["--config", path, "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "mgwfbp_profile: calibration plans from the " \
            "calibration's profile" in err, err
