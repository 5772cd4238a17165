"""One path into the performance model (issue 45): the command line (``python -m
ddlbench.model.predict``), the sweep (``benchmarks.py --predict-only``'s and a calibrated sweep's
``Predictor.predict``) and the validation against the survey (``validation.validate``) give
the same numbers on the same cells, exactly: all three call ``ddlbench.model.cell.predict``,
where the one-machine rule, the PS clients, MG-WFBP's plan and the 1-worker cells are decided.
No torch."""
import dataclasses
import json
import os

import pytest

from ddlbench.errors import UsageError
from ddlbench.model import cell, predict, simulate, survey, topology, validation
from ddlbench.measure.profile_file import read_profile
from ddlbench.planning import ORIGINAL_AB_TABLES, merge_groups
from ddlbench.sweep import config as sweep_config
from ddlbench.sweep.predicted import Predictor

from .conftest import REPO

PROFILE = os.path.join(REPO, "configs", "profiles", "h200_resnet50_bs64.json")
COUNTS = (1, 4, 8, 16)
RDMAS = (0, 1)
NAMES = {0: "survey-10gbe", 1: "survey-100gib"}
# the survey's PS methods and the all-reduce method each runs as on one machine (4 GPUs)
LOCAL = {"bspps": "bspa2a", "wfbpps": "wfbp", "byteschedulerps": "wfbp"}


def _sweep(tmp_path, text: str):
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return sweep_config.load(str(path), runs=False)


def _work():
    """ResNet-50's H200 profile at the survey's 1-GPU figure (as every path builds it)."""
    return predict.rescaled(predict.workload_of(read_profile(PROFILE)), 64,
                            survey.single_gpu("resnet50"))


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """(rdma, method, P) -> (the sweep's store line, the validation's row, the CLI's entry)
    for every survey method at 1, 4, 8 and 16 workers over 10GbE and 100Gb InfiniBand, with
    the paper preset's settings (MG-WFBP planned with the original's table, a timing round
    of 10 batches)."""
    tmp = tmp_path_factory.mktemp("grid")
    sweep = _sweep(tmp, "name: grid\nextends: paper\nnetworks: [{rdma: 0}, {rdma: 1}]\n"
                        "tasks: [{model: resnet50, batch_size: 64}]\nnworkers: [1, 4, 8, 16]\n")
    predictor = Predictor(sweep)
    swept = {(c.network.profile, c.method["method"], c.nworkers): predictor.predict(c)
             for c in sweep.cells()}
    published = {(c["rdma"], c["method"], c["nworkers"]): c for c in survey.cells()
                 if c["model"] == "resnet50"}
    cells = [published.get((r, m, p)) or {
        "model": "resnet50", "batch_size": 64, "rdma": r, "network": NAMES[r], "method": m,
        "original": m, "nworkers": p, "throughput": survey.single_gpu("resnet50") * p}
        for r in RDMAS for m in survey.methods() for p in COUNTS]
    rows = {(r["rdma"], r["method"], r["nworkers"]): r
            for r in validation.validate("topology", cells)["rows"]}
    cli = {}
    for r in RDMAS:
        out = tmp / f"cli{r}.json"
        assert predict.main(["--profile", PROFILE, "--topology", NAMES[r], "--device-throughput",
                             str(survey.single_gpu("resnet50")), "--nworkers", "1,4,8,16",
                             "--method", ",".join(survey.methods()), "--num-batches-per-iter",
                             "10", "--mgwfbp-ab", "table", "--ab-network", f"rdma{r}",
                             "--output", str(out)]) == 0
        for e in json.loads(out.read_text())["predictions"]:
            cli[(r, e["method"], e["nworkers"])] = e
    return {k: (swept[k], rows[k], cli[k]) for k in swept}


def test_the_three_paths_agree_on_every_survey_method_and_worker_count(grid, capsys):
    assert len(grid) == len(RDMAS) * 7 * len(COUNTS)
    for key, (line, row, entry) in grid.items():
        assert line["throughput"] == row["predicted"] == entry["throughput"], key
        assert line["predicted"]["iteration_s"] == row["iteration_s"] == \
            entry["iteration_s"], key
        assert line["predicted"]["ps_local"] == row.get("ps_local"), key
        assert line["predicted"]["notes"] == row.get("model_notes", []), key
        assert line["record"]["timeline"]["mean"] == entry["metrics"], key
        # the interval too (issue 62: the survey files' stated ranges, no profile spread)
        assert line["interval"] == row["interval"] == entry["interval"], key
        assert line["predicted"]["interval_from"] == row["interval_from"] == \
            entry["interval_from"], key
    widened = [k for k, (line, _, _) in grid.items()
               if line["interval"][0] < line["throughput"] < line["interval"][1]]
    assert {p for _, _, p in widened} == {4, 8, 16}


