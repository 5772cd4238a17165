"""The structure docs/DESIGN.md describes holds in the code: layers, no import cycle, every
design reference resolves, one description per method, declarations readable without torch."""
import ast
import os
import re
import subprocess
import sys

import pytest

from .conftest import REPO

PACKAGES = ("ddlbench", "compression", "models")
TOP_SCRIPTS = ("benchmarks",)
DESIGN = os.path.join(REPO, "docs", "DESIGN.md")


def _modules() -> dict[str, str]:
    """module name -> file, for every module of the suite (tests excluded)."""
    out = {name: os.path.join(REPO, f"{name}.py") for name in TOP_SCRIPTS}
    for pkg in PACKAGES:
        for folder, _, files in os.walk(os.path.join(REPO, pkg)):
            if "__pycache__" in folder:
                continue
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(folder, f), REPO)[:-3]
                    name = rel.replace(os.sep, ".")
                    out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = \
                        os.path.join(folder, f)
    return out


def _imports(modules: dict[str, str]) -> dict[str, set[str]]:
    """module -> the suite's modules it imports, anywhere in its body (function-level imports
    count). ``from pkg import sub`` with ``sub`` a module is an import of ``pkg.sub`` only."""
    graph = {}
    for name, path in modules.items():
        is_pkg = path.endswith("__init__.py")
        here = name.split(".") if is_pkg else name.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(open(path).read(), path)):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = (".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module
                                                                        else []))
                        if node.level else node.module)
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.append(sub if sub in modules else base)
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def _layers() -> list[tuple[int, str, list[str]]]:
    """(layer, name, module patterns) from the table of docs/DESIGN.md section 12."""
    text = open(DESIGN).read()
    section = text.split("## 12. Architecture", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        m = re.match(r"\|\s*(\d+)\s*\|\s*([^|]+?)\s*\|\s*(.+?)\s*\|\s*$", line)
        if m:
            rows.append((int(m.group(1)), m.group(2), re.findall(r"`([^`]+)`", m.group(3))))
    return rows


def _layer_of(module: str, layers) -> int | None:
    best = None
    for number, _, patterns in layers:
        for p in patterns:
            if p == module or (p.endswith(".*") and (module == p[:-2]
                                                     or module.startswith(p[:-1]))):
                best = number
    return best


def test_every_module_is_in_a_layer_and_imports_only_its_own_or_lower_layers():
    layers = _layers()
    assert [n for n, _, _ in layers] == list(range(len(layers))) and len(layers) >= 8
    modules = _modules()
    unplaced = sorted(m for m in modules if _layer_of(m, layers) is None)
    assert unplaced == [], "modules in no layer of docs/DESIGN.md section 12"
    upward = sorted(f"{m} (layer {_layer_of(m, layers)}) imports {d} (layer {_layer_of(d, layers)})"
                    for m, deps in _imports(modules).items() for d in deps
                    if _layer_of(d, layers) > _layer_of(m, layers))
    assert upward == []


# packages whose every module stays in the package's layer, so none reaches up to what
# measures, runs or models it (a module placed higher in the table would be one); with them
# every package the table places whole (``pkg.*``)
LOWER_PACKAGES = ("compression", "models")


def _packages(layers) -> list[str]:
    """``LOWER_PACKAGES`` and every package the table places whole."""
    whole = [p[:-2] for _, _, patterns in layers for p in patterns if p.endswith(".*")]
    return list(LOWER_PACKAGES) + whole


def _reaching_up(graph: dict[str, set[str]], layers) -> list[str]:
    """Each import, by a module of one of ``_packages``, of a module above its package's
    layer, whatever layer the table gives the importer."""
    found = []
    for pkg in _packages(layers):
        own = _layer_of(pkg, layers)
        for m in sorted(graph):
            if m == pkg or m.startswith(pkg + "."):
                found += [f"{m} imports {d} (layer {_layer_of(d, layers)}, above {pkg}'s {own})"
                          for d in sorted(graph[m]) if _layer_of(d, layers) > own]
    return found


def test_no_module_of_a_lower_package_imports_a_higher_layer():
    """Nothing under compression/ or models/ imports the measurement, the methods, the model,
    the run or the sweep (the codec benchmark, which records its figures, lives in
    ddlbench.measure), nor a method the model, even where the table would place one of their
    modules higher."""
    layers = _layers()
    assert {"compression", "models", "ddlbench.methods", "ddlbench.measure"} <= set(
        _packages(layers))
    assert _reaching_up(_imports(_modules()), layers) == []
    # as compression.bench once did: placed in the run layer, importing measure.record; and a
    # method module importing the model
    planted = {"compression.bench": {"ddlbench.measure.record", "ddlbench.errors"},
               "ddlbench.methods.example": {"ddlbench.model.simulate", "ddlbench.planning"}}
    assert _reaching_up(planted, layers) == [
        "compression.bench imports ddlbench.measure.record (layer 6, above compression's 5)",
        "ddlbench.methods.example imports ddlbench.model.simulate (layer 8, above "
        "ddlbench.methods's 7)"]


MAX_FUNCTION_LINES = 80


def _long_functions(source: str, path: str) -> list[str]:
    """``path:line: name (n lines)`` for each function or method of ``source`` longer than
    ``MAX_FUNCTION_LINES``, from its ``def`` to its last line (decorators not counted), methods
    and nested functions named by what holds them (``Class.method``, ``outer.inner``)."""
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                lines = child.end_lineno - child.lineno + 1
                if not isinstance(child, ast.ClassDef) and lines > MAX_FUNCTION_LINES:
                    found.append(f"{path}:{child.lineno}: {name} ({lines} lines)")
                visit(child, name + ".")
            else:
                visit(child, prefix)
    visit(ast.parse(source, path), "")
    return found


def test_no_function_is_longer_than_80_lines():
    """Every function and method of the suite's modules (tests excluded) fits in 80 lines; a
    longer one is named, with its file and line."""
    found = [f for name, path in sorted(_modules().items())
             for f in _long_functions(open(path).read(), os.path.relpath(path, REPO))]
    assert found == []

    def function(name, lines, indent=""):
        return [f"{indent}def {name}():"] + [f"{indent}    x = {i}" for i in range(lines - 1)]
    source = "\n".join(function("fits", 80) + ["class C:"] + function("long", 81, "    ")
                       + function("inner", 81, "        ")) + "\n"
    assert _long_functions(source, "m.py") == ["m.py:82: C.long (162 lines)",
                                               "m.py:163: C.long.inner (81 lines)"]


def test_the_import_graph_has_no_cycle():
    graph = _imports(_modules())
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path + [node, nxt]))
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_every_module_says_what_it_is_in_its_first_line():
    missing = []
    for name, path in _modules().items():
        doc = ast.get_docstring(ast.parse(open(path).read()))
        if not doc or not doc.splitlines()[0].strip():
            missing.append(name)
    assert missing == []


