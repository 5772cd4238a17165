"""The performance model: what an iteration of each method costs on a cluster you may not have.

- ``simulate``: events and resources; one iteration of a method replayed from a compute profile
  and a per-message network model (its events are the timeline's);
- ``topology``: collectives and topologies: a cluster file (or comm_bench measurements) as the
  cost of each message at each worker count;
- ``survey``: the survey's published throughputs, as data;
- ``cell``: one cell's prediction, the one path the CLI, the sweep and the validation take (the
  one-machine rule for the PS methods, their clients, MG-WFBP's plan, the 1-worker cells);
- ``predict``: ``python -m ddlbench.model.predict``, every method from a profile, and ``--advise``;
- ``validation``: ``python -m ddlbench.model.validation survey``, the model against the
  published table.

Measuring what the model reads (the profiler, comm_bench) is ``ddlbench.measure``'s; the sweep's
calibration and predicted cells are ``ddlbench.sweep``'s (docs/DESIGN.md section 3).
"""
