#!/usr/bin/env python3
"""An unmodified Horovod job under libsquall-preload.so.

For 2 and 4 ranks, trains horovod_train.py without the interposer and with it,
and checks: every rank's report shows the gradients compressed (and fewer bytes
sent than at full precision), the final accuracy is within 0.5 points of the
uncompressed run, and the ranks' parameters are identical.

Then the loss at equal steps, which accuracy after annealing hides: 400 steps
at a constant learning rate, Horovod at its defaults (tensor fusion on, so the
cut of each step into calls changes with timing), uncompressed once (it is the
same every run), interposed --repeats times and once per tensor
(HOROVOD_FUSION_THRESHOLD=0). The mean loss of the last 50 steps must be
within 3% of uncompressed and within 1% of the per-tensor run, and the
interposed repeats within 1% of each other.
Installs Horovod 0.28.1 (PyTorch, MPI controller) into /usr/bin/python3 when
missing; skips (exit 77) with the reason when that is impossible.
  horovod_test.py LIB [--np 2,4] [--epochs 4] [--repeats 3] [--steps 400] [--lr 0.05]
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import preload_run  # noqa: E402

PYTHON = "/usr/bin/python3"
HERE = pathlib.Path(__file__).parent


def have_horovod():
    code = "import horovod.torch as h; assert h.mpi_built()"
    return subprocess.run([PYTHON, "-c", code], capture_output=True).returncode == 0


def install_horovod():
    env = dict(os.environ, HOROVOD_WITH_PYTORCH="1", HOROVOD_WITH_MPI="1",
               HOROVOD_WITHOUT_TENSORFLOW="1", HOROVOD_WITHOUT_MXNET="1",
               HOROVOD_WITHOUT_GLOO="1", HOROVOD_CPU_OPERATIONS="MPI", MAKEFLAGS="-j2")
    print("installing horovod==0.28.1 (builds from source, several minutes)", flush=True)
    r = subprocess.run([PYTHON, "-m", "pip", "install", "--no-cache-dir",
                        "--break-system-packages", "horovod==0.28.1"], env=env,
                       capture_output=True, text=True, timeout=1200)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
    return have_horovod()


def train(np, lib, epochs, workdir, env, steps=0, lr=0.02):
    out = pathlib.Path(workdir) / f"result-{np}-{'on' if lib else 'off'}.json"
    schedule = "constant" if steps else "cosine"
    reports, _ = preload_run.run(np, lib, env, [PYTHON, str(HERE / "horovod_train.py"), str(out),
                                                str(epochs), "256", str(steps), schedule, str(lr)],
                                 timeout=600, report_dir=workdir)
    return json.loads(out.read_text()), reports


def loss_checks(np, lib, env, a):
    """The loss at equal steps under fusion (see the module docstring)."""
    def run(lib_or_none, extra):
        with tempfile.TemporaryDirectory() as d:
            result, reports = train(np, lib_or_none, 1, d, dict(env, **extra), a.steps, a.lr)
        return result["loss_last50"], reports
    base, _ = run(None, {})
    fused = [run(lib, {}) for _ in range(a.repeats)]
    alone, _ = run(lib, {"HOROVOD_FUSION_THRESHOLD": "0"})
    losses = [loss for loss, _ in fused]
    recut = [reports[0]["calls_recut"] for _, reports in fused]
    kept = [reports[0]["elements_kept_full"] for _, reports in fused]
    spread = (max(losses) - min(losses)) / min(losses)
    print(f"np={np} loss of the last 50 of {a.steps} steps (lr {a.lr}): uncompressed {base:.5f}, "
          f"interposed {' '.join(f'{x:.5f}' for x in losses)} (spread {100 * spread:.2f}%, "
          f"recut calls {recut}, elements kept at full precision {kept}), per tensor {alone:.5f}")
    failed = []
    for loss in losses:
        if abs(loss - base) / base > 0.03:
            failed.append(f"np={np}: interposed loss {loss:.5f} is more than 3% from "
                          f"uncompressed {base:.5f}")
        if abs(loss - alone) / alone > 0.01:
            failed.append(f"np={np}: interposed loss {loss:.5f} is more than 1% from its "
                          f"per-tensor run {alone:.5f}")
    if spread > 0.01:
        failed.append(f"np={np}: interposed losses spread {100 * spread:.2f}% over "
                      f"{a.repeats} repeats, more than 1%")
    return failed


def main():
    p = argparse.ArgumentParser()
    p.add_argument("lib")
    p.add_argument("--np", default="2,4")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--lr", type=float, default=0.05)
    a = p.parse_args()
    if not pathlib.Path(PYTHON).exists():
        print(f"SKIP: {PYTHON} not found")
        return 77
    if not have_horovod() and not install_horovod():
        print("SKIP: Horovod with PyTorch and MPI is not installed and could not be built "
              "(needs libtorch-dev, pybind11-dev, python3-cloudpickle, cmake; scripts/setup.sh)")
        return 77
    env = {"SQUALL_PRELOAD_MIN_BYTES": "4096", "OMP_NUM_THREADS": "1"}
    failed = []
    for np in [int(x) for x in a.np.split(",")]:
        with tempfile.TemporaryDirectory() as d:
            base, _ = train(np, None, a.epochs, d, env)
            mine, reports = train(np, a.lib, a.epochs, d, env)
        brief = lambda r: {k: v for k, v in r.items() if k != "losses"}  # noqa: E731
        print(f"np={np} uncompressed: {brief(base)}")
        print(f"np={np} interposed:   {brief(mine)}")
        for r, rep in enumerate(reports):
            print(f"np={np} rank {r} report: {json.dumps(rep, sort_keys=True)}")
            if rep["calls_compressed"] < mine["steps"] // 2:
                failed.append(f"np={np} rank {r}: only {rep['calls_compressed']} calls compressed "
                              f"in {mine['steps']} steps")
            if not rep["bytes_sent"] < rep["bytes_full_precision"]:
                failed.append(f"np={np} rank {r}: sent {rep['bytes_sent']} bytes, not fewer than "
                              f"{rep['bytes_full_precision']}")
        if abs(mine["accuracy"] - base["accuracy"]) > 0.5:
            failed.append(f"np={np}: accuracy {mine['accuracy']:.2f} vs {base['accuracy']:.2f} "
                          "uncompressed, more than 0.5 points apart")
        if not (mine["identical"] and base["identical"]):
            failed.append(f"np={np}: ranks' parameters differ (interposed: {mine['identical']})")
        if a.repeats > 0:
            failed += loss_checks(np, a.lib, env, a)
    for f in failed:
        print("FAILED:", f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
