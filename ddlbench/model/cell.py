"""One cell's prediction, the one path into the performance model: ``predict``.

The command line (``python -m ddlbench.model.predict``: ``run_one`` and ``--advise``), the sweep
(``benchmarks.py --predict-only`` and a calibrated sweep's predictions,
``ddlbench.sweep.predicted.Predictor.predict``) and the validation against the survey
(``ddlbench.model.validation.predict_cell``) all ask ``predict``, so a cell has one number whoever
asks. A cell is a method with its options (an instance of the method's ``Options``,
``simulate.options_for``; its rule reads them), a workload (``simulate.Compute``, already at the
device's and the machine's pace: the caller's business, as are the profile's slowest rank and the
codec's times), a worker count P and its network: a ``topology.Network`` (a topology file or
comm_bench files), a bare all-reduce ``link`` (the CLI's --alpha/--beta or the profile's own fit
when no network is given; the validation's ``original`` source, the original's alpha-beta table,
beside the topology whose servers the PS cells use), or both (the link then costs every all-reduce,
the network the parameter servers). Decided here, and nowhere else (docs/DESIGN.md sections 3, 4 and
6):

- **One machine.** A parameter-server job whose workers are all on one machine runs no server unless
  ``force_servers`` (BytePS with one worker machine "is basically doing NCCL allreduce",
  bytedance/byteps docs/best-practice.md; the original's launch.sh set DMLC_NUM_WORKER to
  nworkers/4; the training script's ``--ps-force-servers``): the cell is the replay of the
  all-reduce method the PS method's rule names (``Rule.one_machine``) on the all-reduce link, with
  that method's default options and the values of the cell's options it also declares (and the
  cell's ``batches_per_iter``). One machine: P = 1 always; on a topology P <= devices_per_node; on
  comm_bench files only P = 1 (they do not say where the workers sat) unless the caller says
  (``one_machine``). A PS cell at P = 1 is therefore the all-reduce method's single-worker replay,
  the device's compute and the method's own host work.
- **PS clients.** ``ps_clients`` "machine" (BytePS: a machine's leader pushes its machine's sum)
  adds the machine's local sum (``Network.local_reduce``); "process" pushes from every worker.
  ``ps_clients`` and ``nservers`` are the PS method's options unless the caller gives them;
  ``nservers`` None: the network's default (one per worker machine; comm_bench: the servers it
  was measured with). ``ps_interference`` (a dict of ``Compute`` slowdowns, the profile's
  beside push/pulls): replaces the workload's slowdowns for a push/pull replay; None keeps
  them. A PS cell run as a local all-reduce keeps the workload's own (the all-reduces').
- **MG-WFBP's plan.** The option its rule names (``Rule.plan_ab``: MG-WFBP's ``mgwfbp_ab``):
  "measured" (the default) plans the merge on the link the cell is costed on (a run measures its own
  link); "table" plans with the original suite's alpha-beta table for P and ``table_network`` (the
  label the launchers export as DDLBENCH_NETWORK: rdma1 and rdma2 the 56Gbps table, anything else
  the 10Gbps one; ``planning.original_alpha_beta``: 1 worker 0 and 0, a P the table lacks one line),
  as the original planned whatever the network; the messages are then costed on the cell's link.
- **One worker.** A network's links cost nothing at P = 1 (``topology``); a bare link is the
  caller's and costs what it says at every P.

- **The machine** (``Machine``; docs/DESIGN.md section 3, "One machine's cores"): the
  workload is scaled by the machine's pace times the slowest rank's (the profile's, at the worker
  count it was measured at) and, extrapolated from ``calibrated_at`` workers, by how much more
  the cell's workers share the cores (``Machine.sharing``); the communication thread's share
  of the cores rescales the CPU interference, and the time it holds the GIL to issue is the
  training thread's too. Every caller (the command line, the sweep) gives its machine here.
- **The interval** (``Spread`` and a topology's stated ranges): the cell predicted again at
  the fast and the slow ends of its inputs: the compute and link factors of ``spread`` and,
  on a topology file, its constants at the ends of their ranges (``Topology.ends``: every
  bandwidth and efficiency low, every latency high, and the reverse); ``Answer.interval`` is
  [min, max] of the point and the two ends; ``Answer.spread_note`` says which inputs made it
  (``spread_note``), and without any the interval is the point (said so).

Torch-free; the result is the ``simulate.Prediction`` with where its network came from and
notes (``Answer``).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, fields, replace

import compression

from .. import methods
from . import simulate, topology
from ..errors import UsageError
from ..planning import DEFAULT_PS_CLIENTS, PS_CLIENTS, original_alpha_beta

PLAN_AB = ("measured", "table")
LOCAL_NOTE = "local all-reduce: {method} (one machine: BytePS non-distributed, no server)"
TABLE_NOTE = ("planned with the original's {table} alpha-beta table at P = {p} (alpha "
              "{alpha:.3g} s, beta {beta:.3g} s/B)")


NO_SPREAD = "no recorded spread: the interval is the point"
GIL_NOTE = ("GIL: the communication thread's {n} issue(s) ({ms:.2f} ms) held the training "
            "thread too")


@dataclass(frozen=True)
class Answer:
    """One cell's prediction: the replay, where its network came from (in words), what was
    decided on the way (``notes``), the all-reduce method a PS cell ran as on one machine
    (``ps_local``, else None), the machine's factors (``machine``: compute, sharing, the
    slowest rank, the GIL's seconds) and the iteration at the low and high ends of the
    inputs' spread (``iteration_range``, fastest first; ``spread_note`` where from)."""
    prediction: simulate.Prediction
    network: str
    notes: tuple[str, ...] = ()
    ps_local: str | None = None
    machine: dict | None = None
    iteration_range: tuple[float, float] | None = None
    spread_note: str = NO_SPREAD

    def throughput(self, batch: int, nworkers: int) -> float:
        return self.prediction.throughput(batch, nworkers)

    def interval(self, batch: int, nworkers: int) -> tuple[float, float]:
        """[low, high] throughput: the slowest and the fastest of the point and the two ends
        of the inputs' spread (the point twice without one)."""
        fast, slow = self.iteration_range or (self.prediction.iteration_s,) * 2
        return batch * nworkers / slow, batch * nworkers / fast


