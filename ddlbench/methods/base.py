"""What a synchronisation method is: the declarations every method makes, and the interface the
training loop drives.

A method is one ``Method`` subclass that declares, as class attributes:

- ``id`` (the sweep's and the tables' key), ``display`` (the tables' name), ``architecture``
  (``a2a`` or ``ps``) and ``summary`` (its grouping and schedule, one line);
- ``Options``: a frozen dataclass of ``ddlbench.options.option()`` fields, each with its
  default, check, help text and flag; the method receives an instance of it;
- ``accepts(compressor)``: None when it can exchange its gradients through that compressor,
  else the reason it cannot;
- ``plan_known``: whether ``plan()`` (its buckets, as slices of parameters) is known before a
  step or only after it;
- ``launcher`` (and ``launcher_vars``): the shell launcher a user runs it with on a cluster;
- ``rule``: how the performance model replays it (a ``ddlbench.methods.rules.Rule``: its
  grouping or ByteScheduler's schedule, BSP or not, its ``--advise`` grid; None: not modelled),
  which reads the method's options as the method does (``rules``' docstring);
- ``hatch``: its bars' hatch in the sweep's figures (the original's for its seven methods;
  the colour is the architecture's); ``baseline``: the method the others are compared with
  (torch DDP, what users would otherwise pick);
- ``changes_algorithm``: None for a method that leaves synchronous SGD's parameters (the
  optimizer on the average of all workers' gradients), else how it trains instead, in a few
  words (periodic averaging); the methods table, the sweep's report and the advisor mark it,
  and nothing in the suite claims its model quality (it trains on fake data);
- ``reference``: for such a method, ``module:Class`` of its mathematics written apart, which
  ``--verify`` holds it to instead of the single-process optimizer on the averaged gradient
  (``reference_for``; ``ddlbench.verify.Replicas``).

The registry (``ddlbench.methods``) finds every such class; the training script's flags and
checks, the sweep's tables and checks, ``--method all``, the launchers' arguments and the
README's method table all derive from these declarations.

A method plays the part of Horovod's ``DistributedOptimizer``: it wraps a model and a plain
torch optimizer, owns every hook, thread and communication handle, and its ``step()`` applies
one synchronous-SGD update computed from the average of all workers' gradients. The training
loop is the same for every method::

    with method:                                        # start(): threads; close() at the end
        method.calibrate(forward_backward)              # methods that plan from measurements
        loss = workload.loss(method.module, batch)      # forward through method.module
        loss.backward()                                 # hooks may start communication here
        method.step()                                   # finish what step needs, update
        method.zero_grad()

``synchronize()`` finishes anything a method deliberately leaves running past ``step()`` (a
scheduler that overlaps the next forward with the tail of communication); after it, the
parameters are final. The verifier and the timer call it; the loop itself need not.

What ``--verify`` reads, two declared hooks with plain defaults: ``hook_local_gradients``
(each parameter's whole local gradient as autograd produces it, before any method's hook; by
default a tensor hook on each parameter) and ``full_parameters()`` (the parameters, whole, after
``synchronize()``; by default the parameters themselves). A method whose model computes on
other tensors than the parameters it keeps (FSDP2's unsharded ones beside its sharded DTensors)
overrides them; the verifier's reference stays independent of how the method communicates.

Nothing here imports torch at module level: reading the declarations costs no torch import.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from .. import options
from ..options import NoOptions
from .rules import Rule

if TYPE_CHECKING:  # annotations only
    import torch
    from torch import nn

    from ..runtime.comm import Comm

A2A, PS = "a2a", "ps"
BEFORE_STEP, AFTER_STEP = "before_step", "after_step"
DEFAULT_LAUNCHER = "horovod/horovod_mpi_cj.sh"
NOT_BUCKETED = "it does not reduce its gradients through the suite's buckets"


@dataclass(frozen=True)
class Slice:
    """Elements ``start:end`` of parameter ``param``'s flat gradient (``param``: index in the
    model's trainable parameters, in ``model.parameters()`` order)."""
    param: int
    start: int
    end: int


@dataclass(frozen=True)
class BucketPlan:
    """What a method hands its compressor: buckets of slices, each bucket exchanged as one
    flat tensor in the order listed; ``known``: BEFORE_STEP (asked before a step's backward, it
    describes that step) or AFTER_STEP (the method decides during the step: ask after it)."""
    buckets: tuple[tuple[Slice, ...], ...]
    known: str

    @classmethod
    def of_params(cls, groups, params, known: str = BEFORE_STEP) -> "BucketPlan":
        """Buckets of whole parameters, given as lists of parameter indices."""
        return cls(tuple(tuple(Slice(i, 0, params[i].numel()) for i in g) for g in groups),
                   known)


