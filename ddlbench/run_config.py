"""A training run's settings, typed and immutable: ``RunConfig``, built once from the checked
flags (``RunConfig.of``); the runtime, the session, the verifier and the benchmark read it, not
the command line's namespace."""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

import compression

from . import flags, methods
from .measure import workload

if TYPE_CHECKING:  # the runtime imports torch: a run imports it when it starts
    from . import runtime

# Namespace entries that are no setting of the run (the record leaves them out).
NOT_RECORDED = ("output", "given")


def _frozen(mapping: Mapping) -> Mapping:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class RunConfig:
    """What a training run does, from its flags: the job the runtime starts (``job``), the
    replica (``spec``) and its optimizer (``optimizer``), the (method, compressor) pairs it runs
    with each method's resolved options and the compressors' values, the timing rounds, what
    ``--verify`` checks, the files it writes, and the settings its record names (``record()``).
    ``for_method`` gives the configuration of one method of a several-method job."""
    job: runtime.Job
    spec: workload.Spec
    optimizer: workload.OptimizerSpec
    engine: str
    method: str                          # --method as given (one id after for_method)
    compressor: str                      # --compressor as given
    runs: tuple[tuple[str, str], ...]    # (method, compressor) pairs, in order
    options: Mapping[str, Any]           # method id -> its resolved Options
    compressor_options: Mapping[str, Any]  # compressor option -> value (default if not given)
    warmup: int = 10                     # --num-warmup-batches
    batches_per_iter: int = 10           # --num-batches-per-iter
    iters: int = 10                      # --num-iters
    verify: int = 0                      # --verify STEPS (0: a benchmark)
    rtol: float | None = None            # None: the optimizer's default tolerance
    atol: float | None = None
    output: str | None = None
    timeline: str | None = None
    timeline_iters: int | None = None
    trace_collectives: str | None = None
    save_params: str | None = None
    net: str = "loopback"
    network: str = "local"
    # every flag's value as the command line left it (output and given aside): record()
    recorded: Mapping[str, Any] = dataclasses.field(default_factory=lambda: _frozen({}))

    @classmethod
    def of(cls, args) -> "RunConfig":
        """From the training script's flags, after ``flags.check``."""
        from . import runtime
        pairs = tuple(flags.runs(args))
        values = vars(args)
        resolvable = flags.resolvable(args)
        options = {}
        for name, _ in pairs:
            if name not in options:
                method = methods.lookup(name, args.engine)
                # a lane with options of its own (the framework's settings as defaults):
                # those not on the command line take its defaults, not the torch method's
                implements = getattr(method, "implements", method)
                own = ({spec.name: None for spec in method.Options.specs()
                        if spec.name not in args.given}
                       if method.Options is not implements.Options else {})
                options[name] = method.Options.resolve({**resolvable, **own})
        given = {spec.name: getattr(args, spec.name) for spec in compression.specs()}
        compressor_options = {spec.name: spec.default if given[spec.name] is None
                              else given[spec.name] for spec in compression.specs()}
        horovod = byteps = None
        if args.engine == "horovod":
            hvd = methods.lookup(args.method, "horovod")
            horovod = hvd.horovod_settings(hvd.Options.resolve(values))
        elif args.engine == "byteps":
            bps = methods.lookup(args.method, "byteps")
            byteps = bps.byteps_settings(bps.Options.resolve(resolvable))
            if args.timeline:   # BytePS's own trace of the recorded steps, for the timeline
                from .runtime.byteps import trace_settings
                timed = args.num_iters * args.num_batches_per_iter
                recorded = timed if args.timeline_iters is None else args.timeline_iters
                byteps.update(trace_settings(args.num_warmup_batches, timed, recorded))
        return cls(
            job=runtime.Job.of(args, horovod=horovod, byteps=byteps), spec=workload.Spec.of(args),
            optimizer=workload.OptimizerSpec.of(args), engine=args.engine, method=args.method,
            compressor=args.compressor, runs=pairs, options=_frozen(options),
            compressor_options=_frozen(compressor_options),
            warmup=args.num_warmup_batches,
            batches_per_iter=args.num_batches_per_iter, iters=args.num_iters,
            verify=args.verify, rtol=args.rtol, atol=args.atol, output=args.output,
            timeline=args.timeline, timeline_iters=args.timeline_iters,
            trace_collectives=args.trace_collectives, save_params=args.save_params,
            net=args.net, network=args.network,
            recorded=_frozen({k: v for k, v in values.items() if k not in NOT_RECORDED}))

    @property
    def method_ids(self) -> list[str]:
        """The job's method ids, in order (each once)."""
        return list(dict.fromkeys(name for name, _ in self.runs))

    def for_method(self, name: str, index: int) -> "RunConfig":
        """The configuration of method ``name``, the ``index``-th of this job's methods: its
        own record and trace paths ('{method}' replaced) and the job in its record."""
        names = self.method_ids
        if len(names) == 1:
            return self
        output, trace = (p.replace("{method}", name) if p else p
                         for p in (self.output, self.timeline))
        recorded = {**self.recorded, "method": name, "timeline": trace,
                    "job": {"methods": names, "index": index}}
        return dataclasses.replace(self, method=name, output=output, timeline=trace,
                                   runs=tuple(p for p in self.runs if p[0] == name),
                                   recorded=_frozen(recorded))

    def record(self) -> dict:
        """The run's settings as its JSON record's ``config`` names them (before the running
        method's effective options, the workers, servers and learning rate are added): every
        flag but ``--output``, ``--method`` and ``--timeline`` as this method's, and, in a
        several-method job, ``job`` (its methods and this one's index)."""
        return copy.deepcopy(dict(self.recorded))
