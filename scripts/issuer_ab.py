"""The communication thread against issuing from the hook, at one worker (docs/DESIGN.md
section 3, "Issuing a collective").

    python scripts/issuer_ab.py MODEL BATCH [ROUNDS [METHODS]]     (e.g. bert_tiny 8 12 wfbp)

One process, a one-rank Gloo group, torch's threads from THREADS (default 1, so a core is left
for the thread), BERT's vocabulary from VOCAB (default 1000: a step of about 40 ms, where the
per-tensor costs show) and its sentence from SEQ, a CNN's image size from IMG. Loops on copies
of the same model, their timing rounds interleaved (order reversed every other round): ``bare``
(forward, backward, step), ``raw`` (a hook per parameter starting ``dist.all_reduce(grad,
async_op=True)``), and per method ``M:inline`` (its hooks issue, the thread switched off),
``M:thread`` (as it runs) and ``M:thread+tl`` (with the timeline recording, as in a
benchmark's timed rounds); HOW picks among inline,thread,thread+tl. Prints ms per iteration, the
throughput ratio to ``bare`` and the extra time per gradient tensor (medians of ROUNDS rounds of
10 iterations)."""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import models  # noqa: E402
from ddlbench.methods import create  # noqa: E402
from ddlbench.runtime.comm import Comm  # noqa: E402


def _workload(name):
    torch.manual_seed(0)
    if "bert" in name:
        return models.build(name, vocab_size=int(os.environ.get("VOCAB", "1000")),
                            sentence_len=int(os.environ.get("SEQ", "64")))
    return models.build(name, image_size=int(os.environ.get("IMG", "64")))


class Loop:
    def __init__(self, kind, name, batch):
        self.w = _workload(name)
        self.m = self.w.model
        self.opt = torch.optim.SGD(self.m.parameters(), lr=0.01, momentum=0.9)
        self.batch = self.w.make_batch(batch, torch.device("cpu"),
                                       torch.Generator().manual_seed(0))
        self.works, self.method = [], None
        self.n = sum(1 for p in self.m.parameters() if p.requires_grad)
        if kind == "raw":
            for p in self.m.parameters():
                p.register_post_accumulate_grad_hook(
                    lambda p: self.works.append(dist.all_reduce(p.grad, async_op=True)))
        elif kind != "bare":
            method, how = kind.split(":")
            comm = Comm(0, 1)
            self.method = create(method, self.m, self.opt, comm)
            self.method.start()
            if how == "inline":
                self.method._issuer = None
            if how.endswith("+tl"):
                comm.timeline.start()

    def step(self):
        self.w.loss(self.m, self.batch).backward()
        if self.method is not None:
            if self.method.comm.timeline.enabled:
                self.method.comm.timeline.events.clear()
            self.method.step()
            self.method.zero_grad()
            return
        for w in self.works:
            w.wait()
        self.works.clear()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def main() -> int:
    if len(sys.argv) < 3 or not sys.argv[2].isdigit():
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    name, batch = sys.argv[1], int(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    names = sys.argv[4].split(",") if len(sys.argv) > 4 else ["wfbp"]
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    hows = os.environ.get("HOW", "inline,thread,thread+tl").split(",")
    kinds = ["bare", "raw"] + [f"{m}:{h}" for m in names for h in hows]
    loops = {k: Loop(k, name, batch) for k in kinds}
    for loop in loops.values():
        for _ in range(3):
            loop.step()
    times = {k: [] for k in kinds}
    for r in range(rounds):
        for k in (kinds if r % 2 == 0 else kinds[::-1]):
            t = time.perf_counter()
            for _ in range(10):
                loops[k].step()
            times[k].append((time.perf_counter() - t) / 10)
    bare, n = statistics.median(times["bare"]), loops["bare"].n
    print(f"{name} batch {batch}, {n} tensors, {rounds} rounds of 10, "
          f"torch threads {torch.get_num_threads()}")
    for k, v in times.items():
        m = statistics.median(v)
        print(f"{k:16s} {m * 1e3:8.2f} ms  ratio {bare / m:.3f}  "
              f"extra/tensor {(m - bare) / n * 1e6:7.1f} us")
    for loop in loops.values():
        if loop.method is not None:
            loop.method.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
