"""MG-WFBP profile files: the format the profiler (``python -m ddlbench.measure.profiler``)
writes and MG-WFBP reads.

A profile (JSON, ``"format": "ddlbench-mgwfbp-profile"``) holds the model name and workload,
the tensors in backward order (name, shape, bytes), ``backward_s`` (per tensor, same order),
``forward_s``, ``alpha_s``, ``beta_s_per_byte``, and where they were measured (``nworkers``,
``backend``, ``device``, ``network``); optionally ``forward_tensor_s``, each tensor's share of
the forward (same order, summing to at most ``forward_s``), ``rank_compute_s``, every
rank's forward and backward seconds (rank order; the others are rank 0's), and
``rank_passes_s``, every rank's measured passes, each its forward and backward (rank order,
as many per rank; the ranks met before each), and ``launch``, the host's side of a step on an
accelerator (``forward_s``, ``backward_s`` per tensor in the same order, ``optimizer_s``,
``hook_s``; null or absent on a CPU).
"""
from __future__ import annotations

import math

from ..errors import UsageError, read_json

PROFILE_FORMAT = "ddlbench-mgwfbp-profile"
PROFILE_VERSION = 1


def trainable(model) -> list[tuple[str, object]]:
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


def read_profile(path: str) -> dict:
    """Load a profile file and check its form (not yet that it fits a model)."""
    where = f"MG-WFBP profile {path}"
    prof = read_json(path, where)
    if not isinstance(prof, dict) or prof.get("format") != PROFILE_FORMAT:
        raise UsageError(f"{where} is not an MG-WFBP profile (no \"format\": "
                         f"\"{PROFILE_FORMAT}\"); write one with python -m "
                         f"ddlbench.measure.profiler")
    for key, kind in (("model", str), ("tensors", list), ("backward_s", list),
                      ("forward_s", (int, float)), ("alpha_s", (int, float)),
                      ("beta_s_per_byte", (int, float))):
        if not isinstance(prof.get(key), kind) or isinstance(prof.get(key), bool):
            raise UsageError(f"{where}: missing or malformed {key!r}")
    tensors, times = prof["tensors"], prof["backward_s"]
    if len(tensors) != len(times):
        raise UsageError(f"{where}: {len(tensors)} tensors but {len(times)} backward times")
    for t in tensors:
        if not (isinstance(t, dict) and isinstance(t.get("name"), str)
                and isinstance(t.get("shape"), list) and isinstance(t.get("bytes"), int)):
            raise UsageError(f"{where}: every tensor needs a name, a shape and bytes")
    if not (_times(times, zero=True) and _times([prof["forward_s"], prof["alpha_s"]], zero=True)
            and _finite(prof["beta_s_per_byte"]) and 0 <= prof["beta_s_per_byte"] <= MAX_BETA):
        raise UsageError(f"{where}: times, alpha and beta must be finite numbers >= 0 (a time "
                         f"at most {MAX_TIME_S:g} s, beta at most {MAX_BETA:g} s/B)")
    _check_job(prof, where)
    shares = prof.get("forward_tensor_s")
    if shares is not None and not (
            _times(shares, zero=True) and len(shares) == len(tensors)
            and sum(shares) <= prof["forward_s"] + 1e-9):
        raise UsageError(f"{where}: malformed 'forward_tensor_s' (one time >= 0 per tensor, "
                         f"summing to at most forward_s)")
    ranks = prof.get("rank_compute_s")
    if ranks is not None and not (_times(ranks) and ranks):
        raise UsageError(f"{where}: malformed 'rank_compute_s' (one time > 0 per rank)")
    passes = prof.get("rank_passes_s")
    if passes is not None and not (
            isinstance(passes, list) and passes
            and all(_times(p) and p and len(p) == len(passes[0]) for p in passes)):
        raise UsageError(f"{where}: malformed 'rank_passes_s' (per rank, its passes' times > 0, "
                         f"as many for every rank)")
    launch = prof.get("launch")
    if launch is not None and not (
            isinstance(launch, dict) and _times(launch.get("backward_s"), zero=True)
            and len(launch["backward_s"]) == len(tensors)
            and _times([launch.get(k, 0.0) for k in ("forward_s", "optimizer_s", "hook_s")],
                       zero=True)):
        raise UsageError(f"{where}: malformed 'launch' (the host's forward_s, one backward_s per "
                         f"tensor, optimizer_s and hook_s, each a time >= 0)")
    return prof


