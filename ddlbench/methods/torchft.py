"""The method of the real-torchft lane (``--engine torchft``): torchft 0.2.0's DiLoCo.

- ``diloco``: every training worker of the job is one replica group of one worker, with its own
  ``torchft.Manager`` (on a ``torchft.ProcessGroupGloo``, a ``TCPStore`` of its own, the quorum
  taken synchronously, ``min_replica_size`` the job's P) and ``torchft.local_sgd.DiLoCo(manager,
  [model], <the run's optimizer>, <outer optimizer>, sync_every=--period)``. DiLoCo hooks the
  inner optimizer's step: after every H-th step it asks the lighthouse for a quorum, all-reduces
  each parameter's pseudo-gradient (global minus local parameters; torchft's default, no buckets)
  through the manager (a sum on its process group, divided by the participants), restores the
  global parameters, has the outer optimizer step them with the average, and keeps them as the
  new global ones (``fragment_update_alpha`` 0). The outer optimizer is the suite's
  ``diloco``'s: SGD with Nesterov momentum ``--outer-momentum`` (plain SGD at 0) and rate
  ``--outer-lr``. The options are ``diloco``'s with its messages, one per tensor, as the
  ``--threshold`` (0; ``TorchftDiLoCoOptions``: another is refused), and so is
  ``--verify``'s reference (``periodic_reference.DiLoCoMath``, P replicas simulated).

Rank 0 of the job starts torchft's lighthouse (``torchft.coordination.LighthouseServer``, the
Rust server the wheel's ``torchft_lighthouse`` runs) on a port the kernel picks, on the address
this process reaches the job's rendezvous from (127.0.0.1 on one machine, the emulated host's
address on an emulated network), with ``min_replicas`` P; its address reaches the other ranks
through the job's own process group; it stops when the method closes. The replicas start equal
(the suite seeds them alike), so the managers are built with ``init_sync`` false: no replica
fetches a checkpoint from another.

Its collectives are counted through the ``Comm``: the data-moving methods of the torchft
process group the manager issues on are wrapped for the method's lifetime
(``lane_comm.CountedBackend``): every all-reduce of a pseudo-gradient counted as ``allreduce``
(2(P-1)/P G per worker every H steps on the ring, ``diloco``'s bytes) and put on the timeline;
anything torchft's process group is asked that the suite does not declare is named in the
record (``method.torchft.uncounted``). The quorum and commit RPCs (to the lighthouse and the
replica's own manager server, gRPC) are not collectives and are not counted; their count is in
the record.

torchft lives in an environment of its own (``scripts/torchft_env.sh``; its Python runs the
training script).
"""
from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass

from ..errors import UsageError
from .allreduce import threshold_option
from .base import LaneMethod, check_one_dense_method
from .lane_comm import CountedBackend
from .periodic import DiLoCo, DiLoCoOptions, _EveryPeriod

# what torchft's DiLoCo does that diloco on --engine torch sets with the option: its own
# choice of messages (one all-reduce per parameter)
NOT_THRESHOLD = ("--engine torchft runs torchft's DiLoCo as it is: one all-reduce per "
                 "parameter's pseudo-gradient, not buckets of --threshold bytes (diloco on "
                 "--engine torch packs them)")


@dataclass(frozen=True)
class TorchftDiLoCoOptions(DiLoCoOptions):
    """diloco's options with torchft's DiLoCo's messages as the default, so the record (and
    the model, given the record's options) has what ran: one message per tensor."""
    threshold: float = threshold_option(
        0.0, "torchft's DiLoCo all-reduces each parameter's pseudo-gradient on its own (0: one "
             "message per tensor)")


