"""A stand-in for ``python -m ddlbench.measure.profiler`` in the pace-probe tests (calibrate.PROFILER).

Takes the profiler's flags, imports no torch, and writes (``--output``) the profile named by
FAKE_PROFILE with every compute time times a factor: FAKE_PACE is a JSON object from a part of
the output file's name to its factor, or to "fail" (exit 1, no file). A name no key matches
gets factor 1.
"""
import argparse
import json
import os
import sys


def factor_for(variable: str, output: str):
    """The factor (or "fail") the JSON object in ``variable`` gives the first of its keys that
    is part of ``output``'s file name; 1 where none is. A list gives its first item to the
    first run writing that file, the next to the next (counted in FAKE_CALLS, a folder)."""
    name = os.path.basename(output)
    value = next((v for k, v in json.loads(os.environ.get(variable, "{}")).items()
                  if k in name), 1.0)
    if isinstance(value, list):
        count = os.path.join(os.environ["FAKE_CALLS"], name)
        n = int(open(count).read()) if os.path.exists(count) else 0
        with open(count, "w") as f:
            f.write(str(n + 1))
        value = value[n]
    return value


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--output", required=True)
    args, _ = ap.parse_known_args()
    factor = factor_for("FAKE_PACE", args.output)
    if factor == "fail":
        print("RuntimeError: the fake profiler was told to fail", file=sys.stderr)
        return 1
    with open(os.environ["FAKE_PROFILE"]) as f:
        prof = json.load(f)
    prof["forward_s"] *= factor
    prof["backward_s"] = [x * factor for x in prof["backward_s"]]
    prof["optimizer_s"] = (prof.get("optimizer_s") or 0.0) * factor
    if prof.get("forward_tensor_s"):
        prof["forward_tensor_s"] = [x * factor for x in prof["forward_tensor_s"]]
    with open(args.output, "w") as f:
        json.dump(prof, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
