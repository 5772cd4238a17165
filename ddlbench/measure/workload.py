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
                        sentence_len=args.sentence_len, num_classes=args.num_classes)
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


def learning_rate(args, nworkers: int) -> float:
    """``--lr``, else 0.01 x workers (the original's scaling)."""
    return args.lr if args.lr is not None else 0.01 * nworkers


def make_optimizer(args, params, lr: float):
    """The plain torch optimizer of ``--optimizer`` over ``params``."""
    import torch
    if args.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=args.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=args.momentum, weight_decay=args.weight_decay)
