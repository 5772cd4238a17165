"""The method of the real-DeepSpeed lane (``--engine deepspeed``): DeepSpeed 0.19.8's ZeRO-1/2.

- ``zero``: the model and the user's torch optimizer handed to ``deepspeed.initialize`` (its
  ``DeepSpeedEngine`` is what the training loop calls forward on; a plain ``loss.backward()``
  drives ZeRO's gradient hooks, DeepSpeed 0.19 hooking the engine's output for its prologue
  and epilogue), ``step()`` is ``engine.step()``: ZeRO stage ``--zero-stage`` (1 or 2), its
  reduce and all-gather buckets ``--threshold`` bytes (DeepSpeed counts them in elements).

It runs on torch.distributed's process group the job already set up (Gloo, on CPU):
``deepspeed.init_distributed`` finds it initialised and only wraps it. On Gloo DeepSpeed's
ZeRO-1/2 all-reduce each gradient bucket (then keep their partition) and all-gather the updated
partitions after the step: what the suite's ``zero`` does with ``--rs-carrier native
--gather-prefetch 0``, so these are the lane's settings (and the only ones it takes).

Its collectives are counted through the ``Comm``: every data-moving call DeepSpeed's comm
layer (``deepspeed.comm``) makes on its backend object goes through a wrapper
(``lane_comm.CountedBackend``) that counts the tensors as the suite's collectives declare them
and puts the call on the timeline; a call of a collective the suite does not declare
(``reduce``, ``gather``, point-to-point) is named in the
record (``method.deepspeed.uncounted``) instead. Only DeepSpeed's calls pass there: the suite's
own (the verifier's, the timing barriers) go to torch.distributed directly.

DeepSpeed lives in an environment of its own (``scripts/deepspeed_env.sh``; its Python runs
the training script). Its shared-memory op (``ShareMemCommBuilder``), which it would compile
with ninja when ``deepspeed.comm`` starts, serves only ``inference_all_reduce``: the lane
starts without it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from ..errors import UsageError
from ..options import option
from .base import LaneMethod, check_one_dense_method
from .lane_comm import CountedBackend
from .zero import CARRIERS, GATHER_CARRIERS, SWITCH, Zero, ZeroOptions

@dataclass(frozen=True)
class DeepSpeedZeroOptions(ZeroOptions):
    """zero's options with DeepSpeed's ZeRO-1/2 as their defaults (the record says what ran)."""
    rs_carrier: str = option(
        "native", CARRIERS, "how gradients are reduce-scattered: DeepSpeed's ZeRO all-reduces "
        "each bucket on Gloo and keeps its partition (native)")
    ag_carrier: str = option(
        "native", GATHER_CARRIERS, "how the updated partitions are all-gathered: DeepSpeed's "
        "all_gather_into_tensor (native)")
    gather_prefetch: str = option(
        "0", SWITCH, "DeepSpeed's ZeRO-1/2 step waits for every all-gather (0)")


# What DeepSpeed's ZeRO-1/2 does on Gloo, in the suite's zero's terms (docs/DESIGN.md
# section 10, "DeepSpeed"): the bucket all-reduced (a native reduce-scatter on Gloo), the
# step waiting for the all-gathers of the updated partitions: the options whose defaults
# DeepSpeedZeroOptions changes
SETTINGS = {spec.name: spec.default for spec in DeepSpeedZeroOptions.specs()
            if spec.default != getattr(ZeroOptions(), spec.name)}


def check(args, methods: list[str], compressors: list[str], under_launcher: bool) -> None:
    """The input checks of an --engine deepspeed run, each a clear line."""
    check_one_dense_method("deepspeed", methods, compressors,
                           " (DeepSpeed's comm layer and its config are the process's)")
    if args.nservers:
        raise UsageError("--engine deepspeed has no parameter servers (--nservers)")
    for name, value in SETTINGS.items():
        given = getattr(args, name, None)
        if name in getattr(args, "given", ()) and given != value:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"--engine deepspeed runs DeepSpeed's ZeRO as it is on Gloo "
                             f"({flag} {value}: "
                             + ", ".join(f"--{k.replace('_', '-')} {v}"
                                         for k, v in SETTINGS.items())
                             + f"), not {flag} {given}; the others run on --engine torch")


# DeepSpeed's backend calls (``deepspeed.comm.comm.cdb``, a ``TorchBackend``) that move data,
# with their parameters in order (its methods are decorated without their signatures): the
# suite's declared collective each one is counted as (None: not declared, named in the record
# uncounted) and the parameter holding this rank's own tensor(s)
CALLS = {
    "all_reduce": ("tensor op group async_op", "allreduce", "tensor"),
    "all_reduce_coalesced": ("tensors op group async_op", "allreduce", "tensors"),
    "inference_all_reduce": ("tensor op group", "allreduce", "tensor"),
    "all_gather_into_tensor": ("output_tensor input_tensor group async_op", "allgather",
                               "input_tensor"),
    "all_gather_base": ("output_tensor input_tensor group async_op", "allgather",
                        "input_tensor"),
    "all_gather": ("tensor_list tensor group async_op", "allgather", "tensor"),
    "all_gather_coalesced": ("output_tensors input_tensors group async_op", "allgather",
                             "input_tensors"),
    "broadcast": ("tensor src group async_op", "broadcast", "tensor"),
    "reduce_scatter_tensor": ("output_tensor input_tensor op group async_op", "reduce_scatter",
                              "input_tensor"),
    "all_to_all_single": ("output input output_split_sizes input_split_sizes group async_op",
                          "all_to_all", "input"),
    "reduce": ("tensor dst op group async_op", None, "tensor"),
    "reduce_scatter": ("output input_list op group async_op", None, "input_list"),
    "all_to_all": ("output_tensor_list input_tensor_list group async_op", None,
                   "input_tensor_list"),
    "gather": ("tensor gather_list dst group async_op", None, "tensor"),
    "scatter": ("tensor scatter_list src group async_op", None, "scatter_list"),
    "send": ("tensor dst group tag", None, "tensor"),
    "recv": ("tensor src group tag", None, "tensor"),
    "isend": ("tensor dst group tag", None, "tensor"),
    "irecv": ("tensor src group tag", None, "tensor"),
}


def _deepspeed():
    """DeepSpeed, its comm layer started without the shared-memory op it would compile."""
    import sys

    import deepspeed
    import deepspeed.comm.torch  # noqa: F401  (the module; ``deepspeed.comm.torch`` is torch)
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    return deepspeed


class DeepSpeedZero(LaneMethod):
    """The torch engine's ``zero`` on DeepSpeed's own ZeRO-1/2 (module docstring)."""

    implements = Zero
    engine = "deepspeed"
    display = "DeepSpeed ZeRO"
    Options = DeepSpeedZeroOptions

    @classmethod
    def accepts(cls, compressor: str) -> str | None:
        return None if compressor == "none" else "the DeepSpeed lane sends dense gradients"

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None,
                 batch_size: int = 1):
        """``batch_size``: the run's batch per worker (``session.build`` passes it to a method
        that takes it), DeepSpeed's ``train_micro_batch_size_per_gpu``."""
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        import torch.distributed as dist
        if any(p.device.type != "cpu" for p in self.params):
            raise UsageError("--engine deepspeed runs on the CPU, on Gloo (DeepSpeed's CPU "
                             "accelerator); the parameters are on "
                             f"{self.params[0].device}")
        if comm.group is not None and dist.get_world_size(comm.group) != dist.get_world_size():
            raise UsageError("--engine deepspeed trains on every rank of the job (DeepSpeed's "
                             "data-parallel group is the world)")
        ds = _deepspeed()
        from deepspeed.utils import logger
        logger.setLevel(logging.WARNING)   # its INFO lines would bury the suite's log
        ds.init_distributed(dist_backend=dist.get_backend(), dist_init_required=False)
        self.counted = CountedBackend(ds.comm.comm.cdb, comm, CALLS, "deepspeed")
        self.config = self.ds_config(self.options, comm.size, batch_size,
                                     self.params[0].element_size() if self.params else 4)
        self.engine, *_ = ds.initialize(model=model, optimizer=optimizer, config=self.config,
                                        dist_init_required=False)
        self.version = ds.__version__

    @staticmethod
    def ds_config(options, world: int, micro_batch: int, itemsize: int) -> dict:
        """DeepSpeed's config for ``options``: ZeRO ``zero_stage`` with buckets of
        ``threshold`` bytes (DeepSpeed counts elements; at least one), one micro batch per
        step, no loss scaling, no clipping; torch's optimizers allowed (ZeRO steps them on its
        flat partition like its own)."""
        bucket = max(1, int(options.threshold) // itemsize)
        return {"train_micro_batch_size_per_gpu": micro_batch,
                "gradient_accumulation_steps": 1,
                "train_batch_size": micro_batch * world,
                "zero_optimization": {"stage": int(options.zero_stage),
                                      "reduce_bucket_size": bucket,
                                      "allgather_bucket_size": bucket},
                "zero_allow_untested_optimizer": True,
                "gradient_clipping": 0.0, "steps_per_print": 10 ** 9,
                "wall_clock_breakdown": False}

    @property
    def module(self):
        return self.engine

    def step(self) -> None:
        self.engine.step()

    def zero_grad(self) -> None:
        self.engine.zero_grad()

    def close(self) -> None:
        super().close()
        counted = getattr(self, "counted", None)
        if counted is not None:
            counted.restore()
        engine = getattr(self, "engine", None)
        if engine is not None and hasattr(engine, "destroy"):
            engine.destroy()

    def describe(self) -> dict:
        import torch
        d = super().describe()
        d["engine"] = "deepspeed"
        d["deepspeed"] = {"version": self.version, "torch": torch.__version__,
                          "config": self.config,
                          "optimizer": type(self.engine.optimizer).__name__,
                          "uncounted": self.counted.describe()}
        d["bytes_counted_from"] = "DeepSpeed's comm layer (its backend's calls)"
        return d
