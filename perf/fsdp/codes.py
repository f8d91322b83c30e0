"""The code tables of docs/python.md, "Sharded models": FSDP2 (or FSDP1) on
tests/frameworks/train.py's MLP, 2 ranks over gloo, AdamW, under
squall.fsdp.compress with each code, against plain FSDP in the same run.

    SQUALL_LIBRARY=build/src/core/libsquall.so build/venv-torch/bin/python \\
        perf/fsdp/codes.py --steps 300 \\
        --codes int4:block=256,int4:block=256+none,int4:block=256+int8:block=256

A code is the reduce-scatter's, optionally +PCODE for the parameter
all-gathers (FSDP2). Prints one row per code: the mean loss of the last 50
steps over both ranks against plain FSDP's, and rank 0's bytes over the
compressed calls (reduce-scatters, all-gathers). Each run takes ~1 minute at
300 steps on 2 cores; --out keeps every run's per-step losses.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "..", "tests", "frameworks", "train.py")
ENV = {"GLOO_SOCKET_IFNAME": "lo", "SQUALL_SOCKET_IFNAME": "lo", "SQUALL_TRANSPORT": "tcp",
       "OMP_NUM_THREADS": "1"}


def run(launch, steps, out):
    os.makedirs(out, exist_ok=True)
    for attempt in range(2):  # torch 2.15's gloo aborts a finished job at exit now and then
        r = subprocess.run([sys.executable, TRAIN, launch, "adamw", str(steps), out,
                            str(random.randint(20000, 40000))], capture_output=True, text=True,
                           env=dict(os.environ, **ENV), timeout=3600)
        ranks = [os.path.join(out, f"rank{k}.json") for k in (0, 1)]
        if all(os.path.exists(f) for f in ranks):
            return [json.load(open(f)) for f in ranks]
    raise SystemExit(f"{launch} failed:\n{r.stderr[-3000:]}")


def loss(ranks):
    return sum(sum(r["losses"][-50:]) for r in ranks) / (50 * len(ranks))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--version", default="fsdp2", choices=["fsdp2", "fsdp1"])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--codes", default="none,int8,int4:block=256,int2,onebit:block=64:scale=rms,"
                    "onebit")
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temporary dir)")
    args = ap.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="fsdp-codes-")
    plain = loss(run(f"spawn-{args.version}", args.steps, os.path.join(out, "plain")))
    print(f"plain {args.version}: loss {plain:.5f} ({args.steps} steps)")
    print("| code | loss vs plain | reduce-scatter bytes | all-gather bytes |")
    print("|---|---|---|---|")
    for code in args.codes.split(","):
        name = code.replace(":", "_").replace("+", "__").replace("=", "")
        ranks = run(f"spawn-{args.version}-squall-{code}", args.steps, os.path.join(out, name))
        st = ranks[0]["fsdp"]
        gathers = st.get("all_gather", {}).get("bytes_sent")
        print(f"| {code} | {100 * (loss(ranks) / plain - 1):+.2f}% | {st['bytes_sent'] / 1e6:.2f} MB"
              f" | {'%.2f MB' % (gathers / 1e6) if gathers is not None else '(FSDP, fp32)'} |",
              flush=True)


if __name__ == "__main__":
    main()
