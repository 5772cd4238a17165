"""ByteScheduler-A2A (docs/DESIGN.md section 5): partitions, priority, a credit window, per-layer
updates and a next forward that overlaps the tail of communication.

What it does, per iteration:

- **Partition.** A gradient of more than ``partition`` elements is cut into
  ceil(numel / partition) chunks (contiguous slices of the flat gradient, reduced in place).
- **Priority.** Front layers first: chunks are ranked by their tensor's index in
  ``model.parameters()`` (registration order, which is forward order for the suite's models),
  then by chunk index.
- **Credit.** A window of ``credit`` elements in flight. The dispatcher takes the
  highest-priority ready chunk while credit > 0 and subtracts its size (credit may go
  negative); a completed chunk gives its size back.
- **Per-layer update.** When every chunk of a tensor is reduced, the tensor is averaged and the
  optimizer is applied to that tensor alone, at once, while the rest is still in flight.
- **Cross-iteration overlap.** ``step()`` returns without waiting. Each module's forward
  pre-hook waits only for the updates of its own parameters, so the next forward runs its
  front layers (whose chunks have priority) while the back layers' chunks are still moving.
  ``synchronize()`` waits for everything.

**Agreement on the order of collectives.** Which chunk is ready first depends on each rank's
timing, and all-reduce needs every rank to issue the same collectives in the same order. As
in the original (ByteScheduler over Horovod), rank 0 decides and the others follow: rank 0's
dispatcher applies the priority + credit rule above to *its own* readiness and broadcasts each
cycle's decision (the list of chunk ids it starts) on a separate small Gloo group; every other
rank receives the decision and starts exactly those chunks, in that order, each as soon as it
is ready locally. The data all-reduces are therefore issued in rank 0's order everywhere, and
they are correct because a chunk is only handed to a collective once its gradient exists on
that rank. This keeps ByteScheduler's semantics - the schedule reacts to the actual readiness
(a front layer's chunk overtakes queued back-layer chunks) and the credit bounds what is in
flight - whereas a fixed, precomputed order would either be plain WFBP (backward order) or
wait for the first layer (BSP). Deadlock freedom: every chunk of an iteration becomes ready on
every rank by that rank's ``step()``, and nothing a rank waits for before its ``step()``
depends on another rank's communication of the same iteration.

Two background threads per rank: the dispatcher (decides or follows, and starts all-reduces
through ``Comm``) and the completer (waits for chunks in start order, returns credit, applies
per-tensor updates). The training thread only marks gradients ready (post-accumulate-grad hooks,
and ``step()`` for parameters that got no gradient: they count as zero, as in the other
methods) and waits in forward pre-hooks.

The per-tensor update uses one private optimizer per parameter, of the user's optimizer class
with that parameter's group settings, sharing the user's optimizer ``state`` dict: SGD momentum
buffers and Adam moments are exactly those one ``optimizer.step()`` over all parameters would
keep. Group settings are read again before every update, so an LR scheduler stepped after
``step()`` takes effect from the next iteration.

A parameter is waited for by the forward pre-hooks of the modules that own it; one whose owners
are never called (used functionally by an ancestor, like ``MultiheadAttention.out_proj``) is
waited for by its nearest ancestor that is called, learned in the first iteration. A gradient
that arrives while the same parameter's previous update is still pending is reported as an
error instead of racing.

**Compression.** With ``--compressor`` (fp16, bf16, topk, eftopk, signum, signavg, efsignum,
efsignum_scaled) every chunk is its own compressor bucket: the dispatcher encodes it and starts
its exchange, the completer waits and decodes, and the chunk then holds the average (no division
afterwards). TopK keeps the k largest of each chunk, efsignum_scaled one scale per chunk, and
residuals are kept per chunk.
PowerSGD is refused: it factorises whole matrices (a chunk is a slice of a flat gradient) and
issues its second all-reduce while waiting, which here would be the completer thread, racing
the dispatcher's collectives on the same group.
"""
from __future__ import annotations

import heapq
import threading
from collections import deque
from dataclasses import dataclass

from .. import timeline
from ..errors import PSError
from ..planning import BYTESCHEDULER_CREDIT as DEFAULT_CREDIT
from ..planning import BYTESCHEDULER_PARTITION as DEFAULT_PARTITION
from ..planning import chunk_table
from ..options import COUNT, Options, count_at_least, option
from . import rules, threads
from .base import BucketPlan, Method, Slice

