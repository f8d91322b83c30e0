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
AT_50 = ["adam", "slowmo_beta5", "slowmo_int2", "diloco", "streamed", "streamed_carry",
         "diloco@100"]
AT_100 = ["slowmo_beta5@100", "streamed@100"]
# In table order: beta 0 (the default from tau 100 on) beside beta 0.5 (the
# default at every period when those runs were made) at each period.
METHODS = ["slowmo_beta0", "slowmo_beta5", "slowmo_int2", "diloco", "streamed", "streamed_carry",
           "diloco@100", "slowmo_beta0@100", "slowmo_beta5@100", "streamed@100",
           "slowmo_beta0@250", "slowmo_beta5@250", "diloco@250", "slowmo_int8@250",
           "slowmo_full@250", "slowmo_beta7@250"]
# name: (tasks, seeds, steps, methods): what fit in about an hour on 2 cores, 4 ranks
PLANS = {"lm": ("charcnn,charlm", 2, 1200, AT_50), "tf": ("transformer", 1, 1000, AT_50),
         "lm100": ("charcnn,charlm", 2, 1200, AT_100), "tf100": ("transformer", 1, 1000, AT_100),
         # 40 syncs at tau 100 and at tau 250, against AdamW over the same
         # steps (seeds 0-2 and 3-4 of tau 100 in two plans).
         "long100": ("charcnn,charlm", 3, 4000, ["adam", "slowmo_beta5@100"]),
         "long100b": ("charcnn,charlm", (3, 2), 4000, ["adam", "slowmo_beta5@100"]),
         "long250": ("charcnn,charlm", 2, 10000, ["adam", "slowmo_beta5@250"]),
         # the GRU LM's seeds 2-4 at tau 250 (the family that misses)
         "long250b": ("charlm", (2, 3), 10000, ["adam", "slowmo_beta5@250"]),
         # DiLoCo's outer step over 40 syncs on the GRU LM (paired with
         # long250's and long250b's AdamW runs)
         "long250d": ("charlm", 5, 10000, ["diloco@250"]),
         # what the GRU LM's gap at tau 250 owes to the sync's code: int8
         # and full-precision syncs (paired with the same AdamW runs); seed
         # 0 only: both ended further from AdamW than int4 on that seed, so
         # the code is not where the gap comes from
         "long250e": ("charlm", 1, 10000, ["slowmo_int8@250", "slowmo_full@250"]),
         # the GRU LM at tau 250 with no outer momentum and with more (beta 0
         # and 0.7 against the default 0.5), seed 0
         "long250f": ("charlm", 1, 10000, ["slowmo_beta0@250", "slowmo_beta7@250"]),
         # beta 0 on the GRU LM's other seeds
         "long250g": ("charlm", (1, 4), 10000, ["slowmo_beta0@250"]),
         # the transformer over 40 syncs at tau 100
         "tflong100": ("transformer", 5, 4000, ["adam", "slowmo_beta5@100"]),
         # the conv LM's seeds 2-4 at tau 250
         "long250c": ("charcnn", (2, 3), 10000, ["adam", "slowmo_beta5@250"]),
         # the larger transformer (on the code text) over 40 syncs at tau 50
         "tflarge50": ("transformer_large", 3, 2000, ["adam", "slowmo_beta5"]),
         # the conv and GRU LMs over 40 syncs at tau 50
         "long50": ("charcnn,charlm", 5, 2000, ["adam", "slowmo_beta5"]),
         # no outer momentum (beta 0) on the other families and periods,
         # each paired with the AdamW runs of the plans above
         "long250h": ("charcnn", 5, 10000, ["slowmo_beta0@250"]),
         "long100c": ("charcnn,charlm", 5, 4000, ["slowmo_beta0@100"]),
         "long50b": ("charcnn,charlm", 5, 2000, ["slowmo_beta0"]),
         "tflong100b": ("transformer", 5, 4000, ["slowmo_beta0@100"]),
         # the GRU LM at tau 100 over as many steps as at tau 250 (100 syncs;
         # paired with long250's and long250b's AdamW runs)
         "long100d": ("charlm", 5, 10000, ["slowmo_beta0@100"]),
         # the larger transformer over 40 syncs at tau 100 with the default
         # there (beta 0), against AdamW over the same steps
         "tflarge100": ("transformer_large", 3, 4000, ["adam", "slowmo_beta0@100"])}