ISSUE_NUMBER = re.compile(r"\b[Ii]ssues?\s+#?\d+")


def test_module_docstrings_and_the_readme_name_no_issue_number():
    """A module's docstring and the README say what a thing is, not which issue asked for it
    (an issue number means nothing to a reader of the code; docs/RESULTS.md keeps the dated
    history)."""
    found = [name for name, path in sorted(_modules().items())
             if ISSUE_NUMBER.search(ast.get_docstring(ast.parse(open(path).read())) or "")]
    readme = open(os.path.join(REPO, "README.md")).read()
    found += [f"README.md:{i}" for i, line in enumerate(readme.splitlines(), 1)
              if ISSUE_NUMBER.search(line)]
    assert found == []
    assert [bool(ISSUE_NUMBER.search(t)) for t in ("(issue 45, item 4)", "issue #4",
                                                    "Issues 18 and 45", "Iter #0", "issued 4")] \
        == [True, True, True, False, False]


def _design_references():
    """(file, line number, section numbers) of every 'docs/DESIGN.md section(s) ...' in the
    suite's code, scripts, configs and README."""
    pattern = re.compile(r"DESIGN\.md,?\s+sections?\s+((?:\d+(?:-\d+)?(?:,\s*|\s+and\s+)?)+)")
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "logs",
                                                                           "results", "docs")]
        for f in files:
            if not f.endswith((".py", ".sh", ".md", ".yaml", ".conf")) and f != "Makefile":
                continue
            path = os.path.join(folder, f)
            for i, line in enumerate(open(path, errors="replace"), 1):
                for m in pattern.finditer(line):
                    numbers = set()
                    for part in re.findall(r"\d+(?:-\d+)?", m.group(1)):
                        lo, _, hi = part.partition("-")
                        numbers |= set(range(int(lo), int(hi or lo) + 1))
                    yield os.path.relpath(path, REPO), i, numbers