@dataclass(frozen=True)
class Machine:
    """The machine a cell's workers run on, as its caller knows it: ``cores`` (None: not
    known, a cluster's GPUs: no sharing modelled), torch ``threads`` per worker, the worker
    count the workload was measured at (``calibrated_at``; None: the cell's own), the
    machine's ``pace`` (its compute over the profile's) and the profile's ``slowest_rank``
    at ``calibrated_at`` (``predict.slowest_rank``)."""
    cores: int | None = None
    threads: int = 1
    calibrated_at: int | None = None
    pace: float = 1.0
    slowest_rank: float = 1.0

    def __post_init__(self):
        if not 0 < self.pace < float("inf"):
            raise UsageError(f"a pace must be a positive number, got {self.pace!r}")
        for name in ("cores", "threads", "calibrated_at"):
            x = getattr(self, name)
            if x is not None and (isinstance(x, bool) or not isinstance(x, int) or x < 1):
                raise UsageError(f"the machine's {name} must be a whole number >= 1, got {x!r}")

    def sharing(self, nworkers: int, comm: bool = False) -> float:
        """How many times its time alone a worker's thread takes when ``nworkers`` workers of
        ``threads`` threads (``comm``: and each its communication thread) run at once on the
        cores: 1 while they fit, else their threads over the cores (the kernel shares them
        evenly); 1 where the cores are not known."""
        if self.cores is None:
            return 1.0
        return max(1.0, nworkers * (self.threads + (1 if comm else 0)) / self.cores)

    def factors(self, nworkers: int) -> dict:
        """The cell's adjustments at ``nworkers``: ``compute`` (pace x slowest rank x
        ``sharing``), ``sharing`` (the compute's, ``sharing(P) / sharing(P0)``, P0 the
        calibrated count; 1 at P0), and the CPU interference's factors (``kappa``: compute
        beside communication, ``mu``: communication beside compute; each the comm thread's
        share at P over its share at P0, so 1 at P0, where the profile measured them)."""
        at = self.calibrated_at or nworkers
        same = at == nworkers or nworkers < 2
        shared = 1.0 if same else self.sharing(nworkers) / self.sharing(at)

        def beside(n):       # compute beside communication over compute alone
            return self.sharing(n, True) / self.sharing(n)

        def alone(n):        # communication beside compute over communication alone
            return self.sharing(n, True) / max(1.0, n / self.cores) if self.cores else 1.0
        return {"compute": self.pace * self.slowest_rank * shared, "sharing": shared,
                "slowest_rank": self.slowest_rank,
                "kappa": 1.0 if same else beside(nworkers) / beside(at),
                "mu": 1.0 if same else alone(nworkers) / alone(at)}