# The plans whose runs are as long as the others (the table's first block).
SHORT = ("lm", "tf", "lm100", "tf100")


def run(args):
    env = dict(os.environ)
    for name, (tasks, seeds, steps, methods) in PLANS.items():
        if args.plans and name not in args.plans.split(","):
            continue
        out = os.path.join(args.out, name)
        first, seeds = seeds if isinstance(seeds, tuple) else (0, seeds)
        subprocess.run([sys.executable, STUDY, "--world", str(args.world), "--tasks", tasks,
                        "--methods", ",".join(methods), "--seeds", str(seeds),
                        "--first-seed", str(first),
                        "--steps", str(steps), "--tau", "50", "--fragments", "4", "--delay", "2",
                        "--eval-every", "100", "--out", out], check=True, env=env)


def rows(runs, steps_column):
    """Table rows of one block of runs: each method paired seed by seed with
    AdamW of the same task (and, in a block of several lengths, the same
    number of steps)."""
    lines = []
    for task in sorted({r["task"] for r in runs}):
        adam = {(r["seed"], r["steps"]): r for r in runs
                if r["task"] == task and r["method"] == "adam"}
        for m in METHODS:
            rs = [r for r in runs if r["task"] == task and r["method"] == m and
                  (r["seed"], r["steps"]) in adam]
            for steps in sorted({r["steps"] for r in rs}):
                at = [r for r in rs if r["steps"] == steps]
                base = [adam[(r["seed"], steps)] for r in at]
                loss = [100 * (r["evals"][-1]["val_loss"] / b["evals"][-1]["val_loss"] - 1)
                        for r, b in zip(at, base)]
                acc = [r["evals"][-1]["val_acc"] - b["evals"][-1]["val_acc"]
                       for r, b in zip(at, base)]
                ratio = [statistics.mean(b["bytes_per_rank_final"]) /
                         statistics.mean(r["bytes_per_rank_final"]) for r, b in zip(at, base)]
                extra = f" {steps} |" if steps_column else ""
                lines.append(f"| {task} | {m} |{extra} {len(at)} | {statistics.mean(loss):+.2f}% "
                             f"[{max(loss):+.2f}%] | {statistics.mean(acc):+.2f} "
                             f"[{min(acc):+.2f}] | {statistics.mean(ratio):.0f}x |")
    return lines


def table(args):
    blocks = {True: [], False: []}  # short plans, long ones
    for name in PLANS:
        path = os.path.join(args.out, name, "results.json")
        if os.path.exists(path):
            with open(path) as f:
                for r in json.load(f)["runs"]:
                    r["steps"] = PLANS[name][2]
                    blocks[name in SHORT].append(r)
    lines = ["| family | method | seeds | loss vs AdamW | accuracy vs AdamW | AdamW bytes / "
             "method bytes |", "|---|---|---|---|---|---|"]
    lines += rows(blocks[True], False)
    if blocks[False]:
        lines += ["", "Longer runs (40 syncs: 2000 steps at tau 50, 4000 at tau 100, 10000 at "
                  "tau 250), paired with AdamW over the same steps:",
                  "", "| family | method | steps | seeds | loss vs AdamW | accuracy vs AdamW | "
                  "AdamW bytes / method bytes |", "|---|---|---|---|---|---|---|"]
        lines += rows(blocks[False], True)
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
    ap.add_argument("--plans", default="",
                    help=f"run only these plans (comma-separated, of {', '.join(PLANS)})")
    ap.add_argument("--doc", action="store_true",
                    help="also put the table into docs/convergence.md (between its markers)")
    args = ap.parse_args()
    if args.what == "run":
        run(args)
    table(args)


if __name__ == "__main__":
    main()
