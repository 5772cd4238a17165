"""A new compressor is one class: the int8 quantiser of docs/DESIGN.md section 13 ("Adding a
compressor"; this test takes its files from there), in a package of its own named by
DDLBENCH_COMPRESSORS, is offered by --compressor, the methods table and the sweep's checks,
passes --verify against the reference it names, is counted as it declares, and is priced by
the model from its declaration, with no file of ddlbench/ or compression/ touched."""
import json
import os
import sys

import pytest

from .conftest import QUICK_TIMING, REPO, TINY_BERT, describe, run, train, verify_lines

MARK = "    # myplugins/"


def example_files() -> dict[str, str]:
    """The worked example's files (path -> text) from DESIGN.md's "Adding a compressor": each
    indented block opening with a ``# myplugins/NAME.py`` line."""
    with open(os.path.join(REPO, "docs", "DESIGN.md")) as f:
        text = f.read()
    section = text[text.index("### Adding a compressor\n"):]
    section = section[:section.index("\n## ")]
    files, path = {}, None
    for line in section.splitlines():
        if line.startswith(MARK):
            path = line[len("    # "):].strip()
            files[path] = []
        elif path is not None and (line.startswith("    ") or not line.strip()):
            files[path].append(line[4:])
        else:
            path = None
    return {p: "\n".join(lines).strip("\n") + "\n" for p, lines in files.items()}


@pytest.fixture
def plugin_env(tmp_path):
    """The example written into ``tmp_path``, named by DDLBENCH_COMPRESSORS; beside it a copy
    that names no reference (``int8bare``) and one that sends twice the gradient
    (``int8double``, checked against int8's reference)."""
    files = example_files()
    assert sorted(files) == ["myplugins/int8.py", "myplugins/int8_reference.py"]
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "myplugins" / "__init__.py").write_text('"""Compressors of my own."""\n')
    (tmp_path / "myplugins" / "bare.py").write_text(
        '"""int8 without a reference."""\nfrom myplugins.int8 import Int8\n\n\n'
        'class Bare(Int8):\n    id = "int8bare"\n    reference = ""\n\n\n'
        'class Double(Int8):\n    id = "int8double"\n\n'
        '    def reduce_async(self, key, tensor, comm, shapes=None):\n'
        '        return super().reduce_async(key, tensor.mul_(2), comm, shapes)\n')
    return {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "DDLBENCH_COMPRESSORS": "myplugins.int8, myplugins.bare"}


def test_the_plugin_is_offered_where_the_compressors_are(plugin_env, tmp_path):
    proc = train("--help", timeout=120, **plugin_env)
    assert proc.returncode == 0, describe(proc)
    assert "efsignum, efsignum_scaled, powersgd, bf16, int8, int8bare, int8double;" in " ".join(proc.stdout.split())
    # the tables: fusion takes every compressor, ByteScheduler all but PowerSGD
    proc = run([sys.executable, "-m", "ddlbench.methods", "table"], timeout=120, **plugin_env)
    assert proc.returncode == 0, describe(proc)
    rows = {r.split("|")[1].strip(): r.split("|")[5].strip()
            for r in proc.stdout.splitlines() if r.startswith("| `")}
    assert rows["`fusion`"] == "all"
    assert rows["`bytescheduler`"].endswith(
        "`efsignum`, `efsignum_scaled`, `bf16`, `int8`, `int8bare`, `int8double`")
    proc = run([sys.executable, "-m", "ddlbench.methods", "compressors"], timeout=120,
               **plugin_env)
    assert "| `int8` | - | the bucket in int8 at scale max|g|/127, and the scale, " \
        "all-gathered |" in proc.stdout, describe(proc)
    # the sweep's checks: a known compressor passes, a misspelt one is named
    sweep = tmp_path / "sweep.yaml"
    body = ("tasks:\n  - {model: bert_tiny, batch_size: 4, sentence_len: 16}\n"
            f"results: {tmp_path / 'results'}\nlogs: {tmp_path / 'logs'}\nmethods:\n")
    sweep.write_text(body + "  - {method: fusion, compressor: int8}\n")
    proc = run([sys.executable, "benchmarks.py", "--config", str(sweep), "--dry-run"],
               timeout=300, **plugin_env)
    assert proc.returncode == 0, describe(proc)
    assert "--method fusion --compressor int8" in proc.stdout
    sweep.write_text(body + "  - {method: fusion, compressor: int9}\n")
    proc = run([sys.executable, "benchmarks.py", "--config", str(sweep), "--dry-run"],
               timeout=300, **plugin_env)
    assert proc.returncode == 2 and "unknown compressor 'int9'" in proc.stderr, describe(proc)
    # a module that cannot be imported: one line
    proc = train("--help", timeout=120, **{**plugin_env, "DDLBENCH_COMPRESSORS": "myplugins.nope"})
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "ddlbench: error: DDLBENCH_COMPRESSORS: cannot import 'myplugins.nope': "
        "ModuleNotFoundError: No module named 'myplugins.nope'"), describe(proc)
    # --verify needs a reference: one line for a compressor that names none
    proc = train(*TINY_BERT, "--verify", "1", "--compressor", "int8bare", timeout=120,
                 **plugin_env)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("ddlbench: error: compressor 'int8bare' declares no "
                                   "reference mathematics (its 'reference'): --verify cannot "
                                   "check it")


