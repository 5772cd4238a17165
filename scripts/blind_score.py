"""Score the blind test's committed predictions against its answers (configs/reference/blind_ddp/):

    python scripts/blind_score.py

Per cell: the predicted and the published throughput (samples/s over all GPUs: the p75 figure,
ex/sec per GPU x GPUs) and the error; per worker count (a group: the bucket sizes its methods),
the best-method score (``ddlbench.model.score``)."""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ddlbench import yamlfile  # noqa: E402
from ddlbench.model import score  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "reference",
                    "blind_ddp")


def predicted(bucket: int) -> dict:
    """workers -> predicted samples/s over all GPUs, from the committed predictions file."""
    with open(os.path.join(HERE, f"predictions_bucket{bucket}.json")) as f:
        doc = json.load(f)
    return {p["nworkers"]: p["throughput"] for p in doc["predictions"] if p["method"] == "ddp"}


def main() -> int:
    answers = yamlfile.load(os.path.join(HERE, "answers.yaml"), "blind answers")["cells"]
    rows = []
    for a in answers:
        pred = predicted(a["bucket_cap_mb"])[a["gpus"]]
        pub = a["p75"]["ex_per_sec"] * a["gpus"]
        rows.append({"group": f"P={a['gpus']}", "method": f"bucket {a['bucket_cap_mb']} MB",
                     "predicted": pred, "measured": pub, "error": (pred - pub) / pub})
    for r in rows:
        print(f"{r['group']:5} {r['method']:13} predicted {r['predicted']:8.1f} published "
              f"{r['measured']:6.0f} error {100 * r['error']:+.1f}%")
    print(f"median |error| {100 * statistics.median(abs(r['error']) for r in rows):.1f}% over "
          f"{len(rows)} cells")
    print(score.headline(score.best_method(score.grouped(rows, lambda r: r["group"])),
                         "published"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