def test_every_design_reference_resolves_to_a_heading():
    headings = {int(n) for n in re.findall(r"^## (\d+)\. ", open(DESIGN).read(), re.M)}
    refs = list(_design_references())
    assert len(refs) > 20  # the code does cite it
    dangling = [f"{f}:{i}: section {n}" for f, i, numbers in refs for n in sorted(numbers)
                if n not in headings]
    assert dangling == []
    stale = [f"{os.path.relpath(p, REPO)}"
             for p in (os.path.join(d, f) for d, _, fs in os.walk(os.path.join(REPO, "ddlbench"))
                       for f in fs if f.endswith(".py"))
             if re.search(r"(?<!docs/)DESIGN\.md", open(p).read())]
    assert stale == [], "references must name docs/DESIGN.md"


def test_the_declarations_load_without_torch():
    """The method and compressor registries, and what the launchers ask of them, import no
    torch: `python -m ddlbench.methods` stays cheap."""
    code = ("import sys; from ddlbench import methods; import compression; "
            "methods.option_owners(); methods.names('horovod'); methods.table(); "
            "methods.launcher_args('bytescheduler', {}); compression.option_owners(); "
            "compression.table(); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_readme_method_table_is_the_registry_s():
    from ddlbench import methods
    readme = open(os.path.join(REPO, "README.md")).read()
    assert methods.table() in readme


def test_shared_options_are_declared_alike_and_flags_are_unique():
    import compression
    from ddlbench import methods
    owners = {**methods.option_owners(), **compression.option_owners()}
    flags = [spec.flag for spec, _ in owners.values()]
    assert len(flags) == len(set(flags))
    assert len(methods.option_owners()) + len(compression.option_owners()) == len(owners)
    for engine in methods.ENGINES:
        for name, cls in methods.registry(engine).items():
            assert cls.id == name and cls.display and cls.summary, name
            assert cls.architecture in (methods.A2A, methods.PS), name
            assert cls.accepts("none") is None, name


@pytest.mark.parametrize("command,expected", [
    (["defaults", "fusion"], "threshold=67108864\n"),
    (["defaults", "bytescheduler"], "partition=4000000\ncredit=16000000\n"),
    (["args", "ddp"], "--bucket-cap-mb\n25\n--compressor\nnone\n"),
])
def test_the_launchers_ask_the_registry(command, expected):
    env = {k: v for k, v in os.environ.items() if k not in ("compressor", "bucket_cap_mb")}
    out = subprocess.run([sys.executable, "-m", "ddlbench.methods", *command], cwd=REPO,
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == expected


def _string_constants(path: str) -> set[str]:
    """Every string literal of a module that is a whole value (not a docstring's words)."""
    tree = ast.parse(open(path).read(), path)
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)}
    return {n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs}


def test_method_ids_are_named_only_by_the_method_and_the_registry():
    """The model, the sweep, the run and the plots read what they need of a method from its
    declarations (its rule, architecture, hatch): a new method is predicted, plotted and
    validated from its own file. Only the files declaring a method (on either engine, or a
    subclass of it) and the registry (its default) name its id; data files (configs/) may."""
    from ddlbench import methods
    modules = _modules()
    registry = modules["ddlbench.methods"]
    naming = {}
    for name, path in modules.items():
        for text in _string_constants(path):
            if text in methods.names():
                naming.setdefault(text, set()).add(os.path.relpath(path, REPO))
    def family(mid):
        """The files declaring ``mid`` on any engine, or a subclass of such a class."""
        roots = [methods.registry(e)[mid] for e in methods.ENGINES if mid in methods.registry(e)]
        return {os.path.relpath(modules[cls.__module__], REPO)
                for e in methods.ENGINES for cls in methods.registry(e).values()
                if issubclass(cls, tuple(roots))}

    stray = {mid: sorted(files - family(mid) - {os.path.relpath(registry, REPO)})
             for mid, files in naming.items()}
    assert {mid: files for mid, files in stray.items() if files} == {}
