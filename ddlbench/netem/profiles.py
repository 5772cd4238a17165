"""Network profiles: ``configs/networks.yaml`` and ``DDLBENCH_NETWORKS`` files, ``--net`` specs.

``--net PROFILE`` (``configs/networks.yaml``, docs/DESIGN.md section 9) names a profile of one
of those files, or gives the link free form: ``rate=R[,burst=B]``, ``R``, or
``target=R,speedup=S[,burst=B]`` (a target cluster's rate scaled down to this machine's speed).
``check`` is an entry point's test of ``--net`` before it starts anything.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import UsageError
from .links import require
from .units import format_rate, looks_like_rate, parse_rate, parse_size

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROFILES_FILE = os.path.join(REPO, "configs", "networks.yaml")
LOOPBACK = "loopback"
MIN_BURST = 128 * 1024      # bytes
SCALING_FORMULA = ("rate = target_rate / speedup: a target whose devices compute `speedup` times "
                   "faster spends 1/speedup of the time computing, so its link must be "
                   "`speedup` times faster than the emulated one for the same "
                   "communication-to-computation ratio (bandwidth term only; latency is not "
                   "scaled)")


@dataclass(frozen=True)
class Profile:
    name: str
    rate_bps: float | None = None           # None: loopback, no emulation
    burst_bytes: int | None = None
    target_rate_bps: float | None = None    # scaling: rate = target_rate / speedup
    speedup: float | None = None
    description: str = ""
    source: str = ""                        # the file, or "command line"

    @property
    def loopback(self) -> bool:
        return self.rate_bps is None

    @property
    def burst(self) -> int:
        """tbf's bucket: what the given burst says, else 1 ms at the rate, at least 128 KiB
        (a veth hands tbf GSO packets of up to 64 KiB)."""
        if self.burst_bytes is not None:
            return self.burst_bytes
        return max(MIN_BURST, int(self.rate_bps / 8 * 1e-3))

    def describe(self) -> dict:
        d = {"profile": self.name, "emulated": not self.loopback, "rate_bps": self.rate_bps,
             "rate": format_rate(self.rate_bps) if self.rate_bps else None,
             "burst_bytes": None if self.loopback else self.burst, "source": self.source}
        if self.speedup is not None:
            d.update(target_rate_bps=self.target_rate_bps, speedup=self.speedup,
                     scaling=SCALING_FORMULA)
        return d


_PROFILE_KEYS = {"rate", "burst", "target_rate", "speedup", "description"}


def _profile_from(name: str, spec: dict, source: str) -> Profile:
    where = f"network profile {name!r} ({source})"

    def what(key):  # on the command line the spec itself is the context
        return key if source == "command line" else f"{key} of {where}"
    if not isinstance(spec, dict):
        raise UsageError(f"{where}: expected a mapping of {', '.join(sorted(_PROFILE_KEYS))}")
    unknown = sorted(set(spec) - _PROFILE_KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(_PROFILE_KEYS))}")
    description = str(spec.get("description") or "")
    rate, target, speedup = spec.get("rate"), spec.get("target_rate"), spec.get("speedup")
    burst = spec.get("burst")
    if rate is None and target is None and speedup is None:
        if burst is not None:
            raise UsageError(f"{where}: burst without a rate")
        return Profile(name, description=description, source=source)
    if rate is not None and (target is not None or speedup is not None):
        raise UsageError(f"{where}: give either rate, or target_rate with speedup, not both")
    target_bps = None
    speedup_f = None
    if rate is not None:
        rate_bps = parse_rate(rate, what("rate"))
    else:
        if target is None or speedup is None:
            raise UsageError(f"{where}: scaling needs both target_rate and speedup")
        target_bps = parse_rate(target, what("target_rate"))
        try:
            speedup_f = float(speedup)
        except (TypeError, ValueError):
            raise UsageError(f"{what('speedup')} must be a number, got {speedup!r}") from None
        if not speedup_f > 0 or speedup_f == float("inf"):
            raise UsageError(f"{what('speedup')} must be positive, got {speedup!r}")
        rate_bps = scaled_rate(target_bps, speedup_f)
    burst_b = parse_size(burst, what("burst")) if burst is not None else None
    return Profile(name, rate_bps, burst_b, target_bps, speedup_f, description, source)


def scaled_rate(target_rate_bps: float, speedup: float) -> float:
    """The emulated link rate that keeps a target cluster's communication-to-computation ratio.

    On the target an iteration computes for t_c / speedup (t_c: compute time here) and moves
    M bytes at target_rate; here it computes for t_c and moves M bytes at the emulated rate.
    Equal ratios, (M / rate) / t_c = (M / target_rate) / (t_c / speedup), give
    rate = target_rate / speedup.
    """
    return target_rate_bps / speedup


def profile_files() -> list[str]:
    files = [PROFILES_FILE]
    extra = os.environ.get("DDLBENCH_NETWORKS")
    if extra:
        files.append(extra)
    return files


def load_profiles(files: list[str] | None = None) -> dict[str, Profile]:
    from ..yamlfile import load as load_yaml
    profiles: dict[str, Profile] = {}
    for path in files or profile_files():
        raw = load_yaml(path, "network profiles file")
        entries = (raw or {}).get("profiles") if isinstance(raw, dict) else None
        if not isinstance(entries, dict):
            raise UsageError(f"network profiles file {path}: expected a mapping 'profiles:' "
                             "of name: {rate: ..., ...}")
        for name, spec in entries.items():
            profiles[str(name)] = _profile_from(str(name), spec or {}, path)
    profiles.setdefault(LOOPBACK, Profile(LOOPBACK, description="no emulation", source="built in"))
    return profiles


def resolve(spec: str | None) -> Profile:
    """A profile by name, or free form ``rate=R[,burst=B]``, ``R`` or
    ``target=R,speedup=S[,burst=B]``. Bad input raises UsageError (one line)."""
    text = (spec if spec is not None else LOOPBACK).strip()
    if not text:
        raise UsageError("--net needs a profile name or rate=R")
    if text in (LOOPBACK, "local", "none"):
        return Profile(LOOPBACK, description="no emulation", source="built in")
    if "=" in text:
        fields = {}
        for part in text.split(","):
            key, eq, value = part.partition("=")
            key = key.strip().lower()
            key = {"target": "target_rate"}.get(key, key)
            if not eq or not value.strip() or key not in _PROFILE_KEYS - {"description"}:
                raise UsageError(f"malformed network spec {text!r}: expected rate=R[,burst=B] "
                                 "or target=R,speedup=S[,burst=B] (e.g. rate=2.5gbit)")
            if key in fields:
                raise UsageError(f"malformed network spec {text!r}: {key} given twice")
            fields[key] = value.strip()
        return _profile_from(text, fields, "command line")
    profiles = load_profiles()
    if text in profiles:
        return profiles[text]
    if looks_like_rate(text):
        return _profile_from(text, {"rate": text}, "command line")
    raise UsageError(f"unknown network profile {text!r}; known: {', '.join(profiles)} "
                     f"(configs/networks.yaml), or rate=R[,burst=B], or target=R,speedup=S")


def check(spec: str | None) -> Profile:
    """An entry point's check of ``--net``: a known profile or a well-formed rate, the local
    spawner (not mpirun/torchrun/srun, which use the real network), root and iproute2. Bad
    input raises UsageError (one line)."""
    profile = resolve(spec)
    if profile.loopback:
        return profile
    from ..hosts.placement import detect
    placement = detect()
    if placement is not None and placement.launcher != "local":
        raise UsageError(f"--net {spec} emulates a cluster on this machine with the suite's "
                         f"local spawner (--nworkers N, no launcher); under "
                         f"{placement.launcher} the real network is used: drop --net "
                         f"(and DDLBENCH_NET)")
    require()
    return profile
