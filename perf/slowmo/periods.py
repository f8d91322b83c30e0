#!/usr/bin/env python3
"""SlowMo at long periods and streamed: the convergence study's LM families
under SlowMo's defaults, int2 syncs, DiLoCo's outer step and streaming, at
tau 50 and 100, paired seed by seed against data-parallel AdamW (the same
init, data order and LR schedule; perf/convergence/run_study.py runs them).

    perf/slowmo/periods.py run --out perf/results/slowmo-periods     # the runs
    perf/slowmo/periods.py table --out perf/results/slowmo-periods   # OUT/table.md
    perf/slowmo/periods.py table --doc    # also into docs/convergence.md

Per family and method: held-out loss at the last step against AdamW's, in
percent (mean over seeds, worst seed in brackets), next-character accuracy
in points, and AdamW's bytes over the method's (each rank's bytes as the
library counted them, mean over ranks).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from benchlib.common import write_between_markers  # noqa: E402
STUDY = os.path.join(HERE, "..", "convergence", "run_study.py")
DOC = os.path.join(HERE, "..", "..", "docs", "convergence.md")
BEGIN = "<!-- slowmo-periods:begin (perf/slowmo/periods.py table --doc writes this) -->"
END = "<!-- slowmo-periods:end -->"
AT_50 = ["adam", "slowmo_default", "slowmo_int2", "diloco", "streamed", "streamed_carry",
         "diloco@100"]
AT_100 = ["slowmo_default@100", "streamed@100"]
METHODS = [m for m in AT_50 + AT_100 if m != "adam"]
# name: (tasks, seeds, steps, methods): what fit in about an hour on 2 cores, 4 ranks
PLANS = {"lm": ("charcnn,charlm", 2, 1200, AT_50), "tf": ("transformer", 1, 1000, AT_50),
         "lm100": ("charcnn,charlm", 2, 1200, AT_100), "tf100": ("transformer", 1, 1000, AT_100)}


def run(args):
    env = dict(os.environ)
    for name, (tasks, seeds, steps, methods) in PLANS.items():
        out = os.path.join(args.out, name)
        subprocess.run([sys.executable, STUDY, "--world", str(args.world), "--tasks", tasks,
                        "--methods", ",".join(methods), "--seeds", str(seeds),
                        "--steps", str(steps), "--tau", "50", "--fragments", "4", "--delay", "2",
                        "--eval-every", "100", "--out", out], check=True, env=env)


def table(args):
    runs = []
    for name in PLANS:
        path = os.path.join(args.out, name, "results.json")
        if os.path.exists(path):
            with open(path) as f:
                runs += json.load(f)["runs"]
    lines = ["| family | method | seeds | loss vs AdamW | accuracy vs AdamW | AdamW bytes / "
             "method bytes |", "|---|---|---|---|---|---|"]
    for task in sorted({r["task"] for r in runs}):
        adam = {r["seed"]: r for r in runs if r["task"] == task and r["method"] == "adam"}
        for m in METHODS:
            rs = [r for r in runs if r["task"] == task and r["method"] == m and r["seed"] in adam]
            if not rs:
                continue
            loss = [100 * (r["evals"][-1]["val_loss"] / adam[r["seed"]]["evals"][-1]["val_loss"]
                           - 1) for r in rs]
            acc = [r["evals"][-1]["val_acc"] - adam[r["seed"]]["evals"][-1]["val_acc"] for r in rs]
            ratio = [statistics.mean(adam[r["seed"]]["bytes_per_rank_final"]) /
                     statistics.mean(r["bytes_per_rank_final"]) for r in rs]
            lines.append(f"| {task} | {m} | {len(rs)} | {statistics.mean(loss):+.2f}% "
                         f"[{max(loss):+.2f}%] | {statistics.mean(acc):+.2f} [{min(acc):+.2f}] | "
                         f"{statistics.mean(ratio):.0f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text)
    if args.doc:
        write_between_markers(DOC, BEGIN, END, text)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["run", "table"])
    ap.add_argument("--out", default=os.path.join(HERE, "..", "results", "slowmo-periods"))
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--doc", action="store_true",
                    help="also put the table into docs/convergence.md (between its markers)")
    args = ap.parse_args()
    if args.what == "run":
        run(args)
    table(args)


if __name__ == "__main__":
    main()
