"""The communication micro-benchmark: sizes, the alpha-beta fit, the nccl-tests style table."""
import dataclasses
import subprocess
import sys

import pytest

from ddlbench.measure import comm_bench as cb
from ddlbench.model import simulate, topology
from ddlbench.hosts import pinning
from ddlbench.errors import UsageError

from .conftest import REPO, describe, run

KIB, MIB = 1024, 1024 * 1024
# 1 KiB .. 256 MiB, as the benchmark's default range.
SIZES = [2 ** k for k in range(10, 29)]


def test_default_sizes_are_powers_of_two_from_1k_to_256m():
    assert cb.pow2_sizes(cb.DEFAULT_MIN_BYTES, cb.DEFAULT_MAX_BYTES) == SIZES
    assert cb.pow2_sizes(1000, 5000) == [1024, 2048, 4096]
    assert [cb.parse_size(s) for s in ("4096", "1K", "64KiB", "256M", "1.5M", "1G")] == \
        [4096, 1024, 65536, 256 * MIB, 1572864, 1024 * MIB]
    for bad in ("abc", "-1K", "0", "3T"):
        with pytest.raises(UsageError):
            cb.parse_size(bad)


def test_message_sizes_and_bus_factors():
    assert cb.message_size("allreduce", 1026, 4) == 1024           # whole fp32 elements
    assert cb.message_size("allgather", 1024, 3) == 1020           # whole elements per rank
    assert cb.message_size("allgather", 4, 3) == 12                # at least one per rank
    assert cb.bus_factor("allreduce", 4) == 1.5 and cb.bus_factor("allgather", 4) == 0.75
    assert cb.bus_factor("allreduce", 1) == 0.0


@pytest.mark.parametrize("alpha,beta", [(50e-6, 1e-9), (5e-6, 0.1e-9), (2e-3, 8e-9)])
@pytest.mark.parametrize("relative", [True, False])
def test_fit_recovers_alpha_and_beta_exactly_from_model_timings(alpha, beta, relative):
    times = [alpha + beta * s for s in SIZES]
    a, b = cb.fit_alpha_beta(SIZES, times, relative=relative)
    assert a == pytest.approx(alpha, rel=1e-9) and b == pytest.approx(beta, rel=1e-9)
    assert max(abs(e) for e in cb.relative_errors(a, b, SIZES, times)) < 1e-9


@pytest.mark.parametrize("alpha,beta", [(50e-6, 1e-9), (5e-6, 0.1e-9), (2e-3, 8e-9)])
def test_relative_fit_within_one_percent_under_measurement_noise(alpha, beta):
    # +-0.5% multiplicative noise, in a fixed pattern (no randomness in the test).
    pattern = [0.005, -0.004, 0.003, -0.005, 0.002, 0.004, -0.003, -0.001]
    times = [(alpha + beta * s) * (1 + pattern[i % len(pattern)]) for i, s in enumerate(SIZES)]
    a, b = cb.fit_alpha_beta(SIZES, times)
    assert abs(a - alpha) / alpha < 0.01 and abs(b - beta) / beta < 0.01, (a, b)


def test_fit_keeps_alpha_and_beta_non_negative():
    # Times that a free line would meet with a negative intercept: t = 2e-9 * (s - 1000).
    sizes = [2000, 4000, 8000]
    a, b = cb.fit_alpha_beta(sizes, [2e-9 * (s - 1000) for s in sizes], relative=False)
    assert a == 0.0 and b > 0
    # Falling times: the best constant.
    a, b = cb.fit_alpha_beta([1, 2, 3], [3.0, 2.0, 1.0], relative=False)
    assert (a, b) == (2.0, 0.0)
    # One size: alpha is its time.
    assert cb.fit_alpha_beta([4096], [1e-4]) == (1e-4, 0.0)