# The largest time (seconds) and per-byte time a profile may hold: a day of compute for one
# tensor or message, a byte per second; beyond them a figure is a broken file, and the plans and
# predictions made of it would be inf or nan.
MAX_TIME_S = 86400.0
MAX_BETA = 1.0


def _check_job(prof: dict, where: str) -> None:
    """The job the profile was taken of, where given: its workers and per-worker batch
    (integers within the training script's bounds) and its optimizer step (a time)."""
    from ..options import LIMITS
    nworkers, job = prof.get("nworkers"), prof.get("workload")
    batch = job.get("batch_size") if isinstance(job, dict) else None
    for key, value, most in (("nworkers", nworkers, LIMITS["--nworkers"]),
                             ("workload.batch_size", batch, LIMITS["--batch-size"])):
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool)
                                      and 1 <= value <= most):
            raise UsageError(f"{where}: {key} must be an integer from 1 to {most}, got "
                             f"{value!r}")
    if job is not None and not isinstance(job, dict):
        raise UsageError(f"{where}: workload must be an object, got {job!r}")
    if prof.get("optimizer_s") is not None and not _times([prof["optimizer_s"]], zero=True):
        raise UsageError(f"{where}: optimizer_s must be a time >= 0 (at most {MAX_TIME_S:g} "
                         f"s), got {prof['optimizer_s']!r}")


def _finite(x) -> bool:
    """A number (not a boolean) a float holds, finite (JSON's 1e400 integer is none)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def _times(xs, zero: bool = False) -> bool:
    """Whether ``xs`` is a list of finite numbers (not booleans), each > 0 (>= 0 with
    ``zero``) and at most ``MAX_TIME_S``."""
    return isinstance(xs, list) and all(
        _finite(x) and (x > 0 or (zero and x == 0)) and x <= MAX_TIME_S for x in xs)


def check_profile(path: str, model_name: str) -> dict:
    """The profile in file ``path`` (``read_profile``'s checks: a missing file, bad JSON, NaN,
    inf or absurd figures are one line) made for model ``model_name``: what the training script
    checks of ``--mgwfbp-profile`` before any worker starts (whether its tensors are the
    model's, ``match_profile``, needs the model built)."""
    prof = read_profile(path)
    _same_model(prof, model_name, f"MG-WFBP profile {path}")
    return prof


def _same_model(prof: dict, model_name: str, where: str) -> None:
    if prof["model"] != model_name:
        raise UsageError(f"{where} is for model {prof['model']}, but this run trains "
                         f"{model_name}; write one for it with python -m ddlbench.measure.profiler "
                         f"--model {model_name} --output FILE")


def match_profile(prof: dict, model, model_name: str | None, path: str) -> list[int]:
    """The profile's tensor order as indices of ``model``'s trainable parameters; a profile
    made for another model is refused with one line."""
    where = f"MG-WFBP profile {path}"
    if model_name is not None:
        _same_model(prof, model_name, where)
    named = trainable(model)
    index = {name: i for i, (name, _) in enumerate(named)}
    seen = [t["name"] for t in prof["tensors"]]
    missing = [name for name, _ in named if name not in set(seen)]
    extra = [name for name in seen if name not in index]
    if missing or extra or len(seen) != len(set(seen)):
        what = (f"has no tensor {missing[0]!r} of this model" if missing else
                f"has tensor {extra[0]!r}, which this model lacks" if extra else
                "lists a tensor twice")
        raise UsageError(f"{where} does not match this {model_name or 'model'} "
                         f"({len(seen)} tensors there, {len(named)} here): it {what}")
    for t in prof["tensors"]:
        p = named[index[t["name"]]][1]
        if list(p.shape) != t["shape"] or p.numel() * p.element_size() != t["bytes"]:
            raise UsageError(f"{where} does not match this {model_name or 'model'}: tensor "
                             f"{t['name']!r} is {t['shape']} ({t['bytes']} B) there, "
                             f"{list(p.shape)} ({p.numel() * p.element_size()} B) here")
    return [index[name] for name in seen]


def write_profile(path: str, prof: dict) -> None:
    from .record import write_atomic
    write_atomic(path, prof)
