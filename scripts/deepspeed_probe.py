"""Real DeepSpeed's ZeRO on CPU/Gloo against single-process SGD on the averaged gradient.

    PYTHONPATH=. "$(scripts/deepspeed_env.sh python)" scripts/deepspeed_probe.py \
        [--nproc 2] [--stages 0,1,2] [--steps 3] [--optimizer sgd|sgdm|adamw] \
        [--backward engine|torch] [--multi-rank-allreduce 1|0]

Starts --nproc worker processes (torch.distributed on Gloo, DeepSpeed's CPU accelerator) for
each stage. Every worker builds the same small fp32 MLP (seed 0), takes its own batch (seed
100 + rank + 1000 * step) and runs ``engine(x)``, ``engine.backward(loss)``, ``engine.step()``
with plain SGD (lr 0.1, no momentum, no weight decay, no clipping) for --steps steps; each
step it also records its local gradient (a tensor hook, before DeepSpeed touches it). Rank 0
then steps a copy of the initial model with torch.optim.SGD on the average of the ranks'
local gradients and prints, per stage, the largest |p_deepspeed - p_reference| and the
largest difference between the ranks' parameters. It also counts what DeepSpeed sends through
torch.distributed (each collective's name and bytes, one step after the first), the bytes
being the tensor's as torch's collectives take it. Exit 1 when a stage is off by more than
--atol.

DeepSpeed's shared-memory communication op (``ShareMemCommBuilder``, JIT-compiled with ninja
when ``deepspeed.comm`` starts) serves only ``inference_all_reduce``; training never calls it,
so the workers start without it (``deepspeed.comm.torch.build_shm_op`` returns None).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile

IN, HIDDEN, OUT, BATCH, LR = 32, 64, 8, 16, 0.1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, OUT))


def batch(rank: int, step: int):
    import torch
    g = torch.Generator().manual_seed(100 + rank + 1000 * step)
    return torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g)


class Counter:
    """Wraps torch.distributed's collectives that DeepSpeed's comm layer calls; records
    (name, bytes of its largest tensor argument: the full buffer) while ``on``."""

    NAMES = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "broadcast",
             "all_gather", "reduce_scatter", "reduce", "all_to_all_single", "send", "recv")

    def __init__(self):
        import torch.distributed as dist
        self.on, self.calls = False, []
        for name in self.NAMES:
            if hasattr(dist, name):
                setattr(dist, name, self._wrap(name, getattr(dist, name)))

    def _wrap(self, name, fn):
        def counted(*args, **kwargs):
            if self.on:
                self.calls.append((name, max(_nbytes(a) for a in (*args, *kwargs.values()))))
            return fn(*args, **kwargs)
        return counted


def _nbytes(arg) -> int:
    """Bytes of a tensor, or of a list of tensors; 0 for anything else."""
    import torch
    if isinstance(arg, torch.Tensor):
        return arg.numel() * arg.element_size()
    if isinstance(arg, (list, tuple)):
        return sum(_nbytes(a) for a in arg)
    return 0


def make_optimizer(name: str, params):
    import torch
    if name == "sgd":
        return torch.optim.SGD(params, lr=LR)
    if name == "sgdm":
        return torch.optim.SGD(params, lr=LR, momentum=0.9, weight_decay=1e-4)
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)


def worker(stage: int, steps: int, optimizer: str, out: str, backward: str,
           multi_rank: str) -> None:
    import torch
    import deepspeed
    import deepspeed.comm.torch  # noqa: F401  (deepspeed.comm's `torch` attribute is torch)
    # DeepSpeed's inference-only shared-memory op, which it would JIT-compile; the note above.
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    counter = Counter()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    model = make_model()
    local = {}
    for i, p in enumerate(model.parameters()):
        p.register_hook(lambda g, i=i: local.__setitem__(i, g.detach().clone()))
    config = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
              "train_batch_size": BATCH * world,
              "zero_optimization": {"stage": stage,
                                    "use_multi_rank_bucket_allreduce": multi_rank == "1"},
              "gradient_clipping": 0.0, "steps_per_print": 10 ** 9,
              "wall_clock_breakdown": False,
              # torch's SGD is not on ZeRO's list of tested optimizers (Adam, AdamW, Adagrad and
              # DeepSpeed's own); ZeRO steps it on its flat fp32 partition like any other.
              "zero_allow_untested_optimizer": True}
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=make_optimizer(optimizer, model.parameters()), config=config)
    grads = []
    for step in range(steps):
        x, y = batch(rank, step)
        counter.on = step == 1
        loss = torch.nn.functional.mse_loss(engine(x), y)
        if backward == "engine":
            engine.backward(loss)
        else:   # torch style: DeepSpeed's hooks on the output run its prologue and epilogue
            loss.backward()
        engine.step()
        counter.on = False
        grads.append([local[i].tolist() for i in range(len(local))])
    params = [p.detach().tolist() for p in engine.module.parameters()]
    with open(out, "w") as f:
        json.dump({"grads": grads, "params": params, "calls": counter.calls,
                   "gradient_predivide_factor": engine.gradient_predivide_factor(),
                   "postscale_gradients": engine.postscale_gradients(),
                   "optimizer": type(engine.optimizer).__name__}, f)


def reference(results: list, steps: int, optimizer: str):
    import torch
    model = make_model()
    opt = make_optimizer(optimizer, model.parameters())
    for step in range(steps):
        for i, p in enumerate(model.parameters()):
            total = sum(torch.tensor(r["grads"][step][i], dtype=torch.float64) for r in results)
            p.grad = (total / len(results)).to(p.dtype)
        opt.step()
    return [p.detach() for p in model.parameters()]


def run_stage(stage: int, nproc: int, steps: int, optimizer: str, backward: str = "engine",
              multi_rank: str = "1") -> dict:
    import torch
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs, outs = [], []
        for rank in range(nproc):
            out = os.path.join(tmp, f"rank{rank}.json")
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                       LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), DS_ACCELERATOR="cpu")
            procs.append(subprocess.Popen([sys.executable, __file__, "--worker", str(stage),
                                           str(steps), optimizer, out, backward,
                                           multi_rank], env=env))
            outs.append(out)
        if any(p.wait(timeout=300) != 0 for p in procs):
            raise SystemExit(f"deepspeed_probe: a worker of stage {stage} failed")
        results = [json.load(open(o)) for o in outs]
    ref = reference(results, steps, optimizer)
    ds = [torch.tensor(p) for p in results[0]["params"]]
    diff = max((a - b).abs().max().item() for a, b in zip(ds, ref))
    spread = max((torch.tensor(a) - torch.tensor(b)).abs().max().item()
                 for r in results[1:] for a, b in zip(r["params"], results[0]["params"]))
    grad_bytes = sum(p.numel() * 4 for p in ref)
    return {"stage": stage, "max_abs_diff": diff, "replica_spread": spread,
            "calls_step2_rank0": results[0]["calls"], "gradient_bytes": grad_bytes,
            **{k: results[0][k] for k in ("gradient_predivide_factor", "postscale_gradients",
                                          "optimizer")}}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:8])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--stages", default="0,1,2")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--atol", type=float, default=1e-6)
    ap.add_argument("--optimizer", choices=("sgd", "sgdm", "adamw"), default="sgd",
                    help="sgd: lr 0.1; sgdm: lr 0.1, momentum 0.9, weight decay 1e-4; adamw: "
                         "lr 1e-3, weight decay 0.01")
    ap.add_argument("--backward", choices=("engine", "torch"), default="engine",
                    help="engine.backward(loss), or loss.backward() (stages 1 and 2 only)")
    ap.add_argument("--multi-rank-allreduce", choices=("0", "1"), default="1",
                    help="ZeRO's use_multi_rank_bucket_allreduce (DeepSpeed's default 1: each "
                         "bucket all-reduced; 0: reduced to each owner of a partition)")
    ap.add_argument("--json", action="store_true", help="also print each stage's figures as "
                    "one JSON line")
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be at least 2 (the bytes are counted on the second)")
    bad = 0
    for stage in (int(s) for s in args.stages.split(",")):
        r = run_stage(stage, args.nproc, args.steps, args.optimizer, args.backward,
                      args.multi_rank_allreduce)
        sent = {}
        for name, n in r["calls_step2_rank0"]:
            c, b = sent.get(name, (0, 0))
            sent[name] = (c + 1, b + n)
        print(f"stage {stage}: P={args.nproc} {args.optimizer} {args.backward} backward, "
              f"multi-rank all-reduce {args.multi_rank_allreduce}, steps={args.steps} max|p-ref|="
              f"{r['max_abs_diff']:.3e} replicas {r['replica_spread']:.3e} optimizer "
              f"{r['optimizer']} predivide {r['gradient_predivide_factor']} postscale "
              f"{r['postscale_gradients']}; step 2 collectives (calls, tensor bytes): {sent}; "
              f"G = {r['gradient_bytes']} bytes", flush=True)
        if args.json:
            print(json.dumps(r), flush=True)
        bad += r["max_abs_diff"] > args.atol or r["replica_spread"] != 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
