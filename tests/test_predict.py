"""python -m ddlbench.predict: a profile file in, each method's predicted iteration out (the
replay itself: tests/test_simulate.py)."""
import json
import subprocess
import sys

import pytest

from ddlbench import predict, simulate, timeline
from ddlbench.measure.profile_file import PROFILE_FORMAT, PROFILE_VERSION

from .conftest import REPO


def _profile(tmp_path, **change):
    prof = {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "model": "hand-made",
            "workload": {"batch_size": 8, "image_size": 32},
            "tensors": [{"name": f"layer{i}.weight", "shape": [n // 4], "bytes": n}
                        for i, n in enumerate([4096, 1 << 20, 65536, 4 << 20])],
            "backward_s": [0.002, 0.004, 0.001, 0.006], "forward_s": 0.01,
            "alpha_s": 1e-3, "beta_s_per_byte": 1e-9, "nworkers": 2, "backend": "gloo",
            "device": "cpu", "network": "local", **change}
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(prof))
    return path, prof


def test_predictions_are_the_simulators_and_traces_read_back(tmp_path, capsys):
    path, prof = _profile(tmp_path)
    out, traces = tmp_path / "pred.json", tmp_path / "traces"
    assert predict.main(["--profile", str(path), "--optimizer-ms", "2", "--threshold",
                         "1200000", "--output", str(out), "--traces", str(traces)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Predicted: hand-made, batch 8 per worker, 2 worker(s)")
    assert lines[1].split()[:3] == ["method", "messages", "iteration"]
    got = json.loads(out.read_text())
    assert [p["method"] for p in got["predictions"]] == list(simulate.METHODS)
    work = predict.workload_of(prof, 0.002)
    link = simulate.Link(1e-3, 1e-9)
    for p, line in zip(got["predictions"], lines[2:]):
        expected = simulate.predict(p["method"], work, link, threshold=1200000,
                                    min_group_bytes=8192 * 4)
        assert p["message_bytes"] == expected.message_bytes
        assert p["iteration_s"] == expected.iteration_s and p["bottleneck"] == expected.bottleneck
        assert p["throughput"] == pytest.approx(8 * 2 / expected.iteration_s)
        assert line.split()[:3] == [p["method"], str(len(expected.message_bytes)),
                                    f"{expected.iteration_s * 1e3:.2f}"]
        back = timeline.overlap(timeline.read(str(traces / f"{p['method']}.trace.json"))[0]
                                ["events"])["mean"]
        assert back["iteration_s"] == pytest.approx(p["metrics"]["iteration_s"], abs=1e-8)
    assert [p["messages"] for p in got["predictions"][:2]] == [1, 4]   # bspa2a, wfbp
    fusion = got["predictions"][2]
    # 1.2 MB: the first three tensors fit one buffer, the 4 MiB one goes alone
    assert fusion["method"] == "fusion" and \
        fusion["message_bytes"] == [4096 + (1 << 20) + 65536, 4 << 20]
    # ByteScheduler: the default 4M-element partition leaves every tensor one chunk, sent
    # front layers first
    assert got["predictions"][-1]["message_bytes"] == [4 << 20, 65536, 1 << 20, 4096]


def test_the_profiles_optimizer_step_counts_unless_given(tmp_path, capsys):
    path, _ = _profile(tmp_path, optimizer="SGD", optimizer_s=0.005)
    assert predict.main(["--profile", str(path), "--method", "bspa2a", "--alpha", "0",
                         "--beta", "0"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split()[2] == "28.00"   # 23 + 5 ms
    assert predict.main(["--profile", str(path), "--method", "bspa2a", "--alpha", "0",
                         "--beta", "0", "--optimizer-ms", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split()[2] == "24.00"


def test_another_link_and_worker_count(tmp_path, capsys):
    path, _ = _profile(tmp_path)
    assert predict.main(["--profile", str(path), "--method", "bspa2a", "--alpha", "0",
                         "--beta", "0", "--nworkers", "16", "--batch-size", "4"]) == 0
    row = capsys.readouterr().out.splitlines()[2].split()
    # no communication cost: forward + backward, 16 x 4 images per iteration
    assert row[:5] == ["bspa2a", "1", "23.00", f"{64 / 0.023:.1f}", "23.00"]
    assert row[-1] == "compute-bound"


@pytest.mark.parametrize("args,message", [
    (["--method", "magic"], "cannot predict method 'magic' yet"),
    (["--alpha", "1e-3"], "--alpha and --beta go together"),
    (["--nworkers", "0"], "--nworkers must be positive, got 0"),
    (["--profile", "/nonexistent.json"], "cannot read MG-WFBP profile /nonexistent.json"),
])
def test_bad_input_is_one_line(tmp_path, args, message):
    path, _ = _profile(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "ddlbench.predict", "--profile", str(path),
                           *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