def test_ps_cells_on_one_machine_are_the_local_all_reduce(grid):
    """4 GPUs (one machine of 4) and 1 GPU: no server, the PS method's all-reduce method;
    8 and 16: servers."""
    for (r, m, p), (line, _, _) in grid.items():
        if m in LOCAL:
            assert line["predicted"]["ps_local"] == (LOCAL[m] if p <= 4 else None)
            if p <= 4:
                assert line["throughput"] == grid[(r, LOCAL[m], p)][0]["throughput"]
    net = topology.load(NAMES[0])
    work = _work()
    p = simulate.predict("bspps", work, None, servers=net.ps(8), local=net.local_reduce(8))
    assert grid[(0, "bspps", 8)][0]["throughput"] == p.throughput(64, 8)


def test_one_gpu_cells_train_at_the_devices_throughput(grid):
    """Nothing crosses a network at 1 worker, PS methods included (BERT-Large's 1-GPU PS
    cells were 6.1 samples/s against 49 while they pushed through a server)."""
    ones = {k: v[0]["throughput"] for k, v in grid.items() if k[2] == 1}
    assert len(ones) == 14
    assert {round(x, 9) for x in ones.values()} == {survey.single_gpu("resnet50")}


def test_mgwfbp_plans_with_the_originals_table_and_is_costed_on_the_network(grid):
    work = _work()
    for r, table in ((0, "10Gbps"), (1, "56Gbps")):
        net = topology.load(NAMES[r])
        a, b = ORIGINAL_AB_TABLES[table][8]
        groups = merge_groups(work.backward_s, work.nbytes, a, b, 8192 * 4)
        want = simulate.replay(work, net.link("allreduce", 8), groups, method="mgwfbp")
        line = grid[(r, "mgwfbp", 8)][0]
        assert line["throughput"] == want.throughput(64, 8)
        assert line["predicted"]["notes"][0].startswith(
            f"planned with the original's {table} alpha-beta table at P = 8")
    # on the link it is costed on, the plan differs here: the table decides
    linked = simulate.predict("mgwfbp", work, topology.load(NAMES[0]).link("allreduce", 16))
    assert grid[(0, "mgwfbp", 16)][0]["throughput"] != linked.throughput(64, 16)


def test_compressed_cells_are_the_same_from_the_cli_and_the_sweep(tmp_path):
    """fp16 and TopK (an all-gather, with the codec's encode and decode per element) at 8
    workers, from the command line and the sweep alike, against the simulator's replay."""
    codec = tmp_path / "codec.json"
    codec.write_text(json.dumps({"models": {"resnet50": {"compressors": {
        "topk": {"encode_s_per_element": 2e-10, "decode_s_per_element": 1e-10},
        "fp16": {"encode_s_per_element": 1e-11, "decode_s_per_element": 1e-11}}}}}))
    sweep = _sweep(tmp_path, f"""
name: comp
networks: [{{rdma: 0}}]
tasks: [{{model: resnet50, batch_size: 64}}]
methods: [{{method: wfbp, compressor: fp16}}, {{method: bspa2a, compressor: topk}}]
nworkers: [8]
predict: {{device_throughput: survey, codec: {codec}}}
""")
    swept = {c.method["method"]: Predictor(sweep).predict(c) for c in sweep.cells()}
    net, work = topology.load(NAMES[0]), _work()
    for method, comp in (("wfbp", "fp16"), ("bspa2a", "topk")):
        out = tmp_path / f"{method}.json"
        assert predict.main(["--profile", PROFILE, "--topology", NAMES[0], "--device-throughput",
                             "253.1", "--nworkers", "8", "--method", method, "--compressor",
                             comp, "--codec", str(codec), "--output", str(out)]) == 0
        [entry] = json.loads(out.read_text())["predictions"]
        enc, dec = (2e-10, 1e-10) if comp == "topk" else (1e-11, 1e-11)
        want = simulate.predict(method, work, net.link("allreduce", 8), codec=simulate.Codec(
            comp, 8, None, enc, dec, net.link("allgather", 8) if comp == "topk" else None))
        assert swept[method]["throughput"] == entry["throughput"] == want.throughput(64, 8)


