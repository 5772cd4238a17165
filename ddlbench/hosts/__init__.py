"""Hosts and processes: where a process sits in its job, host files, and process supervision."""
