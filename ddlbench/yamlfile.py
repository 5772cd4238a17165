"""Reading the suite's YAML files (sweeps, network profiles): a file that cannot be read or
parsed, or that gives a key twice, is one line naming the file, the line and the problem, never
a traceback."""
from __future__ import annotations

from .errors import UsageError

MAX_BYTES = 1 << 20     # a sweep or profile file is a few kilobytes
MAX_NODES = 100_000     # after alias expansion


def load(path: str, what: str):
    """The parsed contents of the YAML file ``path`` (``what`` names it in messages)."""
    import yaml
    try:
        with open(path) as f:
            text = f.read(MAX_BYTES + 1)
        if len(text) > MAX_BYTES:
            raise UsageError(f"{what} {path} is larger than {MAX_BYTES} bytes")
        root = yaml.compose(text, yaml.SafeLoader)
        nodes = _expanded_nodes(root)
        if nodes > MAX_NODES:
            # Aliases of aliases grow a document exponentially (the "billion laughs").
            raise UsageError(f"{what} {path} expands to {nodes:.3g} YAML nodes (through its "
                             f"aliases); at most {MAX_NODES} are allowed")
        twice = _duplicate_key(root)
        if twice:
            key, first, second = twice
            raise UsageError(f"{what} {path}: key {key!r} is given twice, at lines {first} and "
                             f"{second} (YAML would keep the last silently); give it once")
        return yaml.safe_load(text)
    except RecursionError:
        raise UsageError(f"{what} {path} nests too deeply") from None
    except UnicodeDecodeError:
        raise UsageError(f"{what} {path} is not UTF-8 text") from None
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UsageError(f"{what} {path}: malformed YAML{where}: "
                         f"{getattr(e, 'problem', None) or e}") from None


def _expanded_nodes(root) -> int:
    """How many nodes the document has once every alias is expanded, counted without
    expanding (a node shared by aliases is counted once per use)."""
    sizes: dict[int, int] = {}

    def size(node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        sizes[id(node)] = 1  # a recursive alias counts once
        children = node.value if isinstance(node.value, list) else []
        total = 1
        for child in children:
            for part in (child if isinstance(child, tuple) else (child,)):
                total += size(part)
        sizes[id(node)] = total
        return total
    return 0 if root is None else size(root)


def _duplicate_key(root) -> tuple[str, int, int] | None:
    """The first key some mapping of the document gives twice (its text and the two lines), or
    None. Keys are the same when their resolved tag and text are (``1`` and ``"1"`` differ);
    a merge (``<<: *base``) is not a key: the keys written beside it replace the base's."""
    import yaml
    seen: set[int] = set()
    stack = [] if root is None else [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            lines: dict[tuple, int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    line = key.start_mark.line + 1
                    if (key.tag, key.value) in lines:
                        return key.value, lines[(key.tag, key.value)], line
                    lines[(key.tag, key.value)] = line
            stack += [part for pair in reversed(node.value) for part in reversed(pair)]
        elif isinstance(node, yaml.SequenceNode):
            stack += reversed(node.value)
    return None
