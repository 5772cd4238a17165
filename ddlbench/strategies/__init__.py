"""Synchronisation methods, by the ids of DESIGN.md section 2.

``create(name, ...)`` builds one. ``name`` is a registered id or, for a method under
development, ``package.module:ClassName`` naming a ``Strategy`` subclass; ``--verify`` then
proves it right without touching this registry.
"""
from __future__ import annotations

import importlib

from ..errors import UsageError
from .base import Strategy

_REGISTRY: dict[str, type[Strategy]] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    _REGISTRY[cls.name] = cls
    return cls


def names() -> list[str]:
    return list(_REGISTRY)


def lookup(name: str) -> type[Strategy]:
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise UsageError(f"cannot load method {name!r}: {e}") from None
        if not (isinstance(cls, type) and issubclass(cls, Strategy)):
            raise UsageError(f"method {name!r} is not a Strategy subclass")
        return cls
    raise UsageError(f"unknown method {name!r}; known: {', '.join(_REGISTRY)}")


def create(name, model, optimizer, comm, settings, engine: str = "torch") -> Strategy:
    if engine == "horovod":  # Horovod's own machinery (imports horovod when built)
        from . import horovod
        return horovod.lookup(name)(model, optimizer, comm, settings)
    return lookup(name)(model, optimizer, comm, settings)


# Registration happens on import of each module.
from . import allreduce, bytescheduler, ddp, mgwfbp, ps  # noqa: E402,F401
