"""zero with an option fixed whatever the flags say, so that test_zero verifies it beside zero
in one job (a job's start costs more than its steps): ``ZeroInLevels`` has the options of
``--rs-carrier two-level --ag-carrier two-level`` (the flags' path to them is the record's,
checked by the same test's timed run), ``ZeroGatherWaited`` those of ``--gather-prefetch 0``
(the flag's path: test_zero_verifies at 4 workers)."""
import dataclasses

from ddlbench.collectives import TWO_LEVEL
from ddlbench.methods.zero import Zero


class _Fixed(Zero):
    fixed: dict = {}

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        options = dataclasses.replace(options if options is not None else self.Options(),
                                      **self.fixed)
        super().__init__(model, optimizer, comm, options, compressor, model_name)


class ZeroInLevels(_Fixed):
    id = "zero-in-levels"
    fixed = {"rs_carrier": TWO_LEVEL, "ag_carrier": TWO_LEVEL}


class ZeroGatherWaited(_Fixed):
    id = "zero-gather-waited"
    fixed = {"gather_prefetch": "0"}
