"""Measuring a run: the workload replica, the timing protocol, and the run record."""
