"""Launching jobs: the entry every job-level command shares, the local spawner, the PS launcher."""