def check(args, methods: list[str], compressors: list[str], under_launcher: bool) -> None:
    """The input checks of an --engine torchft run, each a clear line."""
    check_one_dense_method("torchft", methods, compressors,
                           " (each worker is one torchft replica group with its manager)")
    if args.nservers:
        raise UsageError("--engine torchft has no parameter servers (--nservers)")
    if "threshold" in getattr(args, "given", ()) and float(args.threshold) != 0.0:
        raise UsageError(NOT_THRESHOLD)


# torchft's process group's data-moving methods (``torchft.process_group.ProcessGroup``), with
# their parameters in order: the suite's declared collective each one is counted as (None: not
# declared, named in the record uncounted) and the parameter holding this rank's own tensor(s)
CALLS = {
    "allreduce": ("tensors opts", "allreduce", "tensors"),
    "allreduce_coalesced": ("tensors opts", "allreduce", "tensors"),
    "allgather": ("output_tensors input_tensor opts", "allgather", "input_tensor"),
    "allgather_into_tensor_coalesced": ("output_tensors input_tensors opts", "allgather",
                                        "input_tensors"),
    "broadcast": ("tensor_list opts", "broadcast", "tensor_list"),
    "alltoall_base": ("output_buffer input_buffer output_split_sizes input_split_sizes opts",
                      "all_to_all", "input_buffer"),
    "reduce_scatter": ("output_tensors input_tensors opts", None, "input_tensors"),
    "reduce_scatter_tensor_coalesced": ("output_tensors input_tensors opts", None,
                                        "input_tensors"),
    "send": ("tensors dst_rank tag", None, "tensors"),
    "recv": ("tensors src_rank tag", None, "tensors"),
}


class _CountedProcessGroup(CountedBackend):
    """torchft's process group: every call asynchronous (a ``Work``), its group the quorum's
    replicas (``size()``), a broadcast's root in its options."""

    def group_size(self, call: dict) -> int:
        return self.backend.size()

    def is_root(self, op: str, call: dict) -> bool:
        opts = call.get("opts")
        return op != "broadcast" or getattr(opts, "rootRank", 0) == self.backend._rank

    def is_async(self, call: dict) -> bool:
        return True


