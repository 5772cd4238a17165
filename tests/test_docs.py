"""The user documents hold together: README.md, docs/MODEL.md and docs/RESULTS.md link only to
files and headings that exist, the README stays short, and its Layout names every package."""
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", os.path.join("docs", "MODEL.md"), os.path.join("docs", "RESULTS.md")]

# Issue 43, item 6: the README is for users (what the suite answers, the two commands, one job,
# the methods, sweeps, clusters, the model in short, the layout) and at most about 350 lines;
# measurements and their history live in docs/RESULTS.md and docs/MODEL.md.
README_MAX_LINES = 350

# Top-level folders the README's Layout names besides the Python packages, which are found on
# disk (see test_the_readme_names_every_package).
FOLDERS = ["horovod", "byteps", "bytescheduler", "mgwfbp", "configs", "torchrun", "slurm",
           "scripts", "logs", "docs", "tests"]

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_LINK = re.compile(r"\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)


def _read(path):
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        return f.read()


def _prose(text):
    """The text without fenced code blocks and inline code spans: links and headings in code
    are not links and headings."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def slug(heading):
    """GitHub's anchor for a heading: inline markup dropped, lower case, every character but
    letters, digits, underscores, hyphens and spaces dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").replace("*", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text):
    """Every anchor of a Markdown document; a repeated heading gets -1, -2, ... as on GitHub."""
    seen, out = {}, set()
    for m in _HEADING.finditer(_FENCE.sub("", text)):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text):
    """(target, line number) of every [text](target) link outside code, images included."""
    prose = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    prose = _CODE_SPAN.sub(lambda m: "\n" * m.group(0).count("\n"), prose)
    for m in _LINK.finditer(prose):
        yield m.group(2), prose.count("\n", 0, m.start()) + 1


def _is_external(target):
    return re.match(r"^(https?|mailto):", target, re.I) is not None


@pytest.mark.parametrize("doc", DOCS)
def test_every_relative_link_resolves(doc):
    text = _read(doc)
    folder = os.path.dirname(os.path.join(REPO, doc))
    found, broken = 0, []
    for target, line in links(text):
        if _is_external(target):
            continue
        found += 1
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(folder, path)) if path else os.path.join(REPO, doc)
        where = f"{doc}:{line}: {target}"
        if not os.path.exists(full):
            broken.append(f"{where}: no file {os.path.relpath(full, REPO)}")
            continue
        if anchor:
            if not full.endswith(".md"):
                broken.append(f"{where}: an anchor into a file that is not Markdown")
            elif anchor not in anchors(open(full, encoding="utf-8").read()):
                broken.append(f"{where}: no heading with anchor #{anchor}")
    assert found > 0, f"{doc} links to nothing"
    assert broken == []


def test_slugs_follow_github():
    assert slug("Sweeps (benchmarks.py)") == "sweeps-benchmarkspy"
    assert slug("3. Cost models") == "3-cost-models"
    assert slug("Against the survey's published table") == "against-the-surveys-published-table"
    assert slug("What it prints, and `--advise`") == "what-it-prints-and---advise"
    assert slug("2026-12-01: where the time goes, 1 Gbit/s") == "2026-12-01-where-the-time-goes-1-gbits"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


def test_the_readme_is_short():
    lines = _read("README.md").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines; the limit is {README_MAX_LINES}: move measurements to "
        "docs/RESULTS.md and the performance model's detail to docs/MODEL.md")


def _packages():
    """ddlbench's subpackages (a folder with an __init__.py or any module: a namespace package
    counts) and the top-level Python packages, from the file system."""
    subs = []
    base = os.path.join(REPO, "ddlbench")
    for name in sorted(os.listdir(base)):
        path = os.path.join(base, name)
        if name.startswith((".", "_")) or not os.path.isdir(path):
            continue
        if any(f.endswith(".py") for f in os.listdir(path)):
            subs.append(f"ddlbench/{name}/")
    tops = [f"{name}/" for name in sorted(os.listdir(REPO))
            if not name.startswith(".") and os.path.isfile(os.path.join(REPO, name, "__init__.py"))]
    return subs, tops


def test_the_readme_names_every_package():
    readme = _read("README.md")
    layout = readme[readme.index("\n## Layout"):]
    subs, tops = _packages()
    assert "ddlbench/model/" in subs or not os.path.isdir(os.path.join(REPO, "ddlbench", "model"))
    assert len(subs) >= 8
    wanted = ["ddlbench/"] + subs + tops + [f"{f}/" for f in FOLDERS]
    missing = [w for w in wanted if f"`{w}" not in layout]
    assert missing == [], "named nowhere in the README's Layout"
    gone = [f for f in FOLDERS if not os.path.isdir(os.path.join(REPO, f))]
    assert gone == [], "folders the Layout names that no longer exist: update FOLDERS and README"