def test_the_plugin_verifies_against_its_own_reference(plugin_env):
    """int8 matches its reference at every step; a copy that sends twice the gradient is
    caught by it (under SGD: Adam's step does not see a gradient's scale)."""
    proc = train(*TINY_BERT, "--verify", "3", "--method", "fusion", "--compressor",
                 "int8,int8double", "--optimizer", "sgd", "--nworkers", "3", timeout=600,
                 **plugin_env)
    assert proc.returncode == 1, describe(proc)
    lines = verify_lines(proc.stdout)
    assert [(step, ok) for step, *_, ok in lines["fusion+int8"]] == [(1, True), (2, True),
                                                                      (3, True)]
    assert not any(ok for *_, ok in lines["fusion+int8double"])
    assert "verify: 3 worker(s), bert_tiny: FAILED: fusion+int8double" in proc.stdout


def test_the_plugin_is_counted_and_predicted_as_it_declares(plugin_env, tmp_path, load_json):
    out = tmp_path / "rec.json"
    proc = train(*TINY_BERT, "--method", "fusion", "--threshold", "400000", "--compressor",
                 "int8", "--nworkers", "2", *QUICK_TIMING, "--output", str(out), timeout=600,
                 **plugin_env)
    assert proc.returncode == 0, describe(proc)
    rec = load_json(out)
    buckets = rec["method"]["bucket_bytes"]
    assert len(buckets) > 1 and rec["method"]["compressor"] == "int8"
    # per bucket of n fp32 elements: n int8 values and one fp32 scale, all-gathered (its
    # declaration's sizes are the gathered outputs; each worker hands over 1/P of them)
    assert rec["compression_per_iteration"]["payload_bytes"] == sum(b // 4 + 4 for b in buckets)
    assert rec["communication_per_iteration"]["payload_bytes"] == {
        "allgather": sum(b // 4 + 4 for b in buckets)}

    # the model: BSP all-gathers the whole gradient once, as int8 values and one scale
    prof = {"format": "ddlbench-mgwfbp-profile", "version": 1, "model": "hand-made",
            "workload": {"batch_size": 8, "image_size": 32},
            "tensors": [{"name": f"layer{i}.weight", "shape": [n // 4], "bytes": n}
                        for i, n in enumerate([4096, 1 << 20, 65536, 4 << 20])],
            "backward_s": [0.002, 0.004, 0.001, 0.006], "forward_s": 0.01,
            "alpha_s": 1e-3, "beta_s_per_byte": 1e-9, "nworkers": 2, "backend": "gloo",
            "device": "cpu", "network": "local"}
    (tmp_path / "prof.json").write_text(json.dumps(prof))
    pred = tmp_path / "pred.json"
    proc = run([sys.executable, "-m", "ddlbench.model.predict", "--profile",
                str(tmp_path / "prof.json"), "--method", "bspa2a", "--compressor", "int8",
                "--nworkers", "4", "--optimizer-ms", "0", "--output", str(pred)], timeout=120,
               **plugin_env)
    assert proc.returncode == 0, describe(proc)
    [p] = load_json(pred)["predictions"]
    n = (4096 + (1 << 20) + 65536 + (4 << 20)) // 4
    gathered = [4 * n, 4 * 4]   # 4 workers' int8 values, then their fp32 scales
    assert p["compressor"] == "int8" and p["message_bytes"] == [sum(gathered)]
    # forward, backward, then two all-gathers at the profile's alpha-beta (BSP: no overlap)
    assert p["iteration_s"] == pytest.approx(
        0.01 + 0.013 + sum(1e-3 + 1e-9 * size for size in gathered), rel=1e-12)