def test_measured_networks_and_forced_servers(tmp_path):
    """comm_bench files (a calibrated sweep's network): 2 workers push through the measured
    server, 1 worker is one machine; --ps-force-servers pushes on one machine too."""
    ab = tmp_path / "ab.json"
    ab.write_text(json.dumps({"kind": "comm_bench", "nworkers": 2, "results": [
        {"op": "allreduce", "nworkers": 2, "fit": {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9}},
        {"op": "pushpull", "nworkers": 2, "nservers": 1, "ps_clients": "machine",
         "pushers": 2, "fit": {"alpha_s": 2e-4, "beta_s_per_byte": 2e-9}}]}))
    # an emulated network: each worker a machine of its own, so 2 workers push to a server
    sweep = _sweep(tmp_path, "name: cal\nnetworks: [{net: 1gbit}]\ntasks: [{model: resnet50, "
                             "batch_size: 64}]\nmethods: [wfbp, wfbpps]\nnworkers: [1, 2]\n")
    predictor = Predictor(sweep, profile=PROFILE, network=str(ab))
    swept = {(c.method["method"], c.nworkers): predictor.predict(c) for c in sweep.cells()}
    out = tmp_path / "p.json"
    assert predict.main(["--profile", PROFILE, "--topology", str(ab), "--nworkers", "1,2",
                         "--method", "wfbp,wfbpps", "--output", str(out)]) == 0
    cli = {(e["method"], e["nworkers"]): e for e in json.loads(out.read_text())["predictions"]}
    net, work = topology.load(str(ab)), predict.workload_of(read_profile(PROFILE))
    want = {("wfbp", 1): simulate.predict("wfbp", work, simulate.Link(0.0, 0.0)),
            ("wfbpps", 1): simulate.predict("wfbp", work, simulate.Link(0.0, 0.0)),
            ("wfbp", 2): simulate.predict("wfbp", work, net.link("allreduce", 2)),
            ("wfbpps", 2): simulate.predict("wfbpps", work, None, servers=net.ps(2),
                                            local=net.local_reduce(2))}
    for key, p in want.items():
        assert swept[key]["throughput"] == cli[key]["throughput"] == p.throughput(64, key[1])
    assert swept[("wfbpps", 1)]["predicted"]["ps_local"] == "wfbp"
    # over the loopback the run's 2 workers are on one machine and push to no server (as
    # BytePS): the sweep predicts the local all-reduce, on the measured all-reduce link
    loop = _sweep(tmp_path, "name: cal\nnetworks: [loopback]\ntasks: [{model: resnet50, "
                            "batch_size: 64}]\nmethods: [wfbpps]\nnworkers: [2]\n")
    [line] = [Predictor(loop, profile=PROFILE, network=str(ab)).predict(c)
              for c in loop.cells()]
    assert line["predicted"]["ps_local"] == "wfbp"
    assert line["throughput"] == want[("wfbp", 2)].throughput(64, 2)
    survey_net = topology.load(NAMES[0])
    assert predict.main(["--profile", PROFILE, "--topology", NAMES[0], "--nworkers", "4",
                         "--method", "wfbpps", "--ps-force-servers", "--output", str(out)]) == 0
    [entry] = json.loads(out.read_text())["predictions"]
    assert entry["iteration_s"] == simulate.predict(
        "wfbpps", work, None, servers=survey_net.ps(4),
        local=survey_net.local_reduce(4)).iteration_s


