"""The performance model's network descriptions (ddlbench/model/topology.py): the closed forms on
hand-made topology files, the comm_bench route, one-line errors, and the shipped files."""
import json
import os

import pytest
import yaml

from ddlbench.model import simulate, topology
from ddlbench.errors import UsageError

from .conftest import REPO

MIB = 1024 * 1024

# The hand-made cluster: 3 nodes x 4 devices.
A_I, B_I = 2e-6, 1 / (8e9 * 0.5)          # intra: 8 GB/s at efficiency 0.5, 2 us
A_E, B_E = 20e-6, 1 / (10e9 / 8 * 0.8)    # inter: 10 Gbit/s at efficiency 0.8, 20 us
BASE = {
    "nodes": 3,
    "devices_per_node": 4,
    "intra_node": {"bandwidth": "8GB/s", "latency": "2us", "efficiency": 0.5},
    "inter_node": {"bandwidth": "10gbit", "latency": "20us", "efficiency": 0.8},
}


def close(x, y):
    return x == pytest.approx(y, rel=1e-12, abs=0)


def same(link, alpha, beta):
    assert close(link.alpha, alpha) and close(link.beta, beta), (link, alpha, beta)


def write(tmp_path, data, name="net.yaml"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(path)


def make(tmp_path, **changes):
    data = json.loads(json.dumps(BASE))
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return topology.Topology(write(tmp_path, data))


# ----------------------------------------------------------------------------- closed forms

@pytest.mark.parametrize("p", [2, 3, 4])
def test_a_flat_ring_inside_one_node_uses_the_intra_node_link(tmp_path, p):
    net = make(tmp_path)
    same(net.link("allreduce", p), 2 * (p - 1) * A_I, 2 * (p - 1) / p * B_I)


@pytest.mark.parametrize("p", [5, 8, 12])
def test_a_flat_ring_across_nodes_steps_at_the_slowest_link_it_uses(tmp_path, p):
    net = make(tmp_path)
    a, b = max(A_I, A_E), max(B_I, B_E)
    assert b == B_E          # the NIC is the slow link here
    same(net.link("allreduce", p), 2 * (p - 1) * a, 2 * (p - 1) / p * b)


def test_a_ring_bounded_by_a_slow_intra_node_link_and_one_device_per_node(tmp_path):
    slow_pcie = {"bandwidth": "1gbit", "latency": "50us"}
    net = make(tmp_path, intra_node=slow_pcie)
    same(net.link("allreduce", 6), 2 * 5 * 50e-6, 2 * 5 / 6 * max(8 / 1e9, B_E))
    one = make(tmp_path, devices_per_node=1, intra_node=None)   # intra not needed
    same(one.link("allreduce", 3), 2 * 2 * A_E, 2 * 2 / 3 * B_E)
    same(one.local_reduce(3), 0, 0)


@pytest.mark.parametrize("p,n,l", [(8, 2, 4), (6, 2, 4), (12, 3, 4), (5, 2, 4)])
def test_hierarchical_all_reduce(tmp_path, p, n, l):
    net = make(tmp_path, allreduce="hierarchical")
    same(net.link("allreduce", p),
         2 * (l - 1) * A_I + 2 * (n - 1) * A_E,
         2 * (l - 1) / l * B_I + 2 * (n - 1) / n * B_E)


def test_hierarchical_is_the_ring_on_one_node_or_one_device_per_node(tmp_path):
    hier, ring = make(tmp_path, allreduce="hierarchical"), make(tmp_path)
    for p in (2, 3, 4):
        assert hier.link("allreduce", p) == ring.link("allreduce", p)
    one = make(tmp_path, devices_per_node=1, allreduce="hierarchical")
    same(one.link("allreduce", 3), 2 * 2 * A_E, 2 * 2 / 3 * B_E)


@pytest.mark.parametrize("p,n,l", [(8, 2, 4), (12, 3, 4), (4, 1, 4)])
def test_collectives_on_the_groups_of_the_placement(tmp_path, p, n, l):
    """A machine's group is a ring of its l devices on the intra-node link, the across group a
    ring of the n machines on the NIC that the l groups of a machine share; reduce-scatter in
    the machine, all-reduce of the 1/l shard across and all-gather in the machine cost exactly
    the hierarchical all-reduce of M bytes."""
    net = make(tmp_path)
    rs = net.group_link("reduce_scatter", p, "machine")
    across = net.group_link("allreduce", p, "across")
    ag = net.group_link("allgather", p, "machine")
    same(rs, (l - 1) * A_I, (l - 1) / l * B_I)
    same(ag, (l - 1) * A_I, (l - 1) / l * B_I)
    if n == 1:
        assert (across.alpha, across.beta) == (0.0, 0.0)
    else:
        same(across, 2 * (n - 1) * A_E, 2 * (n - 1) / n * l * B_E)
    hier = make(tmp_path, allreduce="hierarchical").link("allreduce", p)
    m = 64e6
    assert close(rs.time(m) + across.time(m / l) + ag.time(m), hier.time(m))
    assert net.group_link("allreduce", p, "world") == net.link("allreduce", p)
    with pytest.raises(UsageError, match="unknown group layout 'rack'"):
        net.group_link("allreduce", p, "rack")


@pytest.mark.parametrize("algorithm", ["ring", "hierarchical"])
def test_all_gather_is_a_flat_ring_per_gathered_byte(tmp_path, algorithm):
    net = make(tmp_path, allreduce=algorithm)
    same(net.link("allgather", 3), 2 * A_I, 2 / 3 * B_I)
    same(net.link("allgather", 7), 6 * A_E, 6 / 7 * B_E)
    # Per gathered byte: each rank's contribution is G/P, and the ring moves (P-1)/P of G.
    g = 64 * MIB
    assert close(net.link("allgather", 7).time(g), 6 * A_E + 6 * (g / 7) * B_E)


def test_one_worker_costs_nothing(tmp_path):
    for algorithm in ("ring", "hierarchical"):
        net = make(tmp_path, allreduce=algorithm)
        for op in ("allreduce", "allgather"):
            assert net.link(op, 1) == simulate.Link(0.0, 0.0)
        assert net.local_reduce(1) == simulate.Link(0.0, 0.0)


def test_parameter_servers_one_client_per_machine(tmp_path):
    servers = {"bandwidth": "25gbit", "latency": "30us", "efficiency": 0.9}
    net = make(tmp_path, servers=servers)
    ps = net.ps(6, 2, clients="machine")
    assert (ps.nservers, ps.pushers) == (2, 2)
    assert close(ps.alpha, 30e-6) and close(ps.worker_beta, B_E)
    assert close(ps.server_beta, 1 / (25e9 / 8 * 0.9))
    assert net.ps(12).pushers == 3 and net.ps(12).nservers == 3   # default: one per machine
    assert net.ps(3).pushers == 1 and net.ps(3).nservers == 1


def test_parameter_servers_one_client_per_process(tmp_path):
    net = make(tmp_path)
    ps = net.ps(6, 3, clients="process")
    assert (ps.nservers, ps.pushers) == (3, 6)
    # The 4 processes of the fullest machine share its NIC.
    assert close(ps.worker_beta, 4 * B_E)
    # Servers default to the inter-node link, whole section.
    assert close(ps.alpha, A_E) and close(ps.server_beta, B_E)
    assert close(net.ps(3, 1, clients="process").worker_beta, 3 * B_E)


def test_server_count_and_partial_server_links(tmp_path):
    net = make(tmp_path, servers={"count": 5, "latency": "7us"})
    ps = net.ps(4)
    assert ps.nservers == 5 and close(ps.alpha, 7e-6) and close(ps.server_beta, B_E)
    assert net.ps(4, 2).nservers == 2
    with pytest.raises(UsageError, match="clients"):
        net.ps(4, 1, clients="rack")


@pytest.mark.parametrize("p,l", [(2, 2), (3, 3), (4, 4), (6, 4), (12, 4)])
def test_local_reduce_is_a_star_through_the_leader(tmp_path, p, l):
    net = make(tmp_path)
    same(net.local_reduce(p), A_I, (l - 1) * B_I)   # one way: the l - 1 copies


# ------------------------------------------------------------------------------ units

@pytest.mark.parametrize("text,bytes_per_s", [
    ("10gbit", 1.25e9), ("100gbit", 12.5e9), ("2.5Gbit/s", 2.5e9 / 8), ("300mbit", 37.5e6),
    ("12GB/s", 12e9), ("900MB/s", 9e8), ("1GiB/s", 2.0 ** 30), ("15.754GB/s", 15.754e9),
])
def test_bandwidths_say_bits_or_bytes(text, bytes_per_s):
    assert close(topology.parse_bandwidth(text), bytes_per_s)


@pytest.mark.parametrize("text,seconds", [
    ("25us", 25e-6), ("1.5ms", 1.5e-3), ("800ns", 8e-7), ("0.001s", 1e-3), ("3µs", 3e-6),
    ("0us", 0.0),
])
def test_latencies(text, seconds):
    assert close(topology.parse_latency(text), seconds)


@pytest.mark.parametrize("text", ["10", "10gb", "10Gbps", "12gb/s", "fast", "-1gbit", "0gbit",
                                  "12GB"])
def test_bad_bandwidths_are_refused(text):
    with pytest.raises(UsageError, match="bandwidth"):
        topology.parse_bandwidth(text)


# ------------------------------------------------------------------------------ bad input

def test_too_many_or_too_few_workers_name_the_file_and_the_maximum(tmp_path):
    net = make(tmp_path)
    for p in (13, 0, -1):
        with pytest.raises(UsageError) as e:
            net.link("allreduce", p)
        text = str(e.value)
        assert net.path in text and "12" in text and "\n" not in text
    with pytest.raises(UsageError, match="12"):
        net.ps(13)
    with pytest.raises(UsageError, match="operation"):
        net.link("broadcast", 2)


@pytest.mark.parametrize("changes,message", [
    (dict(allreduce="tree"), "unknown all-reduce algorithm 'tree'"),
    (dict(nodes=None), "missing nodes"),
    (dict(nodes=0), "nodes must be a whole number"),
    (dict(devices_per_node="four"), "devices_per_node must be a whole number"),
    (dict(inter_node={"bandwidth": "10gbit"}), "inter_node: missing latency"),
    (dict(inter_node=None), "missing inter_node"),
    (dict(intra_node=None), "missing intra_node"),
    (dict(intra_node={"bandwidth": "10 gigabit", "latency": "1us"}),
     "intra_node: bandwidth"),
    (dict(inter_node={"bandwidth": 1.25e9, "latency": "1us"}), "malformed"),
    (dict(inter_node={"bandwidth": "10gbit", "latency": 5}), "malformed"),
    (dict(inter_node={"bandwidth": "10gbit", "latency": "5us", "efficiency": 1.5}),
     "efficiency"),
    (dict(inter_node={"bandwidth": "10gbit", "latency": "5us", "mtu": 9000}),
     "unknown key 'mtu'"),
    (dict(switches=2), "unknown key 'switches'"),
    (dict(servers={"count": 0}), "servers: count"),
    (dict(servers={"bandwidth": "lots"}), "servers: bandwidth"),
    (dict(validated_workers=0), "validated_workers must be a whole number >= 1, got 0"),
])
def test_bad_topology_files_are_one_line(tmp_path, changes, message):
    with pytest.raises(UsageError) as e:
        make(tmp_path, **changes)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert "net.yaml" in str(e.value)


def test_unreadable_or_malformed_topology_files(tmp_path):
    with pytest.raises(UsageError, match="cannot read"):
        topology.Topology(str(tmp_path / "none.yaml"))
    with pytest.raises(UsageError, match="malformed YAML"):
        topology.Topology(write(tmp_path, "nodes: [1,\n"))
    with pytest.raises(UsageError, match="mapping"):
        topology.Topology(write(tmp_path, "- 1\n- 2\n"))


# ------------------------------------------------------------------------------ measured

def _result(op, p, alpha, beta, **extra):
    """One entry of comm_bench's ``results``, as ``comm_bench.measure`` writes it."""
    rows = [{"size_bytes": s, "count": s // 4, "type": "float", "time_s": alpha + beta * s,
             "time_stats_s": {"median": alpha + beta * s}, "algbw_GBps": 1.0,
             "busbw_GBps": 1.0, "fit_s": alpha + beta * s, "fit_error": 0.0}
            for s in (1024, 2048)]
    res = {"op": op, "nworkers": p, "backend": "gloo (push/pull)" if op == "pushpull"
           else "nccl", "network": "rdma1", "rows": rows,
           "fit": {"alpha_s": alpha, "beta_s_per_byte": beta,
                   "method": "relative least squares", "worst_abs_error": 0.0,
                   "worst_error_size_bytes": 1024, "ring_link": None}}
    res.update(extra)
    return res


def _record(p, results):
    """A ``python -m ddlbench.measure.comm_bench --output`` file (comm_bench.worker's keys)."""
    return {"kind": "comm_bench", "nworkers": p, "network": "rdma1", "backend": "nccl",
            "device": "cuda", "warmup": 5, "iters": 20, "config": {}, "results": results,
            "net": None, "environment": {}}


@pytest.fixture
def bench_files(tmp_path):
    four = tmp_path / "ab4.json"
    four.write_text(json.dumps(_record(4, [
        _result("allreduce", 4, 3.5e-5, 2.25e-10),
        _result("allgather", 4, 2.5e-5, 1.5e-10),
        _result("pushpull", 4, 1.2e-4, 8e-10, nservers=2, partition_bytes=4096000,
                ps_clients="machine", pushers=[0, 2]),
    ])))
    eight = tmp_path / "ab8.json"
    eight.write_text(json.dumps(_record(8, [_result("allreduce", 8, 9e-5, 3e-10)])))
    return str(four), str(eight)


def _on_line(alpha, beta):
    return tuple((float(s), alpha + beta * s) for s in (1024, 2048))


def test_measured_returns_comm_bench_s_rows_and_fits_exactly(bench_files):
    net = topology.load(",".join(bench_files))
    assert isinstance(net, topology.Measured)
    assert net.link("allreduce", 4) == simulate.Link(3.5e-5, 2.25e-10, _on_line(3.5e-5, 2.25e-10))
    assert net.link("allgather", 4) == simulate.Link(2.5e-5, 1.5e-10, _on_line(2.5e-5, 1.5e-10))
    assert net.link("allreduce", 8) == simulate.Link(9e-5, 3e-10, _on_line(9e-5, 3e-10))
    assert net.link("allreduce", 1) == simulate.Link(0.0, 0.0)
    assert net.ps(4, 2, "machine") == simulate.ServerLinks(6e-5, 4e-10, 0.0, 2, 2)
    assert net.ps(4) == net.ps(4, 2)          # the one measured server count
    assert net.local_reduce(4) == simulate.Link(0.0, 0.0)
    assert "ab4" in net.name and "\n" not in net.describe()


def test_a_measured_link_costs_the_rows_it_was_measured_with(tmp_path):
    """comm_bench's rows, not its fitted line: the times by size made non-decreasing (pool
    adjacent violators: 3 and 2 ms pool to 2.5), interpolated between sizes, from (0, alpha)
    below the first and beyond the last by the fit's beta; alpha and beta stay the fit's (what
    MG-WFBP plans with). A file without rows gives the fit alone; malformed rows one line."""
    times = {1024: 1e-3, 2048: 3e-3, 4096: 2e-3, 8192: 6e-3}
    res = _result("allreduce", 2, 5e-4, 1e-6)
    res["rows"] = [{**res["rows"][0], "size_bytes": size, "time_s": t}
                   for size, t in times.items()]
    path = tmp_path / "ab2.json"
    path.write_text(json.dumps(_record(2, [res])))
    link = topology.load(str(path)).link("allreduce", 2)
    assert (link.alpha, link.beta) == (5e-4, 1e-6)
    assert link.points == ((1024.0, 1e-3), (2048.0, 2.5e-3), (4096.0, 2.5e-3), (8192.0, 6e-3))
    for nbytes, seconds in ((0, 5e-4), (512, 7.5e-4), (1024, 1e-3), (1536, 1.75e-3),
                            (3072, 2.5e-3), (6144, 4.25e-3), (8192, 6e-3),
                            (10192, 6e-3 + 2000e-6)):
        assert link.time(nbytes) == pytest.approx(seconds, rel=1e-12), nbytes
    res["rows"] = []
    path.write_text(json.dumps(_record(2, [res])))
    assert topology.load(str(path)).link("allreduce", 2) == simulate.Link(5e-4, 1e-6)
    res["rows"] = [{"size_bytes": 1024, "time_s": "x"}]
    path.write_text(json.dumps(_record(2, [res])))
    with pytest.raises(UsageError, match=r"results\[0\]: rows need size_bytes > 0 and "
                                         r"time_s >= 0 each$"):
        topology.load(str(path))
    for bad in (((2048.0, 1.0), (1024.0, 2.0)), ((1024.0, 2.0), (2048.0, 1.0)), ()):
        with pytest.raises(UsageError, match="measured points need sizes > 0, increasing"):
            simulate.Link(0.0, 0.0, bad)


def _burst(p, sizes, one, burst):
    """A ``comm_bench --ops burst`` result (``comm_bench.measure_burst``'s keys)."""
    return {"op": "burst", "nworkers": p, "backend": "gloo", "network": "rdma1",
            "messages": len(sizes), "bytes": sum(sizes), "sizes": sizes, "iters": 10,
            "one_at_a_time_s": one, "burst_s": burst, "ratio": burst / one,
            "excess_per_message_s": (burst - one) / len(sizes)}


def test_a_burst_gives_the_link_its_per_message_and_queueing_costs(tmp_path):
    """The all-reduce link at the burst's P: per_message_s = (one at a time - the per-size
    times) / N, queued_s = (all at once - one at a time) / (N - 1); so the replay of the
    burst's own messages, one at a time and all at once, takes what was measured. Two bursts
    at one P pool their messages; other worker counts and the all-gather are untouched."""
    alpha, beta = 1e-4, 1e-9             # the rows are on this line
    sizes = [1024, 2048, 1024, 2048]
    line = sum(alpha + beta * m for m in sizes)
    path = tmp_path / "ab.json"
    path.write_text(json.dumps(_record(2, [
        _result("allreduce", 2, alpha, beta), _result("allgather", 2, alpha, beta),
        _burst(2, sizes, line + 4e-3, line + 4e-3 + 6e-3),
        _result("allreduce", 4, alpha, beta)])))
    net = topology.load(str(path))
    link = net.link("allreduce", 2)
    assert (link.alpha, link.beta, link.points) == (alpha, beta, _on_line(alpha, beta))
    assert (link.per_message_s, link.queued_s) == pytest.approx((1e-3, 2e-3), rel=1e-9)
    assert net.link("allgather", 2) == simulate.Link(alpha, beta, _on_line(alpha, beta))
    assert net.link("allreduce", 4) == simulate.Link(alpha, beta, _on_line(alpha, beta))
    assert "bursts P = 2" in net.describe()
    n = len(sizes)
    spaced = simulate.Compute(0.0, [1.0] * n, sizes)      # each message alone on the link
    at_once = simulate.Compute(0.0, [1.0] + [0.0] * (n - 1), sizes)
    groups = [[b] for b in range(n)]
    assert simulate.replay(spaced, link, groups).metrics["comm_s"] == \
        pytest.approx(line + 4e-3, rel=1e-9)
    assert simulate.replay(at_once, link, groups).iteration_s == \
        pytest.approx(1.0 + line + 4e-3 + 6e-3, rel=1e-9)
    # a second burst at P = 2 (another model's: 2 messages) pools with the first
    other = tmp_path / "other.json"
    other.write_text(json.dumps(_record(2, [
        _burst(2, [4096, 4096], 2 * (alpha + beta * 4096) + 4e-3, 2 * (alpha + beta * 4096))])))
    pooled = topology.load(f"{path},{other}").link("allreduce", 2)
    assert (pooled.per_message_s, pooled.queued_s) == \
        pytest.approx(((4e-3 + 4e-3) / 6, (6e-3 - 4e-3) / 4), rel=1e-9)


def test_pushpull_rows_beyond_a_partition_give_the_push_queueing_cost(tmp_path):
    """The fit is of the messages up to one partition (alpha_f + beta_f M; the replay's
    alpha = alpha_f / 2, worker_beta = beta_f / 2); a message of several partitions, all in
    flight, took longer than the replay's pipeline of them: the link's queued_s_per_byte is
    what makes the replay of those messages take as long in all as measured. By hand: 3
    partitions of m = 4096 B pipeline in 4 worker_beta m + 2 alpha; 2 of them queued, at q a
    byte, 2 q m more. With a short last partition the pulls may wait (not linear in q): the
    sum of replays still equals the sum measured. A message faster than the pipeline gives
    0; messages of one partition or less give 0."""
    alpha_f, beta_f, m, q = 2e-4, 2e-9, 4096, 5e-10
    pipeline = 4 * (beta_f / 2) * m + 2 * (alpha_f / 2)

    def write(rows, name="pp.json"):
        res = _result("pushpull", 2, alpha_f, beta_f, nservers=1, partition_bytes=m,
                      ps_clients="machine", pushers=[0, 1])
        res["rows"] += [{**res["rows"][0], "size_bytes": s, "time_s": t} for s, t in rows]
        path = tmp_path / name
        path.write_text(json.dumps(_record(2, [res])))
        return topology.load(str(path)).ps(2)

    plain = simulate.ServerLinks(alpha_f / 2, beta_f / 2, 0.0, 1, 2)
    assert plain.message(3 * m, m) == pytest.approx(pipeline, rel=1e-12)
    links = write([(3 * m, pipeline + 2 * q * m)])
    assert links.queued_s_per_byte == pytest.approx(q, rel=1e-9)
    assert (links.alpha, links.worker_beta, links.pushers) == (alpha_f / 2, beta_f / 2, 2)
    # two messages, the second's last partition a quarter: pooled
    rows = [(3 * m, pipeline + 2 * q * m), (2 * m + m // 4, 3e-4)]
    links = write(rows)
    assert links.queued_s_per_byte > 0
    assert sum(links.message(s, m) for s, _ in rows) == \
        pytest.approx(sum(t for _, t in rows), rel=1e-9)
    assert write([(3 * m, pipeline * 0.9)]).queued_s_per_byte == 0.0
    assert write([]).queued_s_per_byte == 0.0
    res = _result("pushpull", 2, alpha_f, beta_f, nservers=1, partition_bytes=0,
                  ps_clients="machine", pushers=[0, 1])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_record(2, [res])))
    with pytest.raises(UsageError, match=r"results\[0\]: partition_bytes must be a whole "
                                         r"number > 0, got 0$"):
        topology.load(str(bad))


@pytest.mark.parametrize("change,message", [
    (dict(sizes=None), "a burst needs its message sizes"),
    (dict(sizes=[1024, 0]), "a burst needs its message sizes"),
    (dict(burst_s=-1.0), "a burst.s one_at_a_time_s and burst_s must be numbers >= 0"),
    (dict(one_at_a_time_s="x"), "a burst.s one_at_a_time_s and burst_s must be numbers >= 0"),
    (dict(nworkers=0), "nworkers must be a whole number >= 1"),
])
def test_a_malformed_burst_is_one_line(tmp_path, change, message):
    res = _burst(2, [1024, 2048], 1e-3, 2e-3)
    res.update(change)
    path = tmp_path / "ab.json"
    path.write_text(json.dumps(_record(2, [_result("allreduce", 2, 1e-4, 1e-9), res])))
    with pytest.raises(UsageError, match=r"results\[1\]: " + message):
        topology.load(str(path))


def test_measured_names_what_it_lacks(bench_files):
    net = topology.Measured(list(bench_files))
    with pytest.raises(UsageError) as e:
        net.link("allreduce", 16)
    text = str(e.value)
    assert all(f in text for f in bench_files) and "4, 8" in text and "\n" not in text
    with pytest.raises(UsageError, match="no allgather at 8 workers; measured worker counts: 4"):
        net.link("allgather", 8)
    with pytest.raises(UsageError, match="no pushpull at 8 workers"):
        net.ps(8, 2)
    with pytest.raises(UsageError, match="P = 4, 2 servers, clients machine"):
        net.ps(4, 2, clients="process")
    with pytest.raises(UsageError, match="no pushpull at 4 workers, 3 servers"):
        net.ps(4, 3)


def test_measured_refuses_what_is_not_a_comm_bench_record(tmp_path, bench_files):
    other = tmp_path / "train.json"
    other.write_text(json.dumps({"kind": "train", "results": []}))
    with pytest.raises(UsageError, match="not a comm_bench record"):
        topology.load(str(other))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(UsageError, match="is not valid JSON"):
        topology.load(str(broken))
    with pytest.raises(UsageError, match="cannot read"):
        topology.load(str(tmp_path / "absent.json"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_record(2, [_result("allreduce", 2, -1.0, 1e-9)])))
    with pytest.raises(UsageError, match=r"results\[0\].*>= 0"):
        topology.load(str(bad))
    nopush = tmp_path / "nopush.json"
    nopush.write_text(json.dumps(_record(2, [_result("pushpull", 2, 1e-4, 1e-9)])))
    with pytest.raises(UsageError, match="pushpull result needs nservers"):
        topology.load(str(nopush))
    clash = tmp_path / "clash.json"
    clash.write_text(json.dumps(_record(8, [_result("allreduce", 8, 1e-4, 3e-10)])))
    with pytest.raises(UsageError, match="both measure allreduce at P = 8"):
        topology.load(f"{bench_files[1]},{clash}")


# ------------------------------------------------------------------------------ load

def test_load_takes_a_yaml_file_json_files_or_a_shipped_name(tmp_path, bench_files):
    path = write(tmp_path, BASE, "mine.yml")
    assert isinstance(topology.load(path), topology.Topology)
    assert topology.load(path).name == "mine"
    assert isinstance(topology.load(bench_files[0]), topology.Measured)
    net = topology.load("survey-10gbe")
    assert net.path == os.path.join(REPO, "configs", "topology", "survey-10gbe.yaml")
    for spec in ("nonsense", "a.txt", "x.yaml,y.json", "../survey-10gbe"):
        with pytest.raises(UsageError) as e:
            topology.load(spec)
        assert "unknown network description" in str(e.value) and "\n" not in str(e.value)
        assert "survey-10gbe" in str(e.value)


# ------------------------------------------------------------------------------ shipped files

SIZES = (4, 64 * 1024, 4 * MIB, 256 * MIB)
SHIPPED = ["cloud-100g", "cloud-25g", "dlperf-v100-edr", "survey-100gbe", "survey-100gib",
           "survey-10gbe"]


def test_the_shipped_topologies_are_listed_and_the_presets_are_not_affected():
    assert topology.names() == SHIPPED
    from ddlbench.sweep import config
    assert not any(n.startswith(("survey-", "cloud-")) for n in config.presets())


def _costs(net, p):
    """Every cost the model asks of a network at P, for a few sizes."""
    out = []
    for op in ("allreduce", "allgather"):
        out += [net.link(op, p).time(m) for m in SIZES]
    for clients in ("machine", "process"):
        ps = net.ps(p, clients=clients)
        out += [ps.stage(m) for m in SIZES]
    out += [net.local_reduce(p).time(m) for m in SIZES]
    return out


def _faster(path, tmp_path):
    """The same topology with every bandwidth doubled."""
    raw = yaml.safe_load(open(path))
    for key in ("intra_node", "inter_node", "servers"):
        spec = raw.get(key) or {}
        if "bandwidth" in spec:
            spec["bandwidth"] = f"{2 * topology.parse_bandwidth(spec['bandwidth'])!r}B/s"
    return topology.Topology(write(tmp_path, raw, "faster.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_topology_serves_every_worker_count_monotonely(name, tmp_path):
    net = topology.load(name)
    assert net.max_workers == {"cloud": 1024, "survey": 32, "dlperf": 32}[name.split("-")[0]]
    assert net.describe().startswith(name) and "\n" not in net.describe()
    faster = _faster(net.path, tmp_path)
    previous = None
    for p in range(1, net.max_workers + 1):
        costs = _costs(net, p)
        assert all(c >= 0 for c in costs)
        if p > 1:
            # A collective among more workers never costs less (the PS stages may: more
            # servers share the sums).
            ar = [net.link(op, p).time(m) for op in ("allreduce", "allgather") for m in SIZES]
            assert all(x >= y for x, y in zip(ar, previous)), p
        previous = [net.link(op, p).time(m) for op in ("allreduce", "allgather") for m in SIZES]
        # More bandwidth never costs more.
        assert all(f <= c for f, c in zip(_costs(faster, p), costs)), p
    with pytest.raises(UsageError, match=str(net.max_workers)):
        net.link("allreduce", net.max_workers + 1)


def test_the_survey_networks_order_as_their_hardware():
    ten, ib, ipoib = (topology.load(f"survey-{n}") for n in ("10gbe", "100gib", "100gbe"))
    big = 64 * MIB
    for p in range(2, 33):
        t10, tib, tip = (n.link("allreduce", p).time(big) for n in (ten, ib, ipoib))
        if p <= 4:      # inside one machine the network is not used
            assert close(t10, tib) and close(tib, tip)
        else:
            # the ring steps at its slowest link: 10GbE's NIC (1.18 GB/s) against, for IB,
            # the GPUs' path through host memory (3.9 GB/s; no P2P on these cards)
            assert tib < tip < t10 and t10 > 3 * tib
        assert ib.ps(p).stage(big) < ten.ps(p).stage(big)
    # 8 machines x 4 GPUs, a flat ring; servers one per worker machine by default.
    assert (ten.nodes, ten.devices_per_node, ten.algorithm) == (8, 4, "ring")
    assert ten.ps(32).nservers == 8 and ten.ps(8).nservers == 2
    cloud25, cloud100 = topology.load("cloud-25g"), topology.load("cloud-100g")
    for p in (5, 64, 1024):
        assert cloud100.link("allreduce", p).time(big) < cloud25.link("allreduce", p).time(big)


# --------------------------------------------------------------------- every constant's source

PROFILES = os.path.join(REPO, "configs", "profiles")


def _profiles():
    return sorted(f for f in os.listdir(PROFILES) if f.endswith(".json"))


def test_every_shipped_constant_has_its_source_of_a_known_kind():
    """Every number of every shipped topology and profile file names its kind (one of
    topology.KINDS) and source; a chosen one its datasheet value too."""
    seen = set()
    for name in topology.names():
        net = topology.load(name)
        assert net.constants() and net.missing_provenance() == [], name
        assert set(net.provenance) == set(net.constants()), name
        for key, prov in net.provenance.items():
            assert prov.kind in topology.KINDS and prov.source, (name, key)
            assert (prov.datasheet is not None) == (prov.kind == "chosen"), (name, key)
            seen.add(prov.kind)
    assert {"datasheet", "chosen", "original", "assumed"} <= seen
    assert len(_profiles()) == 3
    for filename in _profiles():
        with open(os.path.join(PROFILES, filename)) as f:
            prof = json.load(f)
        given, missing = topology.profile_provenance(prof, filename)
        assert missing == [] and {"forward_s", "backward_s", "throughput"} <= set(given)
        assert all(p.kind in topology.KINDS and p.source for p in given.values()), filename
        assert given["forward_s"].kind == given["backward_s"].kind == "measured"


def test_the_survey_s_chosen_constants_and_their_datasheet_values():
    """The constants picked after comparing with the survey's table (issue 45): the intra-node
    link of the three files, the 100GbE single stream of workers and servers."""
    chosen = {(name, key): p.datasheet_value for name in topology.names()
              for key, p in topology.load(name).provenance.items() if p.kind == "chosen"}
    intra = {"intra_node.bandwidth": 15.754e9, "intra_node.latency": 1e-6,
             "intra_node.efficiency": 0.91}
    want = {(f"survey-{n}", k): v for n in ("10gbe", "100gib", "100gbe") for k, v in intra.items()}
    want.update({("survey-100gbe", f"{s}.{f}"): v for s in ("inter_node", "servers")
                 for f, v in (("bandwidth", 12.5e9), ("efficiency", 0.98))})
    assert chosen.keys() == want.keys()
    assert all(close(chosen[k], v) for k, v in want.items())


PROVENANCE = {"provenance": {"nodes": {"kind": "assumed", "source": "a test"}}}


def test_provenance_is_read_beside_the_values_and_changes_none(tmp_path):
    plain = make(tmp_path)
    intra = {**BASE["intra_node"], "provenance": {
        "bandwidth": {"kind": "chosen", "source": "a table", "datasheet": "16GB/s"},
        "latency": {"kind": "datasheet", "source": "a sheet"}}}
    net = make(tmp_path, intra_node=intra, **PROVENANCE)
    for p in (2, 4, 8, 12):
        assert net.link("allreduce", p) == plain.link("allreduce", p)
        assert net.ps(p) == plain.ps(p) and net.local_reduce(p) == plain.local_reduce(p)
    assert net.provenance["nodes"].kind == "assumed"
    assert net.datasheet_values() == {"intra_node.bandwidth": 16e9}
    assert net.missing_provenance() == ["devices_per_node", "inter_node.bandwidth",
                                        "inter_node.efficiency", "inter_node.latency",
                                        "intra_node.efficiency"]
    # the datasheet reading: the chosen constant replaced, nothing else
    ds = net.variant(net.datasheet_values())
    same(ds.link("allreduce", 4), 2 * 3 * A_I, 2 * 3 / 4 / (16e9 * 0.5))
    assert ds.inter.b == net.inter.b and "changed: intra_node.bandwidth" in ds.describe()
    # servers not given take inter_node's, overridden or not
    slow = net.variant({"inter_node.bandwidth": 1e8})
    assert slow.server.bandwidth == 1e8 and slow.ps(8).server_beta == 1 / (1e8 * 0.8)


@pytest.mark.parametrize("section,entry,message", [
    ("intra_node", {"bandwidth": {"kind": "tuned", "source": "x"}},
     "intra_node: provenance: bandwidth: unknown kind 'tuned'; known: measured, datasheet"),
    ("intra_node", {"bandwidth": {"kind": "chosen", "source": "a table"}},
     "kind chosen needs datasheet"),
    ("intra_node", {"bandwidth": {"kind": "datasheet", "source": "x", "datasheet": "1GB/s"}},
     "a datasheet value belongs to kind chosen only"),
    ("intra_node", {"bandwidth": {"kind": "paper"}}, "kind paper needs a source"),
    ("intra_node", {"bandwidth": {"kind": "chosen", "source": "x", "datasheet": "fast"}},
     "malformed"),
    ("intra_node", {"mtu": {"kind": "datasheet", "source": "x"}}, "unknown constant 'mtu'"),
    ("intra_node", {"bandwidth": "datasheet"}, "a provenance entry is a mapping"),
    ("servers", {"count": {"kind": "original", "source": "x"}},
     "count has a source but no value here"),
    ("top", {"nodes": {"kind": "original", "source": "x", "url": "y"}}, "unknown key 'url'"),
])
def test_bad_provenance_is_one_line(tmp_path, section, entry, message):
    if section == "top":
        changes = {"provenance": entry}
    elif section == "servers":
        changes = {"servers": {"bandwidth": "10gbit", "provenance": entry}}
    else:
        changes = {section: {**BASE[section], "provenance": entry}}
    with pytest.raises(UsageError) as e:
        make(tmp_path, **changes)
    assert message in str(e.value) and "\n" not in str(e.value) and "net.yaml" in str(e.value)


def test_overrides_are_checked(tmp_path):
    net = make(tmp_path)
    with pytest.raises(UsageError, match="no constant 'servers.bandwidth'"):
        net.variant({"servers.bandwidth": 1e9})
    with pytest.raises(UsageError, match=r"efficiency must be a number in \(0, 1\]"):
        net.variant({"inter_node.efficiency": 1.25})
    with pytest.raises(UsageError, match="cannot be"):
        net.variant({"inter_node.latency": -1.0})
    assert net.variant({"nodes": 2}).max_workers == 8


def test_a_profile_s_provenance_is_checked():
    prof = {"forward_s": 0.1, "backward_s": [0.1], "alpha_s": 0.0, "throughput": None,
            "provenance": {"survey_single_gpu": 5.0, "constants": {
                "forward_s": {"kind": "measured", "source": "here"},
                "provenance.survey_single_gpu": {"kind": "original", "source": "a table"}}}}
    given, missing = topology.profile_provenance(prof, "p.json")
    assert set(given) == {"forward_s", "provenance.survey_single_gpu"}
    assert missing == ["backward_s", "alpha_s"]
    prof["provenance"]["constants"]["alpha_s"] = {"kind": "fitted", "source": "x"}
    with pytest.raises(UsageError, match="p.json: provenance.constants: alpha_s: unknown kind"):
        topology.profile_provenance(prof, "p.json")
    prof["provenance"]["constants"]["alpha_s"] = {"kind": "chosen", "source": "x"}
    with pytest.raises(UsageError, match="kind chosen needs datasheet"):
        topology.profile_provenance(prof, "p.json")


def test_an_extrapolated_measurement_scales_the_rings_steps_rows_included(tmp_path):
    """extrapolate: a count the files lack is the measured ring at more workers. Each measured
    row splits at the fit's alpha into a latency part (2(P-1) steps: x3 from 2 to 4 workers)
    and a bandwidth part (2(P-1)/P of the message: x1.5); the burst's per-message and
    queueing costs of 2 workers are kept; push/pull keeps each pusher's link and gets as many
    more pushers and servers as workers. Without extrapolate: refused."""
    a, b = 1e-4, 1e-9
    rows = [{"size_bytes": 1024, "time_s": 5e-5}, {"size_bytes": 1 << 20, "time_s": 2e-3}]
    sizes = [1024, 1 << 20]
    path = tmp_path / "c2.json"
    path.write_text(json.dumps({"kind": "comm_bench", "nworkers": 2, "results": [
        {"op": "allreduce", "nworkers": 2, "fit": {"alpha_s": a, "beta_s_per_byte": b},
         "rows": rows},
        {"op": "burst", "nworkers": 2, "sizes": sizes, "one_at_a_time_s": 5e-5 + 2e-3 + 2e-4,
         "burst_s": 5e-5 + 2e-3 + 2e-4 + 3e-4},
        {"op": "pushpull", "nworkers": 2, "nservers": 1, "ps_clients": "machine",
         "pushers": [0, 1], "fit": {"alpha_s": 2e-4, "beta_s_per_byte": 4e-9}}]}))
    two = topology.load(str(path)).link("allreduce", 2)
    net = topology.load(str(path), extrapolate=True)
    four = net.link("allreduce", 4)
    assert (four.alpha, four.beta) == pytest.approx((3 * a, 1.5 * b), rel=1e-12)
    # the small row below the fit's alpha is latency only; the large one's rest is bandwidth
    assert [s for s, _ in four.points] == sizes
    assert [t for _, t in four.points] == pytest.approx([3 * 5e-5, 3 * a + 1.5 * (2e-3 - a)])
    assert (four.per_message_s, four.queued_s) == pytest.approx(
        (two.per_message_s, two.queued_s)) and two.queued_s == pytest.approx(3e-4)
    ps = net.ps(4, None, "machine")
    assert (ps.alpha, ps.worker_beta, ps.nservers, ps.pushers) == pytest.approx(
        (1e-4, 2e-9, 2, 4))
    assert net.ps(4, 3, "machine").nservers == 3      # servers given: as given
    with pytest.raises(UsageError, match="have no allreduce at 4 workers"):
        topology.load(str(path)).link("allreduce", 4)
    with pytest.raises(UsageError, match="have no pushpull at 4 workers"):
        topology.load(str(path)).ps(4, None, "machine")


@pytest.mark.parametrize("p, n, l", [(4, 1, 4), (8, 2, 4), (12, 3, 4), (3, 1, 3)])
def test_a_backend_prices_each_carrier_as_the_collective_it_runs_as(tmp_path, p, n, l):
    """``backend: gloo``: torch's native reduce-scatter costs Gloo's all-reduce, the ``a2a``
    carrier (Gloo's default) an all-to-all; an all-to-all across machines sends l(P-l)/P of
    the message over each machine's shared NIC, (l-1)/P over each device's intra-node link, in
    P - 1 exchanges. Without a backend every carrier is its collective's ring."""
    gloo, plain = make(tmp_path, backend="gloo"), make(tmp_path)
    assert gloo.link("reduce_scatter:native", p) == plain.link("allreduce", p)
    assert gloo.link("reduce_scatter", p) == gloo.link("reduce_scatter:a2a", p) \
        == gloo.link("all_to_all", p)
    assert make(tmp_path, backend="nccl").link("reduce_scatter", p) == \
        plain.link("reduce_scatter", p) == plain.link("reduce_scatter:native", p)
    a2a = gloo.link("all_to_all", p)
    if n == 1:   # one machine: a ring of its devices, as without a backend
        same(a2a, (p - 1) * A_I, (p - 1) / p * B_I)
    else:
        same(a2a, (p - 1) * A_E, max(B_E * l * (p - l) / p, B_I * (l - 1) / p))
        assert a2a.beta > plain.link("reduce_scatter", p).beta   # more than a ring over the NIC
    # the ring carrier runs as itself on every backend: the ring reduce-scatter
    assert gloo.link("reduce_scatter:ring", p) == plain.link("reduce_scatter", p)
    # on the groups of the placement, inside one machine: the same rule
    assert gloo.group_link("reduce_scatter:native", p, "machine") == \
        plain.group_link("allreduce", p, "machine")
    with pytest.raises(UsageError, match="unknown backend 'mpi'; backend: gloo or nccl"):
        make(tmp_path, backend="mpi")


def test_a_method_option_chooses_the_carrier_the_model_prices(tmp_path):
    """zero's ``--rs-carrier`` reaches the model (``Step.carrier_option``): on a Gloo topology
    of 2 machines x 2 the default (a2a) is priced as the all-to-all, ``ring`` as the ring
    reduce-scatter, cheaper across the shared NIC, ``native`` as Gloo's all-reduce."""
    from ddlbench.model import cell, simulate
    net = make(tmp_path, backend="gloo")

    def link(carrier):
        options = simulate.options_for("zero", None, rs_carrier=carrier)
        [(op, share, got, counted)] = cell.exchange_links("zero", 8, net, options=options)
        assert (op, share, counted) == ("reduce_scatter", 1.0, 1.0)
        return got
    assert link("auto") == link("a2a") == net.link("all_to_all", 8)
    assert link("ring") == net.link("reduce_scatter:ring", 8) != link("a2a")
    assert link("ring").beta < link("a2a").beta
    assert link("native") == net.link("allreduce", 8)
    assert cell.exchange_links("zero", 8, net) == cell.exchange_links(
        "zero", 8, net, options=simulate.options_for("zero", None))
