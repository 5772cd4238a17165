"""hier as committed before e4941b5: a bucket's three collectives blocking, one after another,
on the communication thread: the serial hier that docs/RESULTS.md's entry "hier as a pipeline"
times beside the pipelined one (``--methods tests.hier_serial:HierSerial``); it verifies as hier
does."""
from ddlbench.methods.hier import Hier


class HierSerial(Hier):
    id = "hier-serial"

    def _launch(self, b) -> None:
        import torch
        from compression import Pending
        b.flat = b.pack()
        b.pending = Pending(None, None)
        comm, local, flat = self.comm, self.machine.size, b.flat
        if comm.size == 1:
            return
        with comm.about(b.label or self._label(b)):
            if local == 1:
                comm.allreduce(flat, async_op=False, group=self.across)
                flat.div_(comm.size)
                return
            n = flat.numel()
            whole = -(-n // local) * local
            if getattr(b, "shard", None) is None or b.shard.numel() != whole // local:
                b.padded = (torch.zeros(whole, dtype=flat.dtype) if whole != n else None)
                b.shard = torch.empty(whole // local, dtype=flat.dtype)
            work = flat
            if b.padded is not None:
                b.padded[:n].copy_(flat)
                work = b.padded
            comm.reduce_scatter(b.shard, work, async_op=False, group=self.machine)
            comm.allreduce(b.shard, async_op=False, group=self.across)
            b.shard.div_(comm.size)
            comm.allgather(work, b.shard, async_op=False, group=self.machine)
            if b.padded is not None:
                flat.copy_(b.padded[:n])
