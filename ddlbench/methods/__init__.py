"""The method registry: every ``Method`` declared in this package, and what derives from the
declarations (the training script's flags, ``--method all``, launcher arguments, the README table).

Where methods come from, in this order:

- every module of this package (one file per family of methods): a public ``Method`` subclass
  defined there with an ``id`` of its own is registered under its ``engine`` ("torch", or
  "horovod", "byteps", "deepspeed" and "torchft" for the real-Horovod, real-BytePS,
  real-DeepSpeed and real-torchft lanes' implementations of the same ids);
- the modules named in the environment variable ``DDLBENCH_METHODS`` (comma-separated, e.g. a
  package of your own on ``PYTHONPATH``): adding a method is one file there or here;
- ``package.module:ClassName`` given as a method name: a method under development, which
  ``--verify`` can prove right without registering it.

Nothing here imports torch: reading the declarations (``python -m ddlbench.methods``, the
sweep's checks, the launchers) stays cheap.
"""
from __future__ import annotations

import importlib
import os
import pkgutil

from ..errors import UsageError
from ..options import Spec, collect, from_environment
from .base import A2A, PS, Method

ENGINES = ("torch", "horovod", "byteps", "deepspeed", "torchft")
# the training script's --method when none is given: Horovod's tensor fusion, the original's
DEFAULT = "fusion"
PLUGINS_ENV = "DDLBENCH_METHODS"
# the engines that run a real framework's implementation of some methods
LANES = {"horovod": "Horovod", "byteps": "BytePS", "deepspeed": "DeepSpeed",
         "torchft": "torchft"}

_registry: dict[str, dict[str, type[Method]]] | None = None


def _discover() -> dict[str, dict[str, type[Method]]]:
    modules = [importlib.import_module(f"{__name__}.{m.name}")
               for m in pkgutil.iter_modules(__path__)]
    for name in filter(None, (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(","))):
        try:
            modules.append(importlib.import_module(name))
        except Exception as e:  # ImportError, or the module's own error
            raise UsageError(f"{PLUGINS_ENV}: cannot import {name!r}: "
                             f"{type(e).__name__}: {e}") from None
    found: dict[str, dict[str, type[Method]]] = {engine: {} for engine in ENGINES}
    for module in modules:
        for obj in vars(module).values():
            if not (isinstance(obj, type) and issubclass(obj, Method)
                    and obj.__module__ == module.__name__ and not obj.__name__.startswith("_")
                    and obj.__dict__.get("id")):
                continue
            engine = found.setdefault(obj.engine, {})
            if obj.id in engine and engine[obj.id] is not obj:
                raise TypeError(f"method id {obj.id!r} ({obj.engine}) is declared twice: by "
                                f"{engine[obj.id].__module__} and {obj.__module__}")
            engine[obj.id] = obj
    return found


def registry(engine: str = "torch") -> dict[str, type[Method]]:
    """id -> class of every registered method of ``engine``, in discovery order."""
    global _registry
    if _registry is None:
        _registry = _discover()
    return _registry.get(engine, {})


def names(engine: str = "torch") -> list[str]:
    return list(registry(engine))


def lookup(name: str, engine: str = "torch") -> type[Method]:
    """The class of method ``name`` on ``engine`` (``module:Class`` on the torch engine)."""
    found = registry(engine).get(name)
    if found is not None:
        return found
    if engine in LANES:
        raise UsageError(f"method {name!r} has no {LANES[engine]} mapping; --engine {engine} "
                         f"runs {', '.join(names(engine))} (the others run on --engine torch)")
    if ":" in name:
        module, _, attr = name.partition(":")
        if not (all(p.isidentifier() for p in module.split(".")) and attr.isidentifier()):
            raise UsageError(f"method {name!r} is neither a known id nor module:Class; known: "
                             f"{', '.join(registry(engine))}")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except Exception as e:  # ImportError, AttributeError, or the module's own error
            raise UsageError(f"cannot load method {name!r}: {type(e).__name__}: {e}") from None
        if not (isinstance(cls, type) and issubclass(cls, Method)):
            raise UsageError(f"method {name!r} is not a Method subclass")
        return cls
    raise UsageError(f"unknown method {name!r}; known: {', '.join(registry(engine))}")


def create(name: str, model, optimizer, comm, values=None, compressor=None,
           engine: str = "torch", model_name: str | None = None) -> Method:
    """Method ``name`` (not yet started) with its options taken from ``values`` (option name
    -> value; missing or None: the method's default; names it does not declare: ignored)."""
    cls = lookup(name, engine)
    return cls(model, optimizer, comm, cls.Options.resolve(values or {}), compressor,
               model_name=model_name)


