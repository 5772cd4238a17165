"""The model's median |error| on the cells of 4 workers as 2 emulated machines x 2 slots at 1 Gbit/s.

The measured figures are the means of docs/RESULTS.md's runs (entries "today's methods on 2
emulated machines": 18 cells; "zero at 8 MiB buckets and in two levels": 14 cells); each cell is
predicted from docs/predictions/' profiles and topology by ``ddlbench.model.predict``, in-process
(fast, no CPU load). ``--set-interference KAPPA,MU`` predicts with the profiles' interference
pair replaced (a sensitivity check, not a fit); other arguments go to predict as they are
(``--no-interference``). Run: ``PYTHONPATH=. .venv/bin/python scripts/model_error_2x2.py``."""
import contextlib, io, json, os, statistics, sys, tempfile
from ddlbench.model import predict

P = "docs/predictions"
PROF = {"r18": f"{P}/today-profile-resnet18-64px-bs16-4w.json",
        "bt": f"{P}/today-profile-bert-tiny-bs8-4w.json"}
TOPO = f"{P}/emulated-2x2-1gbit.yaml"
M9 = "zero,fsdp2,ddp,hier,fusion,localsgd,hsdp,diloco,ddp_zero1"
# today's methods on 2 emulated machines: the means of the runs
TODAY = {"r18": [45.6, 40.7, 65.5, 59.9, 58.4, 104.2, 58.5, 98.0, 37.2],
         "bt": [30.9, 26.1, 30.0, 31.2, 29.6, 35.0, 30.8, 34.5, 24.9]}
def mean(*x): return sum(x) / len(x)
# zero at 8 MiB buckets and in two levels: (label, methods, extra flags, measured mean)
T8 = ["--threshold", "8388608"]
TL = ["--rs-carrier", "two-level", "--ag-carrier", "two-level"]
ZERO8 = {"r18": [("zero a2a 64MiB", "zero", [], mean(40.3, 41.3)),
                 ("zero a2a 8MiB", "zero", T8, mean(69.0, 63.6)),
                 ("zero 2-level 8MiB", "zero", T8 + TL, mean(43.9, 62.7)),
                 ("hier 8MiB", "hier", T8, mean(60.6, 63.6)),      # hier/fusion: A, B
                 ("fusion 8MiB", "fusion", T8, mean(64.4, 67.4)),
                 ("fsdp2", "fsdp2", T8, mean(35.9, 37.7, 38.2, 38.6, 34.3, 37.7)),
                 ("ddp", "ddp", T8, mean(58.5, 60.9, 58.3, 58.7, 58.1, 60.8))],
         "bt": [("zero a2a 64MiB", "zero", [], mean(29.4, 29.0)),
                ("zero a2a 8MiB", "zero", T8, mean(28.8, 29.3)),
                ("zero 2-level 8MiB", "zero", T8 + TL, mean(29.6, 31.4)),
                ("hier 8MiB", "hier", T8, mean(32.2, 29.6)),
                ("fusion 8MiB", "fusion", T8, mean(28.8, 29.1)),
                ("fsdp2", "fsdp2", T8, mean(24.0, 24.2, 23.7, 23.9, 23.2, 26.9)),
                ("ddp", "ddp", T8, mean(29.0, 28.2, 27.7, 29.7, 27.7, 28.4))]}


def run(model, methods, extra=(), more=()):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "p.json")
        argv = ["--profile", PROF[model], "--topology", TOPO, "--nworkers", "4",
                "--method", methods, "--output", out, *extra, *more]
        with contextlib.redirect_stdout(io.StringIO()):
            assert predict.main(argv) == 0
        data = json.load(open(out))
    bs = {"r18": 16, "bt": 8}[model]
    return [4 * bs / p["iteration_s"] for p in data["predictions"]]


def main(more=()):
    for name, rows in (("today (18)", [(m, meth, [], meas) for m in ("r18", "bt")
                                       for meth, meas in zip(M9.split(","), TODAY[m])]),
                       ("zero 8 MiB (14)", [(m, *r[1:]) for m in ("r18", "bt") for r in ZERO8[m]])):
        errs = []
        for model, meth, extra, meas in rows:
            pred = run(model, meth, extra, more)[0]
            e = 100 * (pred / meas - 1)
            errs.append(e)
            print(f"  {model:4s} {meth:8s} {' '.join(extra):40s} pred {pred:6.1f} meas {meas:6.1f} {e:+6.1f}%")
        print(f"{name}: median |error| {statistics.median(abs(e) for e in errs):.1f}%  "
              f"signed median {statistics.median(errs):+.1f}%")


def _with_pair(kappa: float, mu: float, folder: str) -> None:
    """Point PROF at copies of the profiles whose interference pair is (kappa, mu)."""
    for key, path in list(PROF.items()):
        d = json.load(open(path))
        d["interference"].update(compute_slowdown=kappa, comm_slowdown=mu,
                                 per_rank=[[kappa, mu]] * len(d["interference"]["per_rank"]))
        PROF[key] = os.path.join(folder, os.path.basename(path))
        json.dump(d, open(PROF[key], "w"))


if __name__ == "__main__":
    args = sys.argv[1:]
    with tempfile.TemporaryDirectory() as folder:
        if "--set-interference" in args:
            i = args.index("--set-interference")
            _with_pair(*map(float, args[i + 1].split(",")), folder)
            del args[i:i + 2]
        main(args)