@dataclass(frozen=True)
class Spread:
    """A cell's inputs' spread, as factors on the point: ``compute`` (low, high) on every
    compute time, ``link`` (low, high) on every link cost, and where each came from
    (``sources``, words)."""
    compute: tuple[float, float] = (1.0, 1.0)
    link: tuple[float, float] = (1.0, 1.0)
    sources: tuple[str, ...] = ()

    def __post_init__(self):
        for lo, hi in (self.compute, self.link):
            if not 0 < lo <= 1.0 <= hi < float("inf"):
                raise UsageError(f"a spread is (low <= 1 <= high), both positive, got "
                                 f"({lo!r}, {hi!r})")

    @property
    def empty(self) -> bool:
        return self.compute == (1.0, 1.0) and self.link == (1.0, 1.0)


def spread_note(spread: Spread | None, network: topology.Network | None) -> str:
    """Where a cell's interval comes from, in words: ``spread``'s sources and, on a topology
    file, the constants whose ranges it states (``Topology.range_note``) or that it states
    none; NO_SPREAD when neither gives any."""
    parts = (list(spread.sources) or ["the given spread"]) if spread is not None \
        and not spread.empty else []
    ranged = network.range_note() if isinstance(network, topology.Topology) else ""
    if ranged:
        parts.append(f"{network.name}'s stated ranges: {ranged}")
    elif parts and isinstance(network, topology.Topology):
        parts.append(f"links: {network.name} states no range")
    return "; ".join(parts) or NO_SPREAD


def is_one_machine(nworkers: int, network: topology.Network | None,
                   one_machine: bool | None = None) -> bool:
    """Whether P workers are all on one machine: ``one_machine`` when the caller knows, else
    P = 1, or P <= devices_per_node on a topology."""
    if one_machine is not None:
        return bool(one_machine)
    if nworkers == 1:
        return True
    return isinstance(network, topology.Topology) and nworkers <= network.devices_per_node


def local_method(method: str, nworkers: int, network: topology.Network | None,
                 one_machine: bool | None = None, force_servers: bool = False) -> str | None:
    """The all-reduce method a PS ``method`` runs as at ``nworkers`` (one machine, no server
    forced), else None (it pushes and pulls; an all-reduce method: None)."""
    cls = simulate.method_class(method)
    if cls.architecture != methods.PS or force_servers or not cls.rule.one_machine:
        return None
    return cls.rule.one_machine if is_one_machine(nworkers, network, one_machine) else None


def predict(method: str, work: simulate.Compute, nworkers: int, options=None, *,
            machine: Machine | None = None, spread: Spread | None = None,
            interval: bool = True, codec: simulate.Codec = simulate.NO_CODEC,
            network: topology.Network | None = None, link: simulate.Link | None = None,
            ps_interference: dict | None = None, **given) -> Answer:
    """``method``'s iteration at ``nworkers`` with ``options`` (an instance of its
    ``Options``; None: its defaults) on ``machine`` (None: the workload as given, nothing
    shared), with the interval of ``spread`` (None: none) and of a topology ``network``'s
    stated ranges (``interval`` False: the point alone, no interval computed); ``given``:
    ``point``'s other arguments (the module's docstring says what is decided here); every
    problem one UsageError."""
    whole = isinstance(nworkers, int) and not isinstance(nworkers, bool) and nworkers >= 1
    facts = machine.factors(nworkers) if machine is not None and whole else None
    if facts is not None:
        work, codec = adjusted(work, codec, facts)
        if ps_interference:
            ps_interference = _interference(ps_interference, facts)
    kw = dict(given, network=network, link=link, ps_interference=ps_interference)
    answer = point(method, work, nworkers, options, codec=codec, **kw)
    gil = _gil_s(answer, work) if machine is not None and machine.cores else 0.0
    if gil:
        held = replace(work, backward_s=[x * (1 + gil / sum(work.backward_s))
                                         for x in work.backward_s]) if sum(work.backward_s) \
            else replace(work, forward_s=work.forward_s + gil)
        n = round(gil / work.host.issue_s)
        answer = point(method, held, nworkers, options, codec=codec, **kw)
        answer = replace(answer, notes=answer.notes + (GIL_NOTE.format(n=n, ms=gil * 1e3),))
        work = held
    if facts is not None:
        answer = replace(answer, machine={**facts, "gil_s": gil})
    ranged = network.ends() if interval and isinstance(network, topology.Topology) else None
    if not interval or ((spread is None or spread.empty) and ranged is None):
        return answer
    spread = spread or Spread()
    nets = (ranged[1], ranged[0]) if ranged else (network, network)      # fast, slow
    ends = [answer.prediction.iteration_s]
    for i in (0, 1):
        w, c = adjusted(work, codec, {"compute": spread.compute[i], "kappa": 1.0, "mu": 1.0})
        k = dict(kw, network=_scaled_network(nets[i], spread.link[i]),
                 link=_scaled_link(link, spread.link[i]))
        ends.append(point(method, w, nworkers, options, codec=c, **k).prediction.iteration_s)
    return replace(answer, iteration_range=(min(ends), max(ends)),
                   spread_note=spread_note(spread, network))


