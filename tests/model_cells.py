"""The performance model's figures on a fixed table of cells (tests/test_model_cells.py compares
them with tests/data/model_cells.json, written by the model before the issue-43 refactor):
``python -m tests.model_cells`` rewrites the file (only when a change is meant to move them)."""
import contextlib
import io
import json
import os
import tempfile

from .conftest import REPO

DATA = os.path.join(REPO, "tests", "data", "model_cells.json")
PROFILES = ("h200_resnet50_bs64", "h200_bert_bs8", "h200_bert_base_bs64")
# (network, worker counts, compressors): a topology with servers, the survey's slowest network
RUNS = (("cloud-25g", "1,8,32", ("none", "fp16", "topk", "powersgd")),
        ("survey-10gbe", "4,16", ("none", "efsignum_scaled")))


def _predictions(profile: str, network: str, counts: str, compressor: str,
                 advise: bool) -> list:
    from ddlbench.model import predict
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "p.json")
        argv = ["--profile", os.path.join(REPO, "configs", "profiles", f"{profile}.json"),
                "--topology", network, "--nworkers", counts, "--compressor", compressor,
                "--issue-us", "30", "--output", out]
        if advise:
            argv.append("--advise")
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert predict.main(argv) == 0, argv
        data = json.load(open(out))
    return data


def _rows(data) -> list:
    """(method, nworkers, iteration_s) or, for --advise, the ranking, from predict's JSON."""
    rows = []
    for p in data.get("predictions", []):
        rows.append([p["method"], p["nworkers"], p["iteration_s"], p["message_bytes"],
                     p["metrics"]["exposed_s"], p["bottleneck"]])
    for a in data.get("advice", []):
        rows.append(["advice", a["nworkers"],
                     [[r["method"], r["iteration_s"], r["settings"], r["speedup_vs_ddp"]]
                      for r in a["advice"]]])
    return rows


def cells() -> dict:
    """Every figure the table holds, by a key naming its cell."""
    from ddlbench.model import validation
    out = {}
    for source in validation.SOURCES:
        v = validation.validate(source, intervals=False)   # the points (issue 62: faster)
        out[f"survey/{source}"] = sorted(
            [r["model"], r["rdma"], r["method"], r["nworkers"], r["iteration_s"]]
            for r in v["rows"])
        out[f"survey/{source}/findings"] = [
            [f["id"], f["passed"], f["detail"]]
            for kind in ("predicted", "published") for f in v["findings"][kind]]
    for profile in PROFILES:
        for network, counts, compressors in RUNS:
            for compressor in compressors:
                data = _predictions(profile, network, counts, compressor, advise=False)
                out[f"predict/{profile}/{network}/{compressor}"] = _rows(data)
        data = _predictions(profile, "cloud-25g", "8", "none", advise=True)
        out[f"advise/{profile}/cloud-25g"] = _rows(data)
    return out


if __name__ == "__main__":
    with open(DATA, "w") as f:
        json.dump(cells(), f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {DATA}")
