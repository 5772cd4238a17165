"""Issue 43: Python 3.14's standard library has a package named ``compression`` (PEP 784).

With the repository root first on sys.path, ``import compression`` is ours; compression/__init__.py
then adds the library's directory to our ``__path__`` so that ``compression.zstd`` (which zipfile,
shutil and tarfile import on 3.14) still loads the library's. Python 3.14 is simulated here: a
subprocess whose ``sysconfig.get_paths()["stdlib"]`` names a temporary directory holding a fake
``compression`` package.
"""
import glob
import json
import os
import subprocess
import sys
import sysconfig

from .conftest import REPO

OURS = os.path.join(REPO, "compression")
STDLIB_SUBMODULES = {"zstd", "gzip", "bz2", "lzma", "zlib", "_common"}

# Runs in the subprocess, cwd REPO (so `python -c` has the repository root first on sys.path).
# argv[1]: what sysconfig.get_paths()["stdlib"] is to return. A finder notes what
# `from compression import zstd` gives while our __init__ is still importing (as 3.14's shutil does
# when our imports pull in tempfile first), then `import compression.zstd` runs as zipfile's does.
PROBE = r"""
import json, sys, sysconfig
fake = sys.argv[1]
real = sysconfig.get_paths
sysconfig.get_paths = lambda *a, **k: {**real(*a, **k), "stdlib": fake}

class DuringInit:
    seen = "not reached"
    def find_spec(self, name, path=None, target=None):
        if name == "ddlbench.errors" and DuringInit.seen == "not reached":
            try:
                from compression import zstd
                DuringInit.seen = getattr(zstd, "WHO", "no WHO")
            except ImportError as e:
                DuringInit.seen = "ImportError"
        return None

sys.meta_path.insert(0, DuringInit())
import compression
out = {"path": list(compression.__path__), "ours": hasattr(compression, "COMPRESSORS"),
       "during_init": DuringInit.seen}
try:
    import compression.zstd
    out["zstd"] = compression.zstd.WHO
    out["streams"] = compression.zstd.STREAMS
except ImportError as e:
    out["zstd"] = "ImportError"
import importlib.util
out["reference"] = importlib.util.find_spec("compression.reference").origin
print(json.dumps(out))
"""


def probe(stdlib):
    out = subprocess.run([sys.executable, "-c", PROBE, str(stdlib)], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def fake_stdlib(root):
    """A 3.14-like library: compression/ with zstd/ importing compression._common absolutely."""
    pkg = root / "compression"
    (pkg / "zstd").mkdir(parents=True)
    (pkg / "_common").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_common" / "__init__.py").write_text("")
    (pkg / "_common" / "_streams.py").write_text("WHO = 'stdlib _streams'\n")
    (pkg / "zstd" / "__init__.py").write_text(
        "from compression._common import _streams\n"
        "WHO = 'stdlib zstd'\n"
        "STREAMS = _streams.WHO\n")
    return pkg


def test_the_library_s_submodules_load_and_our_names_stay_ours(tmp_path):
    pkg = fake_stdlib(tmp_path)
    out = probe(tmp_path)
    assert out["ours"], "import compression must give the project's package"
    assert out["path"] == [OURS, str(pkg)]
    assert out["zstd"] == "stdlib zstd"
    assert out["streams"] == "stdlib _streams"
    assert out["during_init"] == "stdlib zstd", "the __path__ extension must precede our imports"
    assert out["reference"] == os.path.join(OURS, "reference.py")


def test_without_a_library_package_the_path_is_unchanged(tmp_path):
    out = probe(tmp_path)                       # a "stdlib" with no compression/ in it
    assert out["ours"]
    assert out["path"] == [OURS]
    assert out["zstd"] == "ImportError"


def test_no_submodule_of_ours_is_named_like_one_of_the_library_s():
    ours = {os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(OURS, "*.py"))}
    ours |= {os.path.basename(os.path.dirname(p))
             for p in glob.glob(os.path.join(OURS, "*", "__init__.py"))}
    assert not ours & STDLIB_SUBMODULES


def test_this_interpreter(tmp_path):
    """The real library: on 3.14 and later compression.zstd is the library's; before, no change."""
    code = ("import compression, json; out = {'path': list(compression.__path__)}\n"
            "try:\n import compression.zstd as z; out['zstd'] = z.__file__\n"
            "except ImportError: out['zstd'] = None\n"
            "print(json.dumps(out))")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    lib = os.path.join(sysconfig.get_paths()["stdlib"], "compression")
    if os.path.isdir(lib):
        assert out["path"] == [OURS, lib]
        assert out["zstd"] is None or out["zstd"].startswith(lib)  # None: built without _zstd
    else:
        assert out["path"] == [OURS]
        assert out["zstd"] is None