def alone_s(work: simulate.Compute, machine: Machine | None, nworkers: int) -> float:
    """A step of ``work`` at ``nworkers`` on ``machine`` with no communication at all: forward,
    backward and the optimizer at the machine's pace and slowest rank, no CPU interference. What
    a bare loop timed beside the method in the same rounds takes (``ddlbench.overhead
    --nworkers``), so a prediction can be compared with a run as a ratio to it: the run's own
    pace, which moves between runs on a shared machine, cancels (the periodic methods' steps
    without a sync are priced so, ``simulate._periodic``)."""
    if machine is None:
        return work.compute_s
    return adjusted(work, simulate.NO_CODEC, machine.factors(nworkers))[0].compute_s


def adjusted(work: simulate.Compute, codec: simulate.Codec, facts: dict) -> tuple:
    """``work`` and ``codec`` with every compute, host and codec time ``facts["compute"]``
    times as long, and the CPU interference's (1 + kappa) and (1 + mu) times ``facts``'s."""
    f = facts["compute"]
    if f != 1.0:
        shares = work.forward_tensor_s
        h, la = work.host, work.launch
        work = replace(
            work, forward_s=work.forward_s * f, backward_s=[x * f for x in work.backward_s],
            optimizer_s=work.optimizer_s * f,
            forward_tensor_s=None if shares is None else [x * f for x in shares],
            host=simulate.Host(*(getattr(h, x.name) * f for x in fields(h))),
            launch=None if la is None else simulate.Launch(
                la.forward_s * f, [x * f for x in la.backward_s], la.optimizer_s * f,
                la.hook_s * f))
        codec = replace(codec, encode_s_per_element=codec.encode_s_per_element * f,
                        decode_s_per_element=codec.decode_s_per_element * f,
                        encode_at_wait_s_per_element=codec.encode_at_wait_s_per_element * f)
    if facts["kappa"] != 1.0 or facts["mu"] != 1.0:
        work = replace(work, **_interference({"compute_slowdown": work.compute_slowdown,
                                              "comm_slowdown": work.comm_slowdown}, facts))
    return work, codec


def _interference(slowdowns: dict, facts: dict) -> dict:
    """CPU interference slowdowns (``Compute``'s) with the comm thread's share at the cell's
    workers: (1 + kappa) x facts' kappa - 1, and mu alike (at least 0)."""
    out = dict(slowdowns)
    for key, f in (("compute_slowdown", facts["kappa"]), ("comm_slowdown", facts["mu"])):
        if key in out and f != 1.0:
            out[key] = max(0.0, (1 + out[key]) * f - 1)
    return out


def _gil_s(answer: Answer, work: simulate.Compute) -> float:
    """Seconds an iteration's communication thread holds the GIL: its issues (``issue_s``
    each; Gloo releases the GIL inside a collective, so only the issue holds it), each span on
    the thread's row one issue."""
    issue = work.host.issue_s
    if not issue:
        return 0.0
    n = sum(1 for e in answer.prediction.events if e[2] == simulate.ISSUER_ROW)
    return n * issue


def _scaled_link(link, f: float):
    """A link (``simulate.Link`` or ``ServerLinks``) with every cost ``f`` times as much."""
    if link is None or f == 1.0:
        return link
    return replace(link, **{x.name: getattr(link, x.name) * f for x in fields(link)
                            if x.type in ("float", float)})


