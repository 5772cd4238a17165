"""One rank's workload: the model with rank 0's initial state, its fake batch, its optimizer."""
from __future__ import annotations


def replica(args, ctx):
    """This rank's model, with rank 0's initial parameters and buffers, in training mode on
    the device, and one fake batch of its own (different data on each rank)."""
    import torch
    import torch.distributed as dist

    import models
    torch.manual_seed(args.seed)
    work = models.build(args.model, image_size=args.image_size,
                        sentence_len=args.sentence_len, num_classes=args.num_classes,
                        vocab_size=getattr(args, "vocab_size", None))
    dtype = getattr(torch, getattr(args, "dtype", "float32"))
    work.model.to(ctx.device, dtype=dtype).train()
    with torch.no_grad():
        for t in list(work.model.parameters()) + list(work.model.buffers()):
            dist.broadcast(t.data, 0)
    gen = torch.Generator().manual_seed(args.seed * 1000 + ctx.rank)
    return work, _cast(work.make_batch(args.batch_size, ctx.device, gen), dtype)


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
# transformers' AdamW at 2e-5, eps 1e-8, weight decay 0, not scaled by the workers.
OPTIMIZERS = ("auto", "sgd", "adam", "adamw")
SGD_LR_PER_WORKER = 0.01
ADAM_LR = 2e-5
ADAM_EPS = 1e-8
DEFAULT_MOMENTUM = 0.0


def is_bert(model: str) -> bool:
    """Whether ``--model`` names one of the BERT workloads (the rest are torchvision CNNs)."""
    import models
    return model in models.BERT_CONFIGS


def optimizer_name(args) -> str:
    """``--optimizer``, with ``auto`` resolved to the original's choice for the model family:
    adamw for BERT, sgd for the CNNs."""
    if args.optimizer != "auto":
        return args.optimizer
    return "adamw" if is_bert(args.model) else "sgd"


def learning_rate(args, nworkers: int) -> float:
    """``--lr``, else the original's for the optimizer: SGD 0.01 x workers, Adam and AdamW
    2e-5 (not scaled)."""
    if args.lr is not None:
        return args.lr
    return SGD_LR_PER_WORKER * nworkers if optimizer_name(args) == "sgd" else ADAM_LR


def make_optimizer(args, params, lr: float):
    """The plain torch optimizer ``optimizer_name(args)`` names, over ``params``."""
    import torch
    name = optimizer_name(args)
    if name == "adamw":  # (torch's AdamW defaults to weight decay 0.01; the original had 0)
        return torch.optim.AdamW(params, lr=lr, eps=ADAM_EPS, weight_decay=args.weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, eps=ADAM_EPS, weight_decay=args.weight_decay)
    momentum = DEFAULT_MOMENTUM if args.momentum is None else args.momentum
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=args.weight_decay)


def optimizer_info(args, optimizer) -> dict:
    """What ran, for the record: the class and its first group's hyper-parameters (None where
    the class has no such setting), and whether ``--optimizer auto`` chose it."""
    group = optimizer.param_groups[0]
    betas = group.get("betas")
    return {"class": type(optimizer).__name__, "flag": args.optimizer,
            "auto": args.optimizer == "auto", "lr": group["lr"], "lr_given": args.lr is not None,
            "momentum": group.get("momentum"), "betas": list(betas) if betas else None,
            "eps": group.get("eps"), "weight_decay": group["weight_decay"]}