def test_push_pull_is_fitted_to_one_partition_by_absolute_errors():
    """One partition (up to 4 MB here) costs 1 ms + 32 ns/B; larger messages pipeline their
    partitions (16 MB in 4 partitions: 1 + 2.5 partitions' time); small ones pass within a
    burst at half the rate. The fit keeps only the one-partition rows and minimises absolute
    errors: beta is the large partitions' 32 ns/B, where relative errors would give less."""
    class PS:
        partition_bytes = 4 << 20
    one = lambda m: 1e-3 + 32e-9 * m
    rows = [{"size_bytes": m, "time_s": one(m) if m >= 256 << 10 else 1e-3 + 16e-9 * m}
            for m in (1024 << i for i in range(13))]           # 1 KiB ... 4 MiB
    big = [{"size_bytes": 16 << 20, "time_s": 3.5 * one(4 << 20)}]
    fitted, relative = cb._fitted_rows("pushpull", rows + big, PS(), True)
    assert fitted == rows and relative is False
    a, b = cb.fit_alpha_beta([r["size_bytes"] for r in fitted],
                             [r["time_s"] for r in fitted], relative=False)
    assert b == pytest.approx(32e-9, rel=0.02)
    assert cb.fit_alpha_beta([r["size_bytes"] for r in fitted], [r["time_s"] for r in fitted],
                             relative=True)[1] < 28e-9   # (26: pulled down by the small ones)
    # push/pull with nothing beyond one partition (a sweep's calibration): the same; one row
    # of a partition or less, and collectives: every row, as asked
    assert cb._fitted_rows("pushpull", rows, PS(), True) == (rows, False)
    assert cb._fitted_rows("pushpull", rows[:1] + big, PS(), True) == (rows[:1] + big, True)
    assert cb._fitted_rows("allreduce", rows + big, None, True) == (rows + big, True)


def test_ring_link_values():
    link = cb.ring_link("allreduce", 6e-6, 1.5e-9, 4)  # 2(P-1) = 6, 2(P-1)/P = 1.5
    assert link["alpha_s"] == pytest.approx(1e-6) and link["beta_s_per_byte"] == pytest.approx(1e-9)
    assert cb.ring_link("allreduce", 1.0, 1.0, 1) is None


def _args(**kw):
    """The command line's defaults (every option the command has), then these values."""
    args = cb.parse_args(["--min-bytes", "1K", "--max-bytes", "4K", "--sentence-len", "16",
                          "--warmup", "1", "--iters", "2"])
    for k, v in kw.items():
        setattr(args, k, v)
    return args


def test_sizes_of_a_model_join_the_range():
    import models
    model = models.build("bert_tiny", sentence_len=16).model
    tensor_bytes = {p.numel() * 4 for p in model.parameters()}
    total = sum(p.numel() * 4 for p in model.parameters())
    ops, sizes = cb.check(_args(model="bert_tiny", sizes="3000"))
    assert ops == ["allreduce", "allgather"]
    assert set(sizes) == {1024, 2048, 4096, 3000} | tensor_bytes | {total}
    assert sizes == sorted(sizes)


@pytest.mark.parametrize("kw,message", [
    (dict(ops="allreduce,broadcast"), "unknown collective(s) broadcast"),
    (dict(ops="burst"), "--ops burst all-reduces a model's gradient tensors: give --model"),
    (dict(min_bytes="2M", max_bytes="1K"), "--min-bytes 2M is larger than --max-bytes 1K"),
    (dict(iters=0), "--iters must be positive, got 0"),
])
def test_bad_arguments(kw, message):
    with pytest.raises(UsageError) as e:
        cb.check(_args(**kw))
    assert message in str(e.value)