class Method:
    id: ClassVar[str] = ""
    display: ClassVar[str] = ""
    architecture: ClassVar[str] = A2A
    summary: ClassVar[str] = ""
    Options: ClassVar[type[options.Options]] = NoOptions
    plan_known: ClassVar[str] = BEFORE_STEP
    launcher: ClassVar[str] = DEFAULT_LAUNCHER
    launcher_vars: ClassVar[dict] = {}  # fixed launcher variables that select this method
    engine: ClassVar[str] = "torch"
    rule: ClassVar[Rule | None] = None
    hatch: ClassVar[str | None] = None
    baseline: ClassVar[bool] = False
    # None: plain synchronous SGD on the averaged gradient; else how it trains instead
    changes_algorithm: ClassVar[str | None] = None
    # "module:Class": the mathematics --verify holds a method that changes the algorithm to
    # (``reference_for``); "": the single-process optimizer on the averaged gradient
    reference: ClassVar[str] = ""
    # True: its shards live on the ``machine`` group, so the job's machines must hold as many
    # workers each (``require_even_machines``; the training script checks a --slots placement
    # before the workers start)
    even_machines: ClassVar[bool] = False

    @classmethod
    def reference_for(cls, options: options.Options, optimizer: str) -> str:
        """The reference ``--verify`` holds this method to with its resolved ``options`` and
        ``optimizer`` (sgd, adam or adamw): ``module:Class`` of its own mathematics, or "" for
        the single-process optimizer on the averaged gradient. Default: ``reference``."""
        return cls.reference

    @classmethod
    def accepts(cls, compressor: str) -> str | None:
        """None when this method can send its gradients through ``compressor``, else why not
        (a clause for "method M cannot take --compressor C: ...")."""
        return None if compressor == "none" else NOT_BUCKETED

    @classmethod
    def refuses(cls, options: options.Options) -> str | None:
        """One line saying why this method cannot run with its resolved ``options`` (None: it
        can), asked by the training script's checks before any worker starts."""
        return None

    def __init__(self, model: "nn.Module", optimizer: "torch.optim.Optimizer", comm: "Comm",
                 options: options.Options | None = None, compressor=None,
                 model_name: str | None = None):
        """``compressor``: a ``compression.Compressor`` (None: ``none``); ``model_name``: the
        workload's name, for methods that match it against a profile."""
        import compression
        self.model = model
        self.optimizer = optimizer
        self.comm = comm
        self.options = options if options is not None else self.Options()
        self.compressor = compressor if compressor is not None else compression.create("none")
        self.model_name = model_name
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.param_names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.failed = False  # set when the run failed: close() then waits for nothing
        self._handles = []

    # -- lifetime ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the method's threads (none by default); called once, before training."""

    def close(self) -> None:
        """Stop threads, remove hooks, release groups; safe after a failure, and twice."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> "Method":
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        from ..errors import PSError, say
        if exc_type is None:
            self.close()
            return
        if isinstance(exc, PSError):
            # A parameter server is gone: threads may be blocked on it for good, and the job
            # entry ends this process at once with the error's line.
            return
        self.failed = True  # nothing left in flight is waited for
        try:
            self.close()
        except Exception as e:  # the run's own error is the one that propagates
            say(f"ddlbench: while stopping {self.id or type(self).__name__} after an error: "
                f"{type(e).__name__}: {e}")

    # -- the training loop ---------------------------------------------------------------------
    @property
    def module(self) -> "nn.Module":
        """What the training loop calls forward on (DDP returns its wrapper)."""
        return self.model

    def calibrate(self, forward_backward) -> None:
        """Called once before training with a function that runs one forward and backward
        pass on this rank's batch (no update). Methods that plan from measurements (MG-WFBP's
        per-tensor backward times) measure here; every rank calls it, so collectives are fine.
        Gradients are cleared afterwards by the caller."""

    def step(self) -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        """Finish all outstanding communication and updates."""

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def full_parameters(self) -> list["torch.Tensor"]:
        """The trainable parameters as whole tensors, in ``model.parameters()`` order, as they
        stand after ``synchronize()``: what ``--verify`` compares with its reference (every
        rank calls it at once: a method keeping shards may gather them here)."""
        return self.params

    def hook_local_gradients(self, capture) -> list:
        """Have ``capture(index, grad)`` called with trainable parameter ``index``'s whole local
        gradient each backward, as autograd produces it and before the method's own hooks
        see it (``--verify``'s reference averages these); returns handles (``remove()``)."""
        return [p.register_hook(lambda grad, i=i: capture(i, grad))
                for i, p in enumerate(self.params)]

    def library_timeline(self) -> list:
        """After the timed rounds: the spans the method's library recorded itself, in the
        timeline's event form on this rank's clock (the BytePS lane: BytePS's own trace, with
        ``--timeline PATH``). The suite's methods record through ``Comm``: none."""
        return []

    def plan(self) -> BucketPlan:
        """The buckets handed to the compressor (--verify applies the compressor's
        mathematics to the same buckets); required of methods that accept a compressor."""
        raise NotImplementedError(f"{self.id or type(self).__name__} has no bucket plan")

    def describe(self) -> dict:
        """Settings and derived facts (groups, buffer sizes) for the run record; ``memory``:
        the bytes of optimizer state this worker holds (after the timed rounds)."""
        return {"method": self.id, "architecture": self.architecture,
                "memory": {"optimizer_state_bytes": optimizer_state_bytes(self.optimizer)}}

    # -- helpers -------------------------------------------------------------------------------
    def given_compressor(self):
        """The compressor, or None for ``none``: for methods that send dense gradients their
        own way (DDP's all-reduce, ByteScheduler's chunks) unless compressing."""
        return self.compressor if self.compressor.id != "none" else None

    def _register_ready_hooks(self, callback) -> None:
        """Call ``callback(index)`` when parameter ``index``'s gradient is fully accumulated."""
        from .. import compat
        for i, p in enumerate(self.params):
            self._handles.append(compat.on_grad_ready(p, lambda _p, i=i: callback(i)))


def require_even_machines(method_id: str, comm) -> None:
    """One line when the job's machines hold different numbers of workers: a method whose
    shards live on the ``machine`` group needs them to match across machines."""
    problem = uneven_machines(method_id, [len(m) for m in comm.machines()])
    if problem:
        from ..errors import UsageError
        raise UsageError(problem)


def uneven_machines(method_id: str, sizes: list[int]) -> str | None:
    """``require_even_machines``'s line for machines holding ``sizes`` workers (None: even)."""
    if len(set(sizes)) > 1:
        return (f"method {method_id} needs as many workers on every machine (its shards must "
                f"match across machines); this job's machines hold {', '.join(map(str, sizes))}")
    return None


def check_one_dense_method(engine: str, methods: list[str], compressors: list[str],
                           why_one: str) -> None:
    """A lane's first input checks, one line each: one method per job (``why_one``: what
    makes the framework's settings the process's, after the colon or in brackets) and no
    compressor (the lane sends dense gradients; the compressors run on --engine torch)."""
    from ..errors import UsageError
    if len(methods) > 1:
        raise UsageError(f"--engine {engine} runs one method per job{why_one}")
    for c in compressors:
        if c != "none":
            raise UsageError(f"--engine {engine} takes --compressor none, not {c!r} (the "
                             f"compressors run on --engine torch)")


def optimizer_state_bytes(optimizer) -> int:
    """The bytes of every tensor in a torch optimizer's state (momentum buffers, Adam's
    moments and step counts): what it holds for the parameters it steps."""
    total = 0
    for state in getattr(optimizer, "state", {}).values():
        for value in state.values():
            if hasattr(value, "numel") and hasattr(value, "element_size"):
                total += value.numel() * value.element_size()
    return total


class LaneMethod(Method):
    """A torch-engine method (``implements``) on a real framework's machinery (the Horovod and
    BytePS lanes): the same id, options, architecture, summary and launcher; ``engine`` names
    the lane. A lane may declare ``Options`` of its own (the same options with the framework's
    settings as defaults: the DeepSpeed lane's)."""

    implements: ClassVar[type[Method]] = Method

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        done = cls.implements
        cls.id, cls.architecture = done.id, done.architecture
        cls.Options = cls.__dict__.get("Options", done.Options)
        cls.summary, cls.launcher, cls.launcher_vars = (done.summary, done.launcher,
                                                        done.launcher_vars)