def _scaled_network(network, f: float):
    """``network`` with every link it prices ``f`` times as costly (the same class, so its
    placement checks hold)."""
    if network is None or f == 1.0:
        return network
    net = copy.copy(network)
    for name in ("link", "group_link", "local_reduce", "ps"):
        if hasattr(network, name):
            setattr(net, name, lambda *a, _f=getattr(network, name), **k:
                    _scaled_link(_f(*a, **k), f))
    return net


def point(method: str, work: simulate.Compute, nworkers: int, options=None, *,
          batches_per_iter: int | None = None, network: topology.Network | None = None,
          link: simulate.Link | None = None, link_source: str | None = None,
          codec: simulate.Codec = simulate.NO_CODEC, ps_clients: str | None = None,
          nservers: int | None = None, force_servers: bool = False,
          ps_interference: dict | None = None, one_machine: bool | None = None,
          table_network: str | None = None) -> Answer:
    """``method``'s iteration at ``nworkers`` on the workload as given (``predict``'s
    point, the machine's adjustments made)."""
    cls = simulate.method_class(method)
    options = simulate.options_for(method, options)
    if ps_clients is None:
        ps_clients = getattr(options, "ps_clients", DEFAULT_PS_CLIENTS)
    if nservers is None:
        nservers = getattr(options, "nservers", None)
    _check(method, cls, nworkers, network, link, codec, ps_clients)
    plan_ab = getattr(options, cls.rule.plan_ab) if cls.rule.plan_ab else PLAN_AB[0]
    if plan_ab not in PLAN_AB:
        raise UsageError(f"MG-WFBP's alpha-beta comes from {' or '.join(PLAN_AB)}, not "
                         f"{plan_ab!r}")
    local = local_method(method, nworkers, network, one_machine, force_servers)
    if cls.architecture == methods.PS and local is None:
        return _push_pull(method, work, nworkers, options, batches_per_iter, network,
                          ps_clients, nservers, ps_interference)
    notes = []
    if local is not None:
        notes.append(LOCAL_NOTE.format(method=local))
        options = simulate.options_for(local, None, **options.as_dict())
    answer = _all_reduce(local or method, work, nworkers, options, batches_per_iter, network,
                         link, link_source, codec, plan_ab, table_network)
    return replace(answer, notes=tuple(notes) + answer.notes, ps_local=local)


def _check(method, cls, nworkers, network, link, codec, ps_clients) -> None:
    if isinstance(nworkers, bool) or not isinstance(nworkers, int) or nworkers < 1:
        raise UsageError(f"a cell needs a whole number of workers >= 1, got {nworkers!r}")
    if network is None and link is None:
        raise UsageError(f"method {method} at {nworkers} workers: give a network (a topology "
                         f"or comm_bench files) or an all-reduce alpha-beta")
    if ps_clients not in PS_CLIENTS:
        raise UsageError(f"unknown parameter-server clients {ps_clients!r}: "
                         f"{', '.join(PS_CLIENTS)}")
    why = cls.accepts(codec.compressor)
    if why is not None:
        allowed = [c for c in compression.COMPRESSORS if cls.accepts(c) is None]
        raise UsageError(f"method {method} does not take compressor {codec.compressor} "
                         f"(it takes {', '.join(allowed)})")


def _push_pull(method, work, nworkers, options, batches_per_iter, network, ps_clients,
               nservers, ps_interference) -> Answer:
    """A PS cell with its servers: push/pull through the network's."""
    if network is None:
        raise UsageError(f"method {method} at {nworkers} workers pushes to parameter servers: "
                         f"it needs a network (a topology, or comm_bench files with --ops "
                         f"pushpull)")
    servers = network.ps(nworkers, nservers, ps_clients)
    local = network.local_reduce(nworkers) if ps_clients == "machine" else None
    if ps_interference is not None and (work.interferes or ps_interference):
        work = replace(work, **{"compute_slowdown": 0.0, "comm_slowdown": 0.0,
                                **ps_interference})
    p = simulate.predict(method, work, None, servers=servers, local=local, nworkers=nworkers,
                         options=options, batches_per_iter=batches_per_iter)
    return Answer(p, network.name)


def on_machines(method: str) -> bool:
    """Whether ``method`` runs collectives on groups of the placement (``machine``,
    ``across``): only a network that knows machines (a topology) prices it."""
    from ..collectives import WORLD
    rule = simulate.method_class(method).rule
    return any(s.layout != WORLD or s.shard_of not in (None, WORLD)
               for s in rule.exchange + rule.gather)