@pytest.mark.parametrize("kwargs, message", [
    ({}, "give a network (a topology or comm_bench files) or an all-reduce alpha-beta"),
    ({"link": simulate.Link(1e-5, 1e-9), "method": "wfbpps", "nworkers": 8},
     "method wfbpps at 8 workers pushes to parameter servers: it needs a network"),
    # an options instance made without the checks (dataclasses.replace): the cell's own line
    ({"network": "survey-10gbe", "options": {"mgwfbp_ab": "guess"}},
     "MG-WFBP's alpha-beta comes from measured or table, not 'guess'"),
    ({"network": "survey-10gbe", "options": {"mgwfbp_ab": "table"}, "nworkers": 12},
     "the original's 10Gbps alpha-beta table has no entry for 12 worker(s)"),
    ({"network": "survey-10gbe", "nworkers": 0}, "a whole number of workers >= 1, got 0"),
    ({"network": "survey-10gbe", "ps_clients": "rack"}, "unknown parameter-server clients"),
    ({"network": "survey-10gbe", "method": "wfbpps",
      "codec": simulate.Codec("fp16", 8)}, "method wfbpps does not take compressor fp16"),
])
def test_bad_input_is_one_line(kwargs, message):
    kwargs = dict(kwargs)
    if isinstance(kwargs.get("network"), str):
        kwargs["network"] = topology.load(kwargs["network"])
    method, nworkers = kwargs.pop("method", "mgwfbp"), kwargs.pop("nworkers", 8)
    options = dataclasses.replace(simulate.method_class(method).Options(),
                                  **kwargs.pop("options", {}))
    with pytest.raises(UsageError) as e:
        cell.predict(method, _work(), nworkers, options, **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("args, message", [
    (["--ab-network", "rdma1"], "--ab-network names the original's table: it goes with "
                                "--mgwfbp-ab table"),
    (["--mgwfbp-ab", "table", "--nworkers", "4,12"],
     "the original's 10Gbps alpha-beta table has no entry for 12 worker(s)"),
])
def test_the_clis_plan_flags_are_checked_before_any_output(args, message, capsys):
    argv = ["--profile", PROFILE, "--topology", "survey-10gbe", "--method", "mgwfbp", *args]
    assert predict.main(argv if "--nworkers" in args else [*argv, "--nworkers", "4"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err and captured.err.count("\n") == 1


# ------------------------------------------------------------------ extrapolation (issue 62)

EXTRA_METHODS = ("bspa2a", "wfbp", "fusion", "mgwfbp", "wfbpps")


def _calibration(tmp_path):
    """A calibrated store's files at 2 workers on this 2-core machine (as the profiler and
    comm_bench write them): a CPU profile of 2 ranks (each step's passes, its CPU
    interference, the host's issue time, the machine it ran on) and a comm_bench file (the
    all-reduce with each size's rounds, push/pull through one server)."""
    prof = {"format": "ddlbench-mgwfbp-profile", "version": 1, "model": "resnet18",
            "workload": {"batch_size": 8, "image_size": 32}, "device": "cpu",
            "backend": "gloo", "network": "1gbit", "nworkers": 2,
            "tensors": [{"name": f"layer{i}.weight", "shape": [n // 4], "bytes": n}
                        for i, n in enumerate([4096, 1 << 20, 65536, 4 << 20])],
            "backward_s": [0.002, 0.004, 0.001, 0.006], "forward_s": 0.01,
            "optimizer_s": 0.003, "alpha_s": 1e-3, "beta_s_per_byte": 1e-9,
            "interference": {"compute_slowdown": 0.3, "comm_slowdown": 0.2},
            "host": {"issue_s": 4e-5, "copy_s_per_byte": 1e-10},
            "machine": {"cores": 2, "threads": 1},
            "rank_passes_s": [[0.023, 0.025, 0.021, 0.024], [0.024, 0.022, 0.026, 0.023]]}
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(prof))
    rows = [{"size_bytes": m, "time_s": 2e-4 + 8e-9 * m,
             "time_stats_s": {"min": 0.9 * (2e-4 + 8e-9 * m), "max": 1.2 * (2e-4 + 8e-9 * m)}}
            for m in (1 << 12, 1 << 16, 1 << 20)]
    ab = tmp_path / "ab.json"
    ab.write_text(json.dumps({"kind": "comm_bench", "nworkers": 2, "results": [
        {"op": "allreduce", "nworkers": 2, "rows": rows,
         "fit": {"alpha_s": 2e-4, "beta_s_per_byte": 8e-9}},
        {"op": "pushpull", "nworkers": 2, "nservers": 1, "ps_clients": "machine",
         "pushers": 2, "fit": {"alpha_s": 3e-4, "beta_s_per_byte": 1e-8}}]}))
    return str(path), str(ab)


def test_predict_extrapolate_is_the_calibrated_sweeps_prediction(tmp_path, monkeypatch):
    """``predict --extrapolate`` from a calibration at 2 workers and the sweep extrapolating
    the same files (``extrapolate: true``) give the same iteration, throughput and interval at
    2, 3 and 4 workers: the cores' sharing (1.5 and 2 times the compute at 3 and 4 workers on
    2 cores), the slowest rank, the communication thread's share and its GIL are applied in
    ``cell.predict`` for both. Before issue 62 the command line skipped the sharing and the
    slowest rank (1.6-2.1 times the sweep's throughput at 3-4 workers)."""
    from ddlbench.hosts import pinning
    monkeypatch.setattr(pinning, "available_cores", lambda: [0, 1])
    prof, ab = _calibration(tmp_path)
    sweep = _sweep(tmp_path, "name: ext\nnetworks: [{net: 1gbit}]\ntasks: [{model: resnet18, "
                             "batch_size: 8, image_size: 32}]\nmethods: [" +
                   ", ".join(EXTRA_METHODS) + "]\nnworkers: [2, 3, 4]\nthreads: 1\n")
    predictor = Predictor(sweep, profile=prof, network=ab, calibrated_at=2)
    swept = {(c.method["method"], c.nworkers): predictor.predict(c) for c in sweep.cells()}
    rounds = int(sweep.timing.get("batches_per_iter", 10))
    out = tmp_path / "cli.json"
    assert predict.main(["--profile", prof, "--topology", ab, "--extrapolate", "--nworkers",
                         "2,3,4", "--method", ",".join(EXTRA_METHODS),
                         "--num-batches-per-iter", str(rounds), "--output", str(out)]) == 0
    cli = {(e["method"], e["nworkers"]): e for e in json.loads(out.read_text())["predictions"]}
    assert sorted(swept) == sorted(cli) and len(cli) == 15
    for key, line in swept.items():
        assert line["throughput"] == cli[key]["throughput"], key
        assert line["predicted"]["iteration_s"] == cli[key]["iteration_s"], key
        assert line["interval"] == cli[key]["interval"], key
        assert line["predicted"]["notes"] == cli[key]["notes"], key
    # what was applied: the sharing of 2 cores, the slowest of 2 ranks (each step's), the GIL
    slow = sum(max(a, b) for a, b in zip(*json.loads(open(prof).read())["rank_passes_s"])) \
        / (0.023 + 0.025 + 0.021 + 0.024)
    for (method, n), e in cli.items():
        assert e["machine"]["sharing"] == {2: 1.0, 3: 1.5, 4: 2.0}[n]
        assert e["machine"]["compute"] == pytest.approx(slow * {2: 1, 3: 1.5, 4: 2}[n])
        # the thread's issues held the GIL (WFBP issues each of the 4 tensors on its thread)
        if method == "wfbp":
            assert e["machine"]["gil_s"] == pytest.approx(4 * 4e-5 * e["machine"]["compute"])
    # the compute at 4 workers is twice that at 2 (both of 2 cores' sharing): the replay's
    assert cli[("bspa2a", 4)]["metrics"]["compute_s"] > 1.9 * cli[("bspa2a", 2)]["metrics"][
        "compute_s"]


def test_the_machines_factors():
    """The communication thread's share of the cores (docs/DESIGN.md section 3): 16 cores, 4
    threads a worker, calibrated at 2 workers. At 4 the 16 training threads fit but with the 4
    communication threads they are 20 on 16 cores: compute beside communication and
    communication beside compute both 1.25 times what was measured; at 8 the compute shares the
    cores twice over (32 threads), and beside communication 1.25 times more (40), the
    communication thread 2.5 times (40 threads against the 8 communication threads alone).
    On 2 cores with 1 thread a worker, already shared at 2 workers, the share stays."""
    m = cell.Machine(cores=16, threads=4, calibrated_at=2, pace=1.5, slowest_rank=1.1)
    assert m.factors(2) == {"compute": 1.5 * 1.1, "sharing": 1.0, "slowest_rank": 1.1,
                            "kappa": 1.0, "mu": 1.0}
    four, eight = m.factors(4), m.factors(8)
    assert (four["sharing"], four["kappa"], four["mu"]) == (1.0, 1.25, 1.25)
    assert (eight["sharing"], eight["kappa"], eight["mu"]) == (2.0, 1.25, 2.5)
    assert eight["compute"] == pytest.approx(1.5 * 1.1 * 2)
    small = cell.Machine(cores=2, threads=1, calibrated_at=2)
    assert [(small.factors(n)["sharing"], small.factors(n)["kappa"], small.factors(n)["mu"])
            for n in (3, 4)] == [(1.5, 1.0, 1.0), (2.0, 1.0, 1.0)]
    # applied to a workload: its measured slowdowns (1 + s) times the factors, less 1
    work = dataclasses.replace(_work(), compute_slowdown=0.3, comm_slowdown=0.2)
    out, _ = cell.adjusted(work, simulate.NO_CODEC, eight)
    assert out.compute_slowdown == pytest.approx(1.3 * 1.25 - 1)
    assert out.comm_slowdown == pytest.approx(1.2 * 2.5 - 1)
    assert out.forward_s == pytest.approx(work.forward_s * 1.5 * 1.1 * 2)
    # cores not known (a cluster's GPUs): nothing shared
    assert cell.Machine(calibrated_at=2).factors(8)["compute"] == 1.0
    with pytest.raises(UsageError, match="the machine's cores must be a whole number >= 1"):
        cell.Machine(cores=0)
