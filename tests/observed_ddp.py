"""DDP as it runs when a trace file is written (--timeline PATH): its buckets all-reduced by the
suite's comm hook, which the timeline sees. --verify takes no trace file, so this plugin turns
the hook on to prove that path equal to the reference too."""
from ddlbench.methods.ddp import DDP


class ObservedDDP(DDP):
    id = "test-observed-ddp"

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        comm.timeline.trace_file = True
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        assert self._observed
