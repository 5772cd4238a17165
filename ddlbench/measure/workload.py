"""One rank's workload: the model with rank 0's initial state, its fake batch, its optimizer;
what they are is typed (``Spec``, ``OptimizerSpec``), built once from an entry's flags."""
from __future__ import annotations

from dataclasses import dataclass, fields


def _of(cls, flags, **renamed):
    """``cls`` from a command line's flags: each field from the flag of its name (or the one
    ``renamed`` maps it to), its default where the command has no such flag."""
    values = {}
    for f in fields(cls):
        name = renamed.get(f.name, f.name)
        if hasattr(flags, name):
            values[f.name] = getattr(flags, name)
    return cls(**values)


@dataclass(frozen=True)
class Spec:
    """What a replica is: the model (``models.build``'s name) and its input (image size,
    sentence length, classes, BERT's vocabulary; None: the model's own), the per-worker batch,
    the seed and the parameters' dtype."""
    model: str
    batch_size: int = 64
    sentence_len: int = 64
    image_size: int | None = None
    num_classes: int = 1000
    vocab_size: int | None = None
    seed: int = 42
    dtype: str = "float32"

    @classmethod
    def of(cls, flags) -> "Spec":
        return _of(cls, flags)

    def build(self, attention: str | None = None):
        """The ``models.Workload`` (on the current default device)."""
        import models
        extra = {} if attention is None else {"attention": attention}
        return models.build(self.model, image_size=self.image_size,
                            sentence_len=self.sentence_len, num_classes=self.num_classes,
                            vocab_size=self.vocab_size, **extra)


@dataclass(frozen=True)
class OptimizerSpec:
    """The plain torch optimizer a run wraps: ``flag`` as ``--optimizer`` gives it (auto: the
    original's for ``model``), the learning rate (None: the original's), SGD's momentum
    (None: 0) and the weight decay."""
    model: str
    flag: str = "auto"
    lr: float | None = None
    momentum: float | None = None
    weight_decay: float = 0.0

    @classmethod
    def of(cls, flags) -> "OptimizerSpec":
        return _of(cls, flags, flag="optimizer")


def replica(spec: Spec, ctx):
    """This rank's model, with rank 0's initial parameters and buffers, in training mode on
    the device, and one fake batch of its own (different data on each rank)."""
    import torch
    import torch.distributed as dist

    torch.manual_seed(spec.seed)
    work = spec.build()
    dtype = getattr(torch, spec.dtype)
    work.model.to(ctx.device, dtype=dtype).train()
    with torch.no_grad():
        for t in list(work.model.parameters()) + list(work.model.buffers()):
            dist.broadcast(t.data, 0)
    gen = torch.Generator().manual_seed(spec.seed * 1000 + ctx.rank)
    return work, _cast(work.make_batch(spec.batch_size, ctx.device, gen), dtype)


def _cast(batch, dtype):
    """The floating-point tensors of a batch in ``dtype`` (token ids and labels stay)."""
    import torch
    if isinstance(batch, torch.Tensor):
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return {k: _cast(v, dtype) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_cast(v, dtype) for v in batch)
    return batch


# The original suite's optimizers (HKBU-HPML/ddl-benchmarks, docs/DESIGN.md section 8): its CNN
# scripts ran torch SGD without momentum at 0.01 x workers, its BERT scripts (horovod/, mgwfbp/)
# transformers' AdamW at 2e-5, eps 1e-8, weight decay 0, not scaled by the workers; its byteps/
# scripts (the parameter-server runs) trained every model, CNNs and BERT, with torch SGD at 0.01,
# no momentum, not scaled by the workers: ``original-ps``.
OPTIMIZERS = ("auto", "sgd", "adam", "adamw", "original-ps")
SGD_LR_PER_WORKER = 0.01
ORIGINAL_PS_LR = 0.01
ADAM_LR = 2e-5
ADAM_EPS = 1e-8
DEFAULT_MOMENTUM = 0.0


def is_bert(model: str) -> bool:
    """Whether ``--model`` names one of the BERT workloads (the rest are torchvision CNNs)."""
    import models
    return model in models.BERT_CONFIGS


def optimizer_name(spec: OptimizerSpec) -> str:
    """``--optimizer``, with ``auto`` resolved to the original's choice for the model family:
    adamw for BERT, sgd for the CNNs; ``original-ps`` is sgd."""
    if spec.flag == "original-ps":
        return "sgd"
    if spec.flag != "auto":
        return spec.flag
    return "adamw" if is_bert(spec.model) else "sgd"


def learning_rate(spec: OptimizerSpec, nworkers: int) -> float:
    """``--lr``, else the original's for the optimizer: SGD 0.01 x workers, Adam and AdamW
    2e-5 (not scaled); ``original-ps`` 0.01 (not scaled)."""
    if spec.lr is not None:
        return spec.lr
    if spec.flag == "original-ps":
        return ORIGINAL_PS_LR
    return SGD_LR_PER_WORKER * nworkers if optimizer_name(spec) == "sgd" else ADAM_LR


def make_optimizer(spec: OptimizerSpec, params, lr: float):
    """The plain torch optimizer ``optimizer_name(spec)`` names, over ``params``."""
    import torch
    name = optimizer_name(spec)
    if name == "adamw":  # (torch's AdamW defaults to weight decay 0.01; the original had 0)
        return torch.optim.AdamW(params, lr=lr, eps=ADAM_EPS, weight_decay=spec.weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, eps=ADAM_EPS, weight_decay=spec.weight_decay)
    momentum = DEFAULT_MOMENTUM if spec.momentum is None else spec.momentum
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=spec.weight_decay)


def optimizer_info(spec: OptimizerSpec, optimizer) -> dict:
    """What ran, for the record: the class and its first group's hyper-parameters (None where
    the class has no such setting), and whether ``--optimizer auto`` chose it."""
    group = optimizer.param_groups[0]
    betas = group.get("betas")
    return {"class": type(optimizer).__name__, "flag": spec.flag,
            "auto": spec.flag == "auto", "lr": group["lr"], "lr_given": spec.lr is not None,
            "momentum": group.get("momentum"), "betas": list(betas) if betas else None,
            "eps": group.get("eps"), "weight_decay": group["weight_decay"]}


# The workload's flags, as every command that builds a replica names them (those a command has:
# the overhead command has no --num-classes).
WORKLOAD_FLAGS = ("--batch-size", "--sentence-len", "--image-size", "--num-classes",
                  "--vocab-size")


def check_workload(args, positive=(), nonneg=()) -> None:
    """The input checks the training script, the profiler and the overhead command share,
    before any worker starts (one ``UsageError`` line): the workload's flags (``WORKLOAD_FLAGS``
    the command has) and the command's own ``positive`` and ``nonneg`` ones finite, in range
    and within ``options.LIMITS``; the model known, ``--vocab-size`` a BERT's, the image one the
    model takes at that batch."""
    import models

    from ..options import check_flags as check_numbers
    own = tuple(f for f in WORKLOAD_FLAGS if hasattr(args, f[2:].replace("-", "_")))
    check_numbers(args, positive=own + tuple(f for f in positive if f not in own),
                  nonneg=nonneg)
    models.check(args.model)
    if getattr(args, "vocab_size", None) is not None:
        models.check_vocab(args.model, args.vocab_size)
    models.check_input(args.model, args.image_size, args.batch_size)