MAX_DECISION = 128              # chunk ids per negotiation message
_POLL_S = 0.5                   # waits wake up this often to notice a failed thread
ELEMENTS = "must be a positive number of elements"
# Below this a partition only multiplies messages (a 100 MB gradient in 1,000-element chunks is
# 25,000 all-reduces per iteration); ByteScheduler's own tuning searched 1e5..1e7 elements.
MIN_PARTITION = 1000
PARTITION = count_at_least(MIN_PARTITION, "elements")


def credit_option():
    return option(DEFAULT_CREDIT, COUNT, "ByteScheduler credit window in elements",
                  env="BYTESCHEDULER_CREDIT", must=ELEMENTS)


@dataclass(frozen=True)
class ByteSchedulerOptions(Options):
    partition: int = option(DEFAULT_PARTITION, PARTITION,
                            "ByteScheduler partition size in elements",
                            env="BYTESCHEDULER_PARTITION")
    credit: int = credit_option()


class CreditWindow:
    """The dispatch rule, without threads or communication: tensors become ready, ``take()``
    returns the chunks to start now (highest priority first, while credit > 0, each subtracting
    its size), ``done()`` returns a chunk's size. One iteration at a time
    (``start_iteration()``); the credit carries over, since chunks of the previous iteration
    may still be in flight."""

    def __init__(self, table: list[tuple[int, int, int]], credit: int):
        self.table = table
        self.credit = credit
        ntensors = 1 + max((t for t, _, _ in table), default=-1)
        self.first = [0] * ntensors
        self.count = [0] * ntensors
        for c, (t, _, _) in enumerate(table):
            if self.count[t] == 0:
                self.first[t] = c
            self.count[t] += 1
        self.start_iteration()

    def size(self, chunk: int) -> int:
        _, start, end = self.table[chunk]
        return end - start

    def start_iteration(self) -> None:
        self._next = [0] * len(self.count)
        self._heap: list[int] = []

    def ready(self, tensor: int) -> None:
        heapq.heappush(self._heap, tensor)

    def take(self, limit: int | None = None) -> list[int]:
        out = []
        while self._heap and self.credit > 0 and (limit is None or len(out) < limit):
            t = self._heap[0]
            chunk = self.first[t] + self._next[t]
            self._next[t] += 1
            if self._next[t] == self.count[t]:
                heapq.heappop(self._heap)
            self.credit -= self.size(chunk)
            out.append(chunk)
        return out

    def done(self, chunk: int) -> None:
        self.credit += self.size(chunk)


class _Stop(Exception):
    pass