def test_two_workers_table_json_and_fit(tmp_path, load_json):
    out = tmp_path / "cb.json"
    proc = run([sys.executable, "-m", "ddlbench.measure.comm_bench", "--nworkers", "2",
                "--min-bytes", "1K", "--max-bytes", "16K", "--sizes", "3000", "--warmup", "1",
                "--iters", "3", "--timeout", "60", "--output", str(out)], timeout=300)
    assert proc.returncode == 0, describe(proc)
    rec = load_json(out)
    assert rec["nworkers"] == 2 and rec["backend"] == "gloo" and rec["network"] == "local"
    # the performance model's network description reads the record as written
    net = topology.load(str(out))
    for res in rec["results"]:
        link = net.link(res["op"], 2)
        assert (link.alpha, link.beta) == (res["fit"]["alpha_s"], res["fit"]["beta_s_per_byte"])
        # its measured rows, by size, never decreasing (isotonic: a larger message costs no
        # less), each within the rows' range
        times = [r["time_s"] for r in res["rows"]]
        assert [s for s, _ in link.points] == [r["size_bytes"] for r in res["rows"]]
        assert all(a[1] <= b[1] for a, b in zip(link.points, link.points[1:]))
        assert all(min(times) <= t <= max(times) for _, t in link.points)
        assert link.points[-1][1] >= times[-1] and link.points[0][1] <= times[0]
    ar, ag = rec["results"]
    assert (ar["op"], ag["op"]) == ("allreduce", "allgather")
    assert [r["size_bytes"] for r in ar["rows"]] == [1024, 2048, 3000, 4096, 8192, 16384]
    assert [r["size_bytes"] for r in ag["rows"]] == [1024, 2048, 3000, 4096, 8192, 16384]
    for res, factor in ((ar, 1.0), (ag, 0.5)):  # 2(P-1)/P and (P-1)/P at P = 2
        fit = res["fit"]
        for r in res["rows"]:
            assert r["count"] == r["size_bytes"] // 4
            assert r["algbw_GBps"] == pytest.approx(r["size_bytes"] / r["time_s"] / 1e9)
            assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * factor)
            assert r["time_s"] == r["time_stats_s"]["median"]
            assert r["fit_s"] == pytest.approx(fit["alpha_s"] + fit["beta_s_per_byte"]
                                               * r["size_bytes"])
            assert r["fit_error"] == pytest.approx((r["fit_s"] - r["time_s"]) / r["time_s"])
        assert fit["worst_abs_error"] == max(abs(r["fit_error"]) for r in res["rows"])
        # The record's fit is the fit of its own rows.
        a, b = cb.fit_alpha_beta([r["size_bytes"] for r in res["rows"]],
                                 [r["time_s"] for r in res["rows"]])
        assert (a, b) == (fit["alpha_s"], fit["beta_s_per_byte"])
    # The table: units in the header, one line per size and collective, then the fit and its
    # error per size.
    lines = proc.stdout.splitlines()
    assert "#         (B)  (elements)               (us)   (GB/s)   (GB/s)" in lines
    table = [ln.split() for ln in lines if not ln.startswith("#") and len(ln.split()) == 6]
    assert [int(t[0]) for t in table] == [1024, 2048, 3000, 4096, 8192, 16384] * 2
    assert sum(ln.startswith("# fit allreduce (P = 2, network local, backend gloo") for ln in lines) == 1
    errs = [ln.split() for ln in lines if not ln.startswith("#") and len(ln.split()) == 4]
    assert [float(e[3]) for e in errs] == [round(r["fit_error"] * 100, 1)
                                           for res in (ar, ag) for r in res["rows"]]


def test_reduce_scatter_by_carrier_and_all_to_all(tmp_path, load_json):
    """The declared collectives beyond all-reduce, at 3 workers: message sizes in whole fp32
    elements per rank, busbw by the collective's declared factor (2/3 at P = 3, whatever the
    carrier moves), the carrier recorded (Gloo's default: a2a), and each fit priced by the
    model's reading of the file."""
    out = tmp_path / "cb.json"
    proc = run([sys.executable, "-m", "ddlbench.measure.comm_bench", "--nworkers", "3",
                "--ops", "reduce_scatter,reduce_scatter:native,reduce_scatter:ring,all_to_all",
                "--min-bytes", "4K",
                "--max-bytes", "8K", "--sizes", "1000", "--warmup", "1", "--iters", "2",
                "--timeout", "60", "--output", str(out)], timeout=300)
    assert proc.returncode == 0, describe(proc)
    rec = load_json(out)
    assert [(r["op"], r.get("carrier")) for r in rec["results"]] == [
        ("reduce_scatter", "a2a"), ("reduce_scatter:native", "native"),
        ("reduce_scatter:ring", "ring"), ("all_to_all", None)]
    net = topology.load(str(out))
    for res in rec["results"]:
        assert [r["size_bytes"] for r in res["rows"]] == [996, 4092, 8184]   # 12 B a unit
        for r in res["rows"]:
            assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 2 / 3)
        link = net.link(res["op"], 3)
        assert (link.alpha, link.beta) == (res["fit"]["alpha_s"], res["fit"]["beta_s_per_byte"])
    # the native carrier on Gloo is an all-reduce: its per-step ring values are an all-reduce's
    native = rec["results"][1]["fit"]
    steps = cb.ring_link("allreduce", native["alpha_s"], native["beta_s_per_byte"], 3)
    assert native["ring_link"] == steps
    assert "# reduce_scatter:native, P = 3: size = bytes each rank holds; carried by native: " \
        "the backend's own" in proc.stdout
    with pytest.raises(UsageError, match="--ops: unknown collective.s. gather; known: allreduce, "
                                         "reduce_scatter, reduce_scatter:a2a, "
                                         "reduce_scatter:native, reduce_scatter:ring, "
                                         "allgather, all_to_all"):
        cb.check(_args(ops="gather"))


