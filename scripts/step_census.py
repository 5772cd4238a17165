"""What one training step runs, counted, for a method at one worker against the bare loop of
``python -m ddlbench.overhead`` (the same loops: ``overhead._loops``): deterministic figures
where wall-clock ratios drown in a shared machine's noise.

    python scripts/step_census.py [OVERHEAD FLAGS] [--steps N] [--detail]

e.g. ``python scripts/step_census.py --model bert_tiny --batch-size 8 --methods zero,hsdp``.
One process, a one-rank Gloo group on a HashStore. Per loop (``bare``, each method, and the
DDP reference sending the method's messages), averaged over N steps after the warm-up:

- ``py calls``: Python function calls per step on every thread (``sys.setprofile`` and
  ``threading.setprofile``: the training thread and the method's communication thread), and
  ``py extra``: those beyond the bare loop's;
- ``aten ops``: the ATen operators torch's profiler records per step (every thread); among
  them the copies (``copy_``, and the millions of elements they write, ``Melem``), the fills
  (``fill_``: every zeroing, and its elements), the in-place additions (``add_``: the
  optimizer's, and autograd's accumulation into a gradient that exists) and the allocations
  (``aten::empty*``);
  ``collectives``: the process-group calls (``gloo:*`` / ``c10d::*`` records).

``--detail`` also prints, per method, the Python functions and ATen ops whose per-step counts
differ from the bare loop's."""
from __future__ import annotations

import collections
import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

ALLOCS = ("aten::empty", "aten::empty_strided")   # (zeros, clone, ... allocate through them)
WRITES = ("aten::copy_", "aten::fill_", "aten::add_")   # their elements are counted too


def _python_calls(step, n):
    """Python calls per step by ``file:function``, on every thread that runs a Python
    function meanwhile (threads already running: through ``threading.setprofile`` set before
    they started, see ``main``)."""
    counts = collections.Counter()
    lock = threading.Lock()

    def prof(frame, event, _arg):
        if event == "call":
            code = frame.f_code
            key = f"{os.path.basename(code.co_filename)}:{code.co_name}"
            with lock:
                counts[key] += 1
    _PROFILE[0] = prof
    sys.setprofile(_dispatch)
    try:
        for _ in range(n):
            step()
    finally:
        sys.setprofile(None)
        _PROFILE[0] = None
    return {k: v / n for k, v in counts.items()}


_PROFILE = [None]


def _dispatch(frame, event, arg):
    """The profile function every thread carries: counts only while a census runs."""
    p = _PROFILE[0]
    if p is not None:
        p(frame, event, arg)


def _aten_ops(step, n, sync):
    """Profiler records per step by name (every thread), and the elements written per step by
    ``aten::copy_``, ``aten::fill_`` (every copy and zeroing ends in one of them) and
    ``aten::add_`` (the optimizer's, and autograd's accumulation into an existing gradient)."""
    import math

    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 experimental_config=_ExperimentalConfig(profile_all_threads=True)) as prof:
        for _ in range(n):
            step()
        sync()
    counts = collections.Counter()
    for e in prof.events():
        counts[e.name] += 1
        if e.name in WRITES and e.input_shapes and e.input_shapes[0]:
            counts[e.name + " elements"] += math.prod(e.input_shapes[0])
    return {k: v / n for k, v in counts.items()}


def _summary(ops: dict) -> dict:
    aten = {k: v for k, v in ops.items() if k.startswith("aten::") and " " not in k}
    return {"aten": sum(aten.values()),
            "copies": ops.get("aten::copy_", 0.0),
            "copied": ops.get("aten::copy_ elements", 0.0) / 1e6,
            "fills": ops.get("aten::fill_", 0.0),
            "adds": ops.get("aten::add_", 0.0),
            "filled": ops.get("aten::fill_ elements", 0.0) / 1e6,
            "added": ops.get("aten::add_ elements", 0.0) / 1e6,
            "allocs": sum(v for k, v in aten.items() if k in ALLOCS),
            "collectives": sum(v for k, v in ops.items()
                               if k.startswith(("gloo:", "c10d::", "nccl:")))}


def _diff(a: dict, b: dict, top: int = 40) -> list:
    keys = set(a) | set(b)
    rows = [(k, a.get(k, 0.0), b.get(k, 0.0)) for k in keys if a.get(k, 0.0) != b.get(k, 0.0)]
    rows.sort(key=lambda r: -abs(r[2] - r[1]))
    return rows[:top]


def main(argv=None) -> int:
    import contextlib

    import torch
    import torch.distributed as dist

    from ddlbench import methods, overhead
    from ddlbench.runtime.comm import Comm

    argv = list(sys.argv[1:] if argv is None else argv)
    steps, detail = 5, "--detail" in argv
    argv = [a for a in argv if a != "--detail"]
    if "--steps" in argv:
        k = argv.index("--steps")
        steps = int(argv[k + 1])
        del argv[k:k + 2]
    args = overhead.parse_args(argv)
    overhead.check(args)
    args.device = torch.device("cpu")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    threading.setprofile(_dispatch)   # threads started from here on count too
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    print(f"{args.model} bs {args.batch_size}, 1 worker, torch threads "
          f"{torch.get_num_threads()}, per step (mean of {steps} after {max(args.warmup, 2)} "
          f"warm-up)")
    print(f"{'loop':>12} {'py calls':>9} {'py extra':>9} {'aten ops':>9} {'copy_':>6} "
          f"{'Melem':>6} {'fill_':>6} {'Melem':>6} {'add_':>6} {'Melem':>6} {'allocs':>7} "
          f"{'collectives':>11}")
    bare_py = bare_ops = None
    for name in names:
        with contextlib.ExitStack() as stack:
            loops, syncs, _ref, tensors = overhead._loops(args, methods.lookup(name),
                                                          Comm(0, 1), stack)
            for loop, step in loops.items():
                if loop == "raw_hook" or (loop == "bare" and bare_py is not None):
                    continue
                sync = syncs.get(loop, lambda: None)
                for _ in range(max(args.warmup, 2)):
                    step()
                sync()
                py = _python_calls(step, steps)
                sync()
                ops = _aten_ops(step, steps, sync)
                if loop == "bare":
                    bare_py, bare_ops = py, ops
                label = name if loop == "method" else \
                    f"{name}:ddp" if loop == "ddp_match" else loop
                s = _summary(ops)
                total = sum(py.values())
                print(f"{label:>12} {total:9.1f} {total - sum(bare_py.values()):9.1f} "
                      f"{s['aten']:9.1f} {s['copies']:6.1f} {s['copied']:6.2f} "
                      f"{s['fills']:6.1f} {s['filled']:6.2f} {s['adds']:6.1f} "
                      f"{s['added']:6.2f} {s['allocs']:7.1f} "
                      f"{s['collectives']:11.1f}", flush=True)
                if detail and loop == "method":
                    print(f"    {tensors} gradient tensors; Python calls per step, "
                          f"bare -> {name}:")
                    for k, a, b in _diff(bare_py, py):
                        print(f"      {k:<60} {a:7.1f} {b:7.1f}")
                    print(f"    ATen/process-group records per step, bare -> {name}:")
                    for k, a, b in _diff(bare_ops, ops):
                        print(f"      {k:<60} {a:7.1f} {b:7.1f}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