class ByteScheduler(Method):
    id = "bytescheduler"
    display = "ByteScheduler-A2A"
    summary = ("gradients cut into `--partition`-element chunks, sent front layers first "
               "under a `--credit` window; each layer updated as soon as its chunks are "
               "reduced, and the next forward overlaps the rest")
    Options = ByteSchedulerOptions
    launcher = "bytescheduler/horovod_mpi_cj.sh"
    rule = rules.Rule(scheduler=True, advise=rules.partition_credit_grid)
    hatch = "OO"
    # All-reduce needs every rank to issue the same collectives in the same order: rank 0
    # decides and broadcasts. A subclass whose transport matches by key needs no agreement.
    negotiated = True
    # Credit comes back when a chunk's collective completes (a subclass may return it sooner).
    credit_on_completion = True

    @classmethod
    def accepts(cls, compressor: str) -> str | None:
        """Every compressor that can take slices of a flat gradient (what it declares:
        ``Compressor.not_chunked``)."""
        import compression
        why = compression.lookup(compressor).not_chunked
        if why is not None:
            return (f"{why}, and bytescheduler sends slices of flat gradients and waits on "
                    f"another thread than it sends from")
        return None

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        import torch.distributed as dist
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        self.chunk_compressor = self.given_compressor()
        # Where the collective averages (ReduceOp.AVG: NCCL, Gloo from torch 2.8) a chunk
        # arrives averaged; else it is summed and its tensor divided once complete (not at one
        # worker: a pass over every gradient for nothing). A compressor averages itself.
        self._average_op = None if self.chunk_compressor is not None \
            else self._transport_average()
        self._divide = self.chunk_compressor is None and self._average_op is None and \
            comm.size > 1
        self.partition = self._partition()
        self.credit = int(self.options.credit)
        n = len(self.params)
        self.table = self._chunk_table()
        self.window = CreditWindow(self.table, self.credit)
        self.nchunks = list(self.window.count) + [0] * (n - len(self.window.count))
        self.leader = comm.rank == 0 or not self.negotiated
        self._decision_len = 1 + min(len(self.table), MAX_DECISION)
        self._opts = self._private_optimizers(optimizer)

        # Shared state, guarded by the condition's lock.
        self._cv = threading.Condition()
        self._iter = 0                    # training iteration (step() calls so far)
        self._ready_iter = [-1] * n       # iteration of the gradient last marked ready
        self._update_iter = [-1] * n      # iteration of the last applied update
        self._flat: list = [None] * n  # each tensor's flat gradient while in flight
        self._ready_us: list = [None] * n  # when it was marked ready (while the timeline records)
        self._events: deque[int] = deque()  # tensors marked ready, in order
        self._remaining = list(self.nchunks)
        self._error: BaseException | None = None
        self._stop = False
        self.negotiation_messages = 0
        self.negotiation_bytes = 0
        self.iterations_dispatched = 0

        self._nego = None
        if comm.size > 1 and self.negotiated:
            # Decisions travel on their own group, never queued behind the data all-reduces.
            self._nego = dist.new_group(backend="gloo")
        self._register_ready_hooks(self._on_ready)
        self._install_forward_waits()
        device = self.params[0].device if self.params else None
        self._dispatcher = threading.Thread(target=self._guard(self._dispatch_loop, device),
                                            name="bytescheduler-dispatch", daemon=True)
        self._completer = threads.QueueWorker("bytescheduler-complete", self._complete_one,
                                              on_error=self._failed, device=device)

    def start(self) -> None:
        self._dispatcher.start()
        self._completer.start()

    # -- set-up -----------------------------------------------------------------------------
    def _partition(self) -> int:
        return int(self.options.partition)

    def _transport_average(self):
        """The reduction that averages a chunk in its collective, None where none does."""
        return self.comm.average_op()

    def _chunk_table(self) -> list[tuple[int, int, int]]:
        return chunk_table([p.numel() for p in self.params], self.partition)

    def _start_chunk(self, chunk: int, data):
        """Start reducing one chunk (a slice of its tensor's flat gradient, averaged in place
        by the collective or the compressor, or summed); returns what the completer waits on."""
        tensor, begin, end = self.table[chunk]
        with self.comm.about(lambda: f"{self.param_names[tensor]}[{begin}:{end}]"):
            if self.chunk_compressor is not None:
                return self.chunk_compressor.reduce_async(("chunk",) + self.table[chunk], data,
                                                          self.comm, shapes=[data.shape])
            return self.comm.allreduce(data, async_op=True, op=self._average_op)

    def plan(self) -> BucketPlan:
        """The compressor's buckets: every chunk alone, a slice of its tensor's gradient."""
        return BucketPlan(tuple((Slice(*chunk),) for chunk in self.table), self.plan_known)

    def _private_optimizers(self, optimizer):
        group_of = {}
        for g in optimizer.param_groups:
            for p in g["params"]:
                group_of[id(p)] = g
        opts = []
        for p in self.params:
            g = group_of.get(id(p))
            if g is None:  # not optimised by the user's optimizer: reduced, never updated
                opts.append(None)
                continue
            group = {k: v for k, v in g.items() if k != "params"} | {"params": [p]}
            try:
                opt = type(optimizer)([group], **optimizer.defaults)
            except TypeError:
                opt = type(optimizer)([group])
            opt.state = optimizer.state  # one state, as if the user's optimizer had stepped
            opts.append((opt, g))
        return opts

    def _install_forward_waits(self) -> None:
        index = {id(p): i for i, p in enumerate(self.params)}
        self._modules = dict(self.model.named_modules())
        self._owners: dict[int, list[str]] = {}
        self._wait_for: dict[int, list[int]] = {}
        for name, m in self._modules.items():
            own = [index[id(p)] for p in m.parameters(recurse=False) if id(p) in index]
            if own:
                self._wait_for[id(m)] = own
                for i in own:
                    self._owners.setdefault(i, []).append(name)
        self._called: set[str] | None = set()  # modules run in the first forward
        for name, m in self._modules.items():
            self._handles.append(m.register_forward_pre_hook(self._forward_hook(name)))

    def _forward_hook(self, name):
        key = id(self._modules[name])

        def hook(_module, _args):
            if self._called is not None:
                self._called.add(name)
            wait = self._wait_for.get(key)
            if wait:
                with timeline.of(self.comm).span("pre-forward wait", "wait", module=name):
                    self._wait_updates(wait)
        return hook

    def _cover_uncalled_owners(self) -> None:
        """After the first iteration: parameters whose owning modules never ran are waited for
        by their nearest ancestor that did (or by the root)."""
        called, self._called = self._called, None
        for i in range(len(self.params)):
            owners = self._owners.get(i, [])
            if any(o in called for o in owners):
                continue
            target = ""
            for o in owners:
                parts = o.split(".")
                for k in range(len(parts) - 1, 0, -1):
                    if ".".join(parts[:k]) in called:
                        target = ".".join(parts[:k])
                        break
                if target:
                    break
            self._wait_for.setdefault(id(self._modules[target]), []).append(i)

    # -- the training thread --------------------------------------------------------------------
    def _on_ready(self, i: int) -> None:
        with self._cv:
            self._raise_if_failed()
            if self._ready_iter[i] == self._iter:
                raise RuntimeError(f"bytescheduler: parameter {i} got a second gradient before "
                                   f"step(); accumulating over several backward passes is "
                                   f"not supported")
            if self._update_iter[i] < self._ready_iter[i]:
                raise RuntimeError(f"bytescheduler: parameter {i} got its next gradient before "
                                   f"its previous update was applied; it is used outside the "
                                   f"forward of the modules that wait for it")
            self._mark_ready(i)

    def _mark_ready(self, i: int) -> None:
        g = self.params[i].grad
        self._flat[i] = g.view(-1) if g.is_contiguous() else g.contiguous().view(-1)
        self._ready_iter[i] = self._iter
        self._ready_us[i] = timeline.now_us() if timeline.of(self.comm).enabled else None
        self._events.append(i)
        self._cv.notify_all()

    def step(self) -> None:
        """Mark every parameter without a gradient this iteration ready (as zeros) and return;
        the updates happen as the chunks complete."""
        import torch
        with self._cv:
            self._raise_if_failed()
            for i, p in enumerate(self.params):
                if self._ready_iter[i] == self._iter:
                    continue
                self._wait(lambda i=i: self._update_iter[i] >= self._ready_iter[i])
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self._mark_ready(i)
            self._iter += 1
        if self._called is not None:
            self._cover_uncalled_owners()

    def synchronize(self) -> None:
        with self._cv:
            self._wait(lambda: all(u >= r for u, r in zip(self._update_iter, self._ready_iter)))

    def zero_grad(self) -> None:
        # Updates clear their gradient themselves; a pending one must not lose it.
        with self._cv:
            for i, p in enumerate(self.params):
                if self._update_iter[i] >= self._ready_iter[i]:
                    p.grad = None

    def _wait_updates(self, indices: list[int]) -> None:
        with self._cv:
            self._wait(lambda: all(self._update_iter[i] >= self._ready_iter[i]
                                   for i in indices))

    def _wait(self, predicate) -> None:
        """Wait on the condition (lock held) until ``predicate()``, failing if a thread did."""
        while not predicate():
            self._raise_if_failed()
            self._cv.wait(_POLL_S)

    def _raise_if_failed(self) -> None:
        if isinstance(self._error, PSError):  # a dead server: the job entry reports it
            raise PSError(str(self._error)) from self._error
        if self._error is not None:
            raise RuntimeError(f"bytescheduler: communication thread failed: "
                               f"{type(self._error).__name__}: {self._error}") from self._error

    # -- background threads -------------------------------------------------------------------
    def _guard(self, loop, device):
        def run():
            try:
                threads.on_device(device)
                loop()
            except _Stop:
                pass
            except BaseException as e:  # reported to the training thread
                self._failed(e)
        return run

    def _failed(self, error: BaseException) -> None:
        with self._cv:
            self._error = error
            self._cv.notify_all()

    def _wait_bg(self, predicate) -> None:
        while not predicate():
            if self._stop or self._error is not None:
                raise _Stop
            self._cv.wait(_POLL_S)

    def _dispatch_loop(self) -> None:
        window = self.window
        seen = [False] * len(self.params)
        future: list[int] = []
        sent = []  # rank 0's decision broadcasts of this iteration (handle, tensor)
        iteration = 0

        def drain():
            while self._events:
                i = self._events.popleft()
                if seen[i]:       # its gradient of the next iteration
                    future.append(i)
                    continue
                seen[i] = True
                if self.leader:
                    window.ready(i)

        while True:
            left = len(self.table)
            with self._cv:
                window.start_iteration()
                carried, future[:] = list(future), []
                seen[:] = [False] * len(seen)
                for i in carried:
                    seen[i] = True
                    if self.leader:
                        window.ready(i)
            while left > 0:
                with self._cv:
                    picks: list[int] = []

                    def can_go():
                        drain()
                        if self.leader:
                            picks.extend(window.take(MAX_DECISION))
                            return bool(picks)
                        # Follow only once this rank has started the iteration itself, so an
                        # idle rank never sits in a receive between iterations.
                        return any(seen)
                    self._wait_bg(can_go)
                picks = self._negotiate(picks, sent)
                for c in picks:
                    i, start, end = self.table[c]
                    with self._cv:
                        self._wait_bg(lambda i=i: (drain(), seen[i])[1])
                        flat, ready_us = self._flat[i], self._ready_us[i]
                    if ready_us is not None:
                        self._queued(c, i, ready_us)
                    work = self._start_chunk(c, flat[start:end])
                    self._completer.put((c, work, iteration))
                left -= len(picks)
            for work, _ in sent:
                work.wait()
            sent.clear()
            iteration += 1
            self.iterations_dispatched = iteration

    def _queued(self, chunk: int, tensor: int, ready_us: float) -> None:
        """The chunk's time in this scheduler: from its tensor's readiness until now, when it
        is handed to the transport (priority, credit and the leader's decision held it)."""
        tl = timeline.of(self.comm)
        if tl.enabled:
            start, end = self.table[chunk][1:]
            tl.events.append(("queued", timeline.QUEUE, "scheduler queue", ready_us,
                              timeline.now_us(), {"chunk": chunk, "tensor": tensor,
                                                  "elements": end - start}))

    def _negotiate(self, picks: list[int], sent: list) -> list[int]:
        import torch
        import torch.distributed as dist
        if self._nego is None:
            return picks
        msg = torch.full((self._decision_len,), -1, dtype=torch.int32)
        if self.leader:
            msg[0] = len(picks)
            msg[1:1 + len(picks)] = torch.tensor(picks, dtype=torch.int32)
            sent.append((dist.broadcast(msg, 0, group=self._nego, async_op=True), msg))
        else:
            dist.broadcast(msg, 0, group=self._nego)
            picks = msg[1:1 + int(msg[0])].tolist()
        self.negotiation_messages += 1
        self.negotiation_bytes += msg.numel() * msg.element_size()
        return picks

    def _complete_one(self, item) -> None:
        """The completer: wait for one chunk (in start order), return its credit, and when it
        was its tensor's last, average the tensor and apply its update."""
        c, work, iteration = item
        work.wait()
        i = self.table[c][0]
        with self._cv:
            if self.leader and self.credit_on_completion:
                self.window.done(c)
            self._remaining[i] -= 1
            last = self._remaining[i] == 0
            if last:
                self._remaining[i] = self.nchunks[i]
            self._cv.notify_all()
        if not last:
            return
        p, flat = self.params[i], self._flat[i]
        if self._divide:  # summed: average it
            flat.div_(self.comm.size)
        if self._opts[i] is not None:
            opt, user_group = self._opts[i]
            group = opt.param_groups[0]
            for k, v in user_group.items():
                if k != "params":
                    group[k] = v
            p.grad = flat.view(p.shape)
            opt.step()
        p.grad = None
        with self._cv:
            self._flat[i] = None
            self._update_iter[i] = iteration
            self._cv.notify_all()

    # -- the rest of the interface ----------------------------------------------------------------
    def describe(self) -> dict:
        d = super().describe()
        sizes = [end - start for _, start, end in self.table]
        its = max(1, self.iterations_dispatched)
        d.update({
            "partition_elements": self.partition,
            "credit_elements": self.credit,
            "tensors": len(self.params),
            "chunks": len(self.table),
            "partitioned_tensors": sum(1 for k in self.nchunks if k > 1),
            "max_chunk_elements": max(sizes, default=0),
            "priority": "model.parameters() order, front layers first; then chunk index",
            "order_agreement": "rank 0 decides each dispatch cycle and broadcasts it",
            # Rank 0's decisions (a broadcast of up to MAX_DECISION chunk ids each), averaged
            # over the iterations run so far (warm-up included).
            "negotiation_messages_per_iteration": self.negotiation_messages / its,
            "negotiation_bytes_per_iteration": self.negotiation_bytes / its,
        })
        d.update(self.compressor.describe())
        return d

    def close(self) -> None:
        """Finish what is in flight (unless the run or a thread failed), stop both threads (an
        error if one does not stop), remove the hooks and the negotiation group."""
        try:
            if self._error is None and not self.failed and self._dispatcher.is_alive():
                self.synchronize()
        finally:
            with self._cv:
                self._stop = True
                self._cv.notify_all()
            try:
                self._completer.stop()
                threads.join(self._dispatcher)
            finally:
                super().close()
                if self._nego is not None:
                    import torch.distributed as dist
                    dist.destroy_process_group(self._nego)
                    self._nego = None