def test_a_burst_of_a_models_tensors_against_one_at_a_time(tmp_path, load_json):
    """--ops burst: the model's gradient tensors, in backward order, all-reduced all started at
    once and one at a time; the record's figures are consistent (its sizes the model's, each
    time the mean of its rounds with --stat mean), the line says them, and the model's network
    reader takes it (a burst alone is no link: the per-size fit it corrects is missing)."""
    import statistics

    import models
    out = tmp_path / "burst.json"
    proc = run([sys.executable, "-m", "ddlbench.measure.comm_bench", "--nworkers", "2", "--ops", "burst",
                "--model", "bert_tiny", "--sentence-len", "16", "--warmup", "1", "--iters", "3",
                "--stat", "mean", "--timeout", "60", "--output", str(out)], timeout=300)
    assert proc.returncode == 0, describe(proc)
    (res,) = load_json(out)["results"]
    params = [p for p in models.build("bert_tiny", sentence_len=16).model.parameters()
              if p.requires_grad]
    assert cb.backward_bytes("bert_tiny", sentence_len=16) == [p.numel() * 4
                                                              for p in reversed(params)]
    assert (res["op"], res["nworkers"], res["iters"], res["stat"]) == ("burst", 2, 3, "mean")
    rounds = res["rounds_s"]
    assert [len(rounds["one_at_a_time"]), len(rounds["burst"])] == [3, 3]
    assert res["one_at_a_time_s"] == statistics.fmean(rounds["one_at_a_time"])
    assert res["burst_s"] == statistics.fmean(rounds["burst"])
    assert res["messages"] == len(params) and res["bytes"] == sum(p.numel() * 4 for p in params)
    assert res["sizes"] == cb.backward_bytes("bert_tiny", sentence_len=16)
    assert res["one_at_a_time_s"] > 0 and res["burst_s"] > 0
    assert res["ratio"] == res["burst_s"] / res["one_at_a_time_s"]
    assert res["excess_per_message_s"] == pytest.approx(
        (res["burst_s"] - res["one_at_a_time_s"]) / len(params))
    assert cb.format_burst(res) in proc.stdout.splitlines()
    net = topology.load(str(out))
    assert net.bursts == {2: [(res["sizes"], res["one_at_a_time_s"], res["burst_s"])]}
    with pytest.raises(UsageError, match="have no allreduce at 2 workers"):
        net.link("allreduce", 2)


def test_bad_input_from_the_command_line_is_one_line():
    proc = run([sys.executable, "-m", "ddlbench.measure.comm_bench", "--nworkers", "2", "--ops", "bcast"],
               timeout=120)
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.strip().splitlines() == [
        "ddlbench: error: --ops: unknown collective(s) bcast; known: allreduce, "
        "reduce_scatter, reduce_scatter:a2a, reduce_scatter:native, reduce_scatter:ring, "
        "allgather, all_to_all, pushpull, latency, burst"]


def test_osu_style_latency_is_a_ping_pong_between_two_ranks(tmp_path, load_json):
    """--ops latency (the original's osu_benchmarks/latency.sh): one-way time per size, half the
    round trip between ranks 0 and 1 (the third rank waits); the echo of known values is
    checked after the timing; a 1-worker job is refused in one line."""
    out = tmp_path / "lat.json"
    proc = run([sys.executable, "-m", "ddlbench.measure.comm_bench", "--nworkers", "3", "--ops",
                "latency", "--min-bytes", "4", "--max-bytes", "1K", "--warmup", "1", "--iters",
                "3", "--timeout", "60", "--output", str(out)], timeout=180)
    assert proc.returncode == 0, describe(proc)
    (res,) = load_json(out)["results"]
    assert res["op"] == "latency" and res["nworkers"] == 3
    assert [r["size_bytes"] for r in res["rows"]] == [4 * 2 ** i for i in range(9)]
    assert all(r["busbw_GBps"] == r["algbw_GBps"] > 0 for r in res["rows"])
    assert res["fit"]["ring_link"] is None
    assert ("# latency, OSU-style ping-pong between ranks 0 and 1 of P = 3: size = bytes each "
            "way; time = one-way latency (half the round trip)") in proc.stdout
    one = run([sys.executable, "-m", "ddlbench.measure.comm_bench", "--nworkers", "1", "--ops",
               "latency", "--timeout", "60"], timeout=120)
    assert one.returncode != 0
    assert "--ops latency (ping-pong) needs at least 2 workers" in one.stderr, describe(one)
    assert "Traceback" not in one.stderr