def priced_on(method: str, network: topology.Network | None) -> bool:
    """Whether ``network`` prices ``method``'s collectives: any network (or a given all-reduce
    alpha-beta, None) a method that all-reduces each message on the whole job; a network a
    method with collectives of its own (``Rule.exchange``); a topology one on groups of the
    placement."""
    if not simulate.method_class(method).rule.exchange:
        return True
    if network is None:
        return False
    return isinstance(network, topology.Topology) or not on_machines(method)


def exchange_links(method: str, nworkers: int, network: topology.Network | None,
                   after_optimizer: bool = False, options=None) -> tuple:
    """The links of ``method``'s declared exchange (``Rule.exchange``; ``after_optimizer``:
    its ``Rule.gather``) at ``nworkers``, each step's carrier as ``options`` choose it: per
    step (collective, share of the message, the network's link for the step's group
    layout, the share of its size ``Comm`` counts: an all-gather's 1/s, what this worker
    contributes); () for a method that all-reduces each message on the whole job."""
    rule = simulate.method_class(method).rule
    steps = rule.steps(options, after_optimizer)
    if not steps:
        return ()
    if network is None:
        runs = ", ".join(f"{s.op} @{s.layout}" for s in steps)
        raise UsageError(f"method {method} runs {runs} per message: give a network that "
                         f"prices them (a topology file), not an all-reduce alpha-beta")
    return tuple((s.op, 1.0 / network.group_size(s.shard_of, nworkers) if s.shard_of else 1.0,
                  network.group_link(s.priced_as, nworkers, s.layout),
                  1.0 / network.group_size(s.layout, nworkers) if s.counted_op == "allgather"
                  else 1.0)
                 for s in steps)


def declared_links(method: str, nworkers: int, network: topology.Network | None,
                   options=None) -> dict:
    """``simulate.predict``'s arguments for ``method``'s declared collectives at ``nworkers``
    on ``network``: ``steps`` (its exchange, ``exchange_links``) and, for a sharding method,
    ``gather`` (its collectives after the optimizer) and ``optimizer_share`` (1/s, s the
    size of its ``Rule.optimizer_shard`` group), and ``divide_share`` (1/s, s the size of its
    ``Rule.divide_shard`` group) for one that divides a shard; {} for a method that
    all-reduces each message on the whole job."""
    rule = simulate.method_class(method).rule
    out = {}
    if rule.exchange:
        out["steps"] = exchange_links(method, nworkers, network, options=options)
    if rule.divide_shard is not None:
        out["divide_share"] = 1.0 / network.group_size(rule.divide_shard, nworkers)
    if rule.gather:
        out["gather"] = exchange_links(method, nworkers, network, after_optimizer=True,
                                       options=options)
        shard = rule.optimizer_shard
        out["optimizer_share"] = 1.0 / network.group_size(shard, nworkers) if shard else 1.0
    return out


def _all_reduce(method, work, nworkers, options, batches_per_iter, network, link, link_source,
                codec, plan_ab, table_network) -> Answer:
    """An all-reduce cell (or a PS cell's local all-reduce) on the cell's link."""
    declared = declared_links(method, nworkers, network if link is None else None, options)
    steps = declared.get("steps", ())
    if link is None:
        ar, where = network.link("allreduce", nworkers), network.name
    else:
        ar, where = link, link_source or "the given all-reduce alpha-beta"
    if codec.compressor != "none":
        gather = None
        if codec.gathers:
            gather = network.link("allgather", nworkers) if network is not None else ar
        codec = replace(codec, nworkers=nworkers, allgather=gather)
    cls = simulate.method_class(method)
    if plan_ab != "table" or cls.rule.grouping is None:
        return Answer(simulate.predict(method, work, ar, codec=codec, nworkers=nworkers,
                                       options=options, batches_per_iter=batches_per_iter,
                                       **declared), where)
    table, alpha, beta = original_alpha_beta(nworkers, table_network)
    groups = cls.rule.groups(cls, work, simulate.Link(alpha, beta), options)
    p = simulate.replay(work, ar, groups, method=method, codec=codec, nworkers=nworkers,
                        steps=steps)
    return Answer(p, where, (TABLE_NOTE.format(table=table, p=nworkers, alpha=alpha,
                                               beta=beta),))