def own_address() -> str:
    """The address this process reaches the job's rendezvous (``MASTER_ADDR``) from: 127.0.0.1
    on one machine, this emulated host's address on an emulated network."""
    master = os.environ.get("MASTER_ADDR")
    if not master or master in ("127.0.0.1", "localhost"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((master, 9))   # (a datagram socket: nothing is sent)
        return s.getsockname()[0]


class TorchftDiLoCo(_EveryPeriod, LaneMethod):
    """The torch engine's ``diloco`` on torchft's DiLoCo and Manager (module docstring)."""

    implements = DiLoCo
    Options = TorchftDiLoCoOptions
    engine = "torchft"
    display = "torchft DiLoCo"
    changes_algorithm = DiLoCo.changes_algorithm
    reference = DiLoCo.reference

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        import torch.distributed as dist
        if any(p.device.type != "cpu" for p in self.params):
            raise UsageError("--engine torchft runs on the CPU, on Gloo; the parameters are on "
                             f"{self.params[0].device}")
        if comm.group is not None and dist.get_world_size(comm.group) != dist.get_world_size():
            raise UsageError("--engine torchft trains on every rank of the job (each one "
                             "replica group)")
        self.period = self.sync_period(self.options)
        # torchft's Rust lighthouse and managers log each quorum and commit at INFO
        os.environ.setdefault("RUST_LOG", "warn")
        self.host = own_address()
        self.lighthouse = self.manager = self.diloco = self.counted = self.store = None
        self.steps = self.commits = 0
        try:
            self.lighthouse_addr = self._start_lighthouse()
            self._start_manager()
        except BaseException:
            self._stop_lighthouse()   # never left behind
            raise
        self.outer = self.outer_optimizer()
        from torchft.local_sgd import DiLoCo as FtDiLoCo
        self.diloco = FtDiLoCo(self.manager, [model], optimizer, self.outer,
                               sync_every=self.period)

    def outer_optimizer(self):
        """diloco's outer optimizer on the model's parameters (DiLoCo steps them from the
        global ones it restores): Nesterov SGD, plain SGD at momentum 0."""
        import torch
        momentum = float(self.options.outer_momentum)
        return torch.optim.SGD(self.params, lr=float(self.options.outer_lr), momentum=momentum,
                               nesterov=momentum > 0)

    def _start_lighthouse(self) -> str:
        """Rank 0 starts the lighthouse (a kernel-chosen port); every rank learns its address."""
        import torch.distributed as dist
        from torchft.coordination import LighthouseServer
        box = [None]
        if self.comm.rank == 0:
            # join_timeout_ms: with min_replicas P every quorum holds all P replicas, so the
            # lighthouse need not wait for more to join
            self.lighthouse = LighthouseServer(bind=f"{self.host}:0",
                                               min_replicas=self.comm.size,
                                               join_timeout_ms=100)
            port = self.lighthouse.address().rsplit(":", 1)[1]
            box = [f"http://{self.host}:{port}"]
        if self.comm.size > 1:
            dist.broadcast_object_list(box, src=0, group=self.comm.group)
        return box[0]

    def _start_manager(self) -> None:
        """This replica group's store, process group (its calls counted) and manager."""
        import torch.distributed as dist
        from torchft import Manager, ProcessGroupGloo
        for name in ("torchft", "torchft_quorums", "torchft_commits", "torchft_errors"):
            logging.getLogger(name).setLevel(logging.WARNING)   # its INFO lines per sync
        self.store = dist.TCPStore(self.host, 0, is_master=True, wait_for_workers=False)
        self.pg = ProcessGroupGloo()
        self.counted = _CountedProcessGroup(self.pg, self.comm, CALLS, "torchft")
        self.manager = Manager(pg=self.pg, load_state_dict=None, state_dict=None,
                               min_replica_size=self.comm.size, use_async_quorum=False,
                               store_addr=self.host, store_port=self.store.port, rank=0,
                               world_size=1, lighthouse_addr=self.lighthouse_addr,
                               replica_id=f"ddlbench_{self.comm.rank}", hostname=self.host,
                               init_sync=False)

    def start(self) -> None:
        self.diloco.__enter__()   # its hooks on the inner optimizer's step

    def step(self) -> None:
        self.optimizer.step()     # DiLoCo's hook syncs after every H-th
        self.steps += 1

    def close(self) -> None:
        super().close()
        import torch.distributed as dist
        if self.diloco is not None:
            self.diloco.__exit__(None, None, None)
        if self.counted is not None:
            self.counted.restore()
        if self.manager is not None:
            self.commits = self.manager.current_step()
            self.manager.shutdown(wait=False)
            self.manager = None
            if not self.failed and self.comm.size > 1:
                dist.barrier(group=self.comm.group)   # every manager gone before the lighthouse
        self._stop_lighthouse()

    def _stop_lighthouse(self) -> None:
        if self.lighthouse is not None:
            self.lighthouse.shutdown()
            self.lighthouse = None
        self.store = None

    def describe(self) -> dict:
        from importlib.metadata import version

        import torch
        d = super().describe()
        d["engine"] = "torchft"
        commits = self.manager.current_step() if self.manager is not None else self.commits
        d.update({"period": self.period, "steps": self.steps, "syncs": commits,
                  "outer_lr": float(self.options.outer_lr),
                  "outer_momentum": float(self.options.outer_momentum),
                  "outer_nesterov": float(self.options.outer_momentum) > 0,
                  "changes_algorithm": self.changes_algorithm})
        d["torchft"] = {"version": version("torchft"), "torch": torch.__version__,
                        "min_replica_size": self.comm.size, "init_sync": False,
                        "uncounted": self.counted.describe()}
        d["bytes_counted_from"] = "torchft's process group (the manager's all-reduces)"
        return d