def architecture(name: str) -> str:
    """a2a or ps; a2a for a method that cannot be loaded (the sweep's tables)."""
    try:
        return lookup(name).architecture
    except Exception:
        return A2A


# -- which methods and compressors a job runs ----------------------------------------------------

def selected(spec: str, engine: str = "torch", with_servers: bool = True) -> list[str]:
    """The method ids of ``--method`` (comma-separated; ``all`` is every method this job can
    run: the PS methods only when it has servers), in order, each once."""
    every = [n for n, cls in registry(engine).items()
             if with_servers or cls.architecture != PS]
    out = []
    for m in (m.strip() for m in spec.split(",")):
        for name in (every if m == "all" else [m] if m else []):
            if name not in out:
                out.append(name)
    return out


def takes(name: str, compressor: str, engine: str = "torch") -> bool:
    return lookup(name, engine).accepts(compressor) is None


def pairs(spec: str, compressors: list[str], engine: str = "torch",
          with_servers: bool = True) -> list[tuple[str, str]]:
    """(method, compressor) pairs to run. ``all`` leaves out methods that cannot take a
    compressor; a method named explicitly that cannot is an error saying why."""
    explicit = {m.strip() for m in spec.split(",")} - {"all"}
    out = []
    for name in selected(spec, engine, with_servers):
        for comp in compressors:
            why = lookup(name, engine).accepts(comp)
            if why is None:
                out.append((name, comp))
            elif name in explicit:
                able = [m for m in names(engine) if takes(m, comp, engine)]
                raise UsageError(f"method {name!r} cannot take --compressor {comp}: {why}; "
                                 f"use one of {', '.join(able)}")
    return out


# -- options: flags, defaults, launcher arguments --------------------------------------------

def option_owners(engine: str = "torch") -> dict[str, tuple[Spec, list[tuple[str, object]]]]:
    """Every method option by name: its declaration and (method id, default) of each method
    declaring it."""
    return collect((mid, cls.Options) for mid, cls in registry(engine).items())


def launcher_args(spec: str, environ=None, skip: tuple[str, ...] = ()) -> list[str]:
    """The training script's flags for the options of method(s) ``spec`` (an id, a
    comma-separated list or ``all``) as a shell launcher passes them: each option from the
    variable named after it (``threshold=...``), else its environment fallback; for one method
    also the defaults of the rest (the command line then shows every setting), for several
    only what was given (each method keeps its own default). With ``compressor`` (and that
    compressor's options) when a method takes one. ``skip``: options the launcher passes
    itself. The defaults are those of the lane the variable ``engine`` names (a lane with
    options of its own: DeepSpeed's), else the torch engine's."""
    import compression
    environ = os.environ if environ is None else environ
    engine = environ.get("engine") if environ.get("engine") in LANES else "torch"
    classes = [lookup(name, engine) for name in selected(spec, engine)]
    if not classes:
        raise UsageError("method must name a method, got ''")

    def flags(collected, with_defaults: bool) -> list[str]:
        out = []
        for name, (spec_, owners) in collected.items():
            if name in skip:
                continue
            value = from_environment(spec_, environ)
            if value is None and with_defaults:
                value = owners[0][1]
            if value is not None:
                out += [spec_.flag, spec_.format(value)]
        return out

    out = flags(collect((cls.id, cls.Options) for cls in classes), len(classes) == 1)
    if any(cls.accepts(c) is None for cls in classes for c in compression.COMPRESSORS
           if c != "none"):
        name = environ.get("compressor") or "none"
        out += ["--compressor", name]
        out += flags(collect([(name, compression.lookup(name).Options)]), True)
    return out


def defaults(name: str) -> list[Spec]:
    """The declarations of method ``name``'s options (the launchers' defaults)."""
    return lookup(name).Options.specs()


def table(engine: str = "torch") -> str:
    """The README's method table, made from the declarations."""
    import compression
    rows = ["| id | name | architecture | options (default) | compressors | what it does |",
            "| --- | --- | --- | --- | --- | --- |"]
    for mid, cls in registry(engine).items():
        opts = ", ".join(f"`{s.flag}` ({'-' if s.default is None else s.format(s.default)})"
                         for s in cls.Options.specs()) or "-"
        taken = [c for c in compression.COMPRESSORS if cls.accepts(c) is None]
        comps = ("all" if len(taken) == len(compression.COMPRESSORS)
                 else ", ".join(f"`{c}`" for c in taken))
        # a method that is not synchronous SGD says so where its summary is read
        changes = (f" (**changes the algorithm**: {cls.changes_algorithm})"
                   if cls.changes_algorithm else "")
        rows.append(f"| `{mid}` | {cls.display} | {cls.architecture} | {opts} | {comps} | "
                    f"{cls.summary}{changes} |")
    return "\n".join(rows)