def test_push_pull_through_parameter_servers(tmp_path, load_json):
    """--ops pushpull spawns the servers too (one for 2 workers) and times a message cut into
    the servers' partitions: 64 KiB at 16 KiB partitions is 4 pushes and 4 pulls."""
    out = tmp_path / "pp.json"
    proc = run([sys.executable, "-m", "ddlbench.measure.comm_bench", "--nworkers", "2", "--ops",
                "pushpull", "--min-bytes", "1K", "--max-bytes", "64K", "--partition-bytes",
                "16384", "--warmup", "1", "--iters", "5", "--slots", "1", "--output",
                str(out)], timeout=180)
    assert proc.returncode == 0, describe(proc)
    rec = load_json(out)
    (res,) = rec["results"]
    assert res["op"] == "pushpull" and res["nservers"] == 1 and res["partition_bytes"] == 16384
    # --slots 1: each worker a machine of its own, so both push (as BytePS would, per machine)
    assert res["ps_clients"] == "machine" and res["pushers"] == [0, 1]
    # 2 workers and their server: each worker on cores of its own where the workers fit (the
    # server on every core where it does not fit beside them), as each worker read them
    placement = rec["environment"]["placement"]
    expected = pinning.plan(2, 1)
    assert placement["pinning"] == expected["pinning"]
    assert [r["cores"] for r in placement["ranks"]] == [r["cores"]
                                                        for r in expected["ranks"]]
    assert [r["size_bytes"] for r in res["rows"]] == [1024 * 2 ** i for i in range(7)]
    assert all(r["busbw_GBps"] == r["algbw_GBps"] > 0 for r in res["rows"])
    # fitted by least squares to the messages of one partition (1-16 KiB), not the larger
    # ones whose partitions overlap
    one = [r for r in res["rows"] if r["size_bytes"] <= 16384]
    assert res["fit"]["ring_link"] is None and res["fit"]["sizes"] == "up to one partition"
    assert (res["fit"]["alpha_s"], res["fit"]["beta_s_per_byte"]) == cb.fit_alpha_beta(
        [r["size_bytes"] for r in one], [r["time_s"] for r in one], relative=False)
    assert ("busbw = algbw * 1 (each worker hands size to push/pull and gets size back)"
            in proc.stdout)
    # the model's links: the fit halved each way; the 32 and 64 KiB messages (2 and 4
    # partitions in flight) give the queueing cost that makes their replay take as long
    fit = res["fit"]
    links = topology.load(str(out)).ps(2)
    plain = simulate.ServerLinks(fit["alpha_s"] / 2, fit["beta_s_per_byte"] / 2, 0.0,
                                 nservers=1, pushers=2)
    assert links == dataclasses.replace(plain, queued_s_per_byte=links.queued_s_per_byte)
    beyond = [(r["size_bytes"], r["time_s"]) for r in res["rows"] if r["size_bytes"] > 16384]
    measured = sum(t for _, t in beyond)
    if sum(plain.message(s, 16384) for s, _ in beyond) >= measured:
        assert links.queued_s_per_byte == 0.0
    else:
        assert sum(links.message(s, 16384) for s, _ in beyond) == \
            pytest.approx(measured, rel=1e-9)


def test_push_pull_without_servers_is_refused():
    with pytest.raises(UsageError) as e:
        cb.check(_args(ops="pushpull", nservers=0))
    assert "needs parameter servers" in str(e.value)


def test_a_burst_is_checked_without_building_the_model():
    """``--ops burst`` builds the model in each worker; the launching process only checks the
    name (importing torch and transformers to build it there took 4 of a burst job's 13 s),
    and an unknown one is still one line."""
    code = ("import sys; from ddlbench.measure import comm_bench as cb; "
            "cb.check(cb.parse_args(['--ops', 'burst', '--model', 'bert_tiny'])); "
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.stdout.split() == ["False"], proc.stderr
    with pytest.raises(UsageError, match="unknown model 'nosuch'"):
        cb.check(cb.parse_args(["--ops", "burst", "--model", "nosuch"]))
