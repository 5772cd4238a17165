"""A new method is one file: declared in a package of its own, named by DDLBENCH_METHODS, it
appears in --help, --method all, --verify, the sweep's checks, the launchers' defaults and the
performance model (its rule reads the plugin's own option), with no other file touched."""
import json
import os
import sys

from ddlbench.planning import plan_buckets

from .conftest import REPO, TINY_BERT, describe, run, train, verify_lines
from .test_predict import _profile

PLUGIN = '''
"""A trivial all-reduce variant with one option: the gradient in `pieces` buckets."""
from dataclasses import dataclass

from ddlbench.methods.allreduce import BucketedAllReduce
from ddlbench.options import COUNT, Options, option


@dataclass(frozen=True)
class PiecesOptions(Options):
    pieces: int = option(2, COUNT, "how many all-reduces the gradient is cut into")


class Pieces(BucketedAllReduce):
    id = "pieces"
    display = "Pieces-A2A"
    summary = "the gradient in `--pieces` buckets of about equal bytes, in backward order"
    Options = PiecesOptions

    @classmethod
    def fusion_threshold(cls, options, nbytes):
        return sum(nbytes) / options.pieces
'''


def _design_example() -> str:
    """docs/DESIGN.md section 13's worked example (its one Python block), as written there."""
    with open(os.path.join(REPO, "docs", "DESIGN.md")) as f:
        section = f.read().split("### Worked example", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def _plugin_env(tmp_path, module="pieces", text=PLUGIN):
    pkg = tmp_path / "myplugins"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""Methods of my own."""\n')
    (pkg / f"{module}.py").write_text(text)
    return {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "DDLBENCH_METHODS": f"myplugins.{module}"}


def _dry_run(tmp_path, env, methods: str):
    """A sweep file of ``methods`` (YAML list lines) on BERT-Tiny, and its --dry-run."""
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"methods:\n{methods}"
                     "tasks:\n  - {model: bert_tiny, batch_size: 4, sentence_len: 16}\n"
                     f"results: {tmp_path / 'results'}\nlogs: {tmp_path / 'logs'}\n")
    return sweep, run([sys.executable, "benchmarks.py", "--config", str(sweep), "--dry-run"],
                      timeout=300, **env)


def test_a_method_in_one_file_of_its_own_package(tmp_path, load_json):
    env = _plugin_env(tmp_path)
    # --help: the method and its option, with the default it declares.
    proc = train("--help", timeout=120, **env)
    assert proc.returncode == 0, describe(proc)
    text = " ".join(proc.stdout.split())
    from ddlbench import methods
    builtin = methods.names()   # (this process has no plugin: the built-in methods)
    assert f"{builtin[-2]}, {builtin[-1]}, pieces) or module:Class" in text
    assert "--pieces PIECES how many all-reduces the gradient is cut into [pieces] " \
        "(default: 2)" in text

    # It is in the registry (so in --method all) and verifies; its option is checked.
    proc = run([sys.executable, "-m", "ddlbench.methods", "table"], timeout=120, **env)
    assert proc.returncode == 0 and "| `pieces` |" in proc.stdout, describe(proc)
    proc = train(*TINY_BERT, "--verify", "1", "--method", "pieces", "--nworkers", "2",
                 timeout=300, **env)
    assert proc.returncode == 0, describe(proc)
    assert "pieces" in verify_lines(proc.stdout)
    assert "all methods match the reference" in proc.stdout
    proc = train(*TINY_BERT, "--method", "pieces", "--pieces", "0", timeout=120, **env)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "ddlbench: error: --pieces must be positive, got 0"

    # The sweep: its option is accepted on it and refused on the others.
    sweep, proc = _dry_run(tmp_path, env, "  - {method: pieces, pieces: 3}\n"
                                          "  - {method: wfbp, pieces: 3}\n")
    assert proc.returncode == 2
    assert "1 problem(s): method wfbp: pieces applies only to pieces" in proc.stderr
    sweep.write_text(sweep.read_text().replace("  - {method: wfbp, pieces: 3}\n", ""))
    proc = run([sys.executable, "benchmarks.py", "--config", str(sweep), "--dry-run"],
               timeout=300, **env)
    assert proc.returncode == 0, describe(proc)
    assert "--method pieces --pieces 3" in proc.stdout

    # The launchers: its defaults, and its variable turned into its flag.
    proc = run([sys.executable, "-m", "ddlbench.methods", "defaults", "pieces"], **env)
    assert proc.stdout == "pieces=2\n", describe(proc)
    # the all-to-all ids (slurm/sweep.sbatch's default methods) include it, the PS ids do not
    proc = run([sys.executable, "-m", "ddlbench.methods", "names", "--architecture", "a2a"],
               **env)
    assert proc.stdout.split() == ["wfbp", "fusion", "bspa2a", "bytescheduler", "ddp",
                                   "fsdp2", "fsdp2_hsdp", "ddp_zero1", "hier", "mgwfbp",
                                   "localsgd", "diloco", "ddp_localsgd", "zero", "hsdp",
                                   "pieces"], describe(proc)
    proc = run([sys.executable, "-m", "ddlbench.methods", "names", "--architecture", "ps"],
               **env)
    assert proc.stdout.split() == ["bspps", "wfbpps", "byteschedulerps",
                                   "byteschedulerps-worker"], describe(proc)
    out = tmp_path / "rec.json"
    proc = run(["bash", f"{REPO}/horovod/horovod_mpi_cj.sh"], timeout=300, nworkers="2",
               method="pieces", pieces="4", dnn="bert_tiny", bs="4", senlen="16", iters="1",
               extra_args=f"--num-warmup-batches 1 --num-batches-per-iter 1 --output {out}",
               **env)
    assert proc.returncode == 0, describe(proc)
    assert "--method pieces --pieces 4 --compressor none" in proc.stderr
    rec = load_json(out)
    assert rec["config"]["pieces"] == 4 and rec["method"]["method"] == "pieces"
    assert rec["method"]["buckets"] == _expected_buckets(4)


def _expected_buckets(pieces):
    """Buckets of bert_tiny's gradient in backward order at a threshold of 1/pieces of it."""
    import models
    from ddlbench.planning import plan_buckets
    sizes = [p.numel() * 4 for p in models.build("bert_tiny", sentence_len=16).model.parameters()]
    return len(plan_buckets(sizes[::-1], sum(sizes) / pieces))


def test_the_design_example_plugin_is_run_checked_and_predicted_with_its_own_option(tmp_path):
    """DESIGN's FusionMB (a BucketedAllReduce whose fusion_threshold reads its own option
    fusion_mb) from a package outside ddlbench: in the table and --method all, verified on 3
    workers, accepted by the sweep's checks, in predict --help, and predicted with its option:
    the model packs its buckets by the plugin's own fusion_threshold."""
    env = _plugin_env(tmp_path, "fusionmb", _design_example())
    assert not os.path.exists(os.path.join(REPO, "ddlbench", "methods", "fusionmb.py"))
    proc = run([sys.executable, "-m", "ddlbench.methods", "table"], timeout=120, **env)
    assert proc.returncode == 0, describe(proc)
    assert "| `fusionmb` | Fusion-MB-A2A | a2a | `--fusion-mb` (25) | all |" in proc.stdout
    proc = run([sys.executable, "-m", "ddlbench.methods", "names"], **env)
    assert proc.stdout.split()[-1] == "fusionmb", describe(proc)

    # --verify 3 on 3 workers, its threshold cutting bert_tiny's gradient into several buckets
    proc = train(*TINY_BERT, "--verify", "3", "--method", "fusionmb", "--fusion-mb", "0.05",
                 "--nworkers", "3", timeout=300, **env)
    assert proc.returncode == 0, describe(proc)
    assert "fusionmb" in verify_lines(proc.stdout)
    assert "all methods match the reference" in proc.stdout

    # the sweep's checks take its option on it
    _, proc = _dry_run(tmp_path, env, "  - {method: fusionmb, fusion_mb: 0.5}\n")
    assert proc.returncode == 0, describe(proc)
    assert "--method fusionmb --fusion-mb 0.5" in proc.stdout

    # the model: its flag in predict --help, and its option honoured. The profile's gradient
    # (backward order: 4 KiB, 1 MiB, 64 KiB, 4 MiB) is one bucket at the default 25 MiB and
    # two at 4 MiB (the first three together, the 4 MiB tensor alone), as the method packs it.
    predict = [sys.executable, "-m", "ddlbench.model.predict"]
    proc = run([*predict, "--help"], timeout=120, **env)
    assert proc.returncode == 0, describe(proc)
    assert "--fusion-mb FUSION_MB fusion threshold in MiB [fusionmb]" in \
        " ".join(proc.stdout.split())
    path, prof = _profile(tmp_path)
    sizes = [t["bytes"] for t in prof["tensors"]]
    assert [len(plan_buckets(sizes, mb * 2 ** 20)) for mb in (25, 4)] == [1, 2]
    out = tmp_path / "pred.json"
    for args, messages in (([], 1), (["--method", "fusionmb", "--fusion-mb", "4"], 2)):
        proc = run([*predict, "--profile", str(path), *args, "--output", str(out)], **env)
        assert proc.returncode == 0, describe(proc)
        got = {p["method"]: p for p in json.loads(out.read_text())["predictions"]}
        assert got["fusionmb"]["messages"] == messages, got["fusionmb"]
        assert got["fusionmb"]["message_bytes"] == (
            [sum(sizes)] if messages == 1 else [sum(sizes[:3]), sizes[3]])


def test_a_plugin_overriding_the_old_threshold_hook_is_one_line(tmp_path):
    """A bucketed method overriding ``_threshold(self)`` (which neither the method nor the
    model reads since the threshold became the classmethod ``fusion_threshold``) is refused
    when the registry loads it: one line naming what to override, exit 2."""
    old = PLUGIN.replace("    @classmethod\n    def fusion_threshold(cls, options, nbytes):\n"
                         "        return sum(nbytes) / options.pieces\n",
                         "    def _threshold(self):\n        return 1.0\n")
    assert old != PLUGIN
    proc = run([sys.executable, "-m", "ddlbench.methods", "table"], timeout=120,
               **_plugin_env(tmp_path, "pieces", old))
    assert proc.returncode == 2 and proc.stdout == "", describe(proc)
    assert proc.stderr == ("ddlbench: error: DDLBENCH_METHODS: cannot import 'myplugins.pieces': "
                           "TypeError: Pieces overrides _threshold(self), which is gone: override "
                           "the classmethod fusion_threshold(cls, options, nbytes) instead (the "
                           "method and the performance model both read it)\n")
