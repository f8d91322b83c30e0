"""squall advise: the prediction model, the measurement over a communicator
(identical figures on every rank) and the CLI."""

import math
import os
import subprocess
import sys
import tempfile

import _dist
import squall
from squall import advise

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RATES = {m: (1e9, 1e9) for m in advise.METHODS[1:]}  # 1 G elements/s both ways


def test_prediction_model():
    p, n = 10_000_000, 4
    pred = advise.predict(p, 0.05, n, 50e-6, 125e6, RATES)  # 1 Gbit/s
    step, comm_s, algo = pred["fp32"]
    assert algo == "ring"
    assert math.isclose(comm_s, 6 * 50e-6 + 1.5 * 4 * p / 125e6)
    assert math.isclose(step, 0.05 + comm_s)
    # onebit sends ~1/32 of the bytes and pays the codec time
    e = squall.codec.encoded_size("onebit", p)
    assert math.isclose(pred["onebit"][1], 6 * 50e-6 + max(1.5 * e / 125e6, (1.25 + 2) * p / 1e9))
    # codec-bound at these rates, onebit and int2 tie; a tie goes to more bits
    assert math.isclose(pred["int2"][0], pred["onebit"][0])
    assert min(advise.METHODS, key=lambda m: pred[m][0]) == "int2"
    # on a link 1000x faster the codec time dominates: full precision wins
    fast = advise.predict(p, 0.05, n, 5e-6, 125e9, RATES)
    assert min(fast, key=lambda m: fast[m][0]) == "fp32"
    # one rank communicates nothing
    assert all(v[1] == 0 for v in advise.predict(p, 0.05, 1, 0, math.inf, RATES).values())


def _advise_worker(rank, world):
    comm = squall.init()
    os.environ.pop("SQUALL_NET_MBPS", None)
    result = advise.advise(comm, params=2_000_000, compute_s=0.01, repeats=2)
    result["env"] = os.environ.get("SQUALL_NET_MBPS")
    result["report"] = advise.format_report(result)
    result["measured"] = advise.measure_steps(comm, 200_000, 0.0, steps=1)
    return result


def test_advise_over_a_communicator():
    a, b = _dist.run(_advise_worker, world=2, timeout=120)
    for key in ("latency_s", "bandwidth_Bps", "winner", "settings", "predictions"):
        assert a[key] == b[key], key  # every rank decides the same
    assert a["latency_s"] > 0 and a["bandwidth_Bps"] > 0
    assert a["winner"] == min(advise.METHODS, key=lambda m: a["predictions"][m][0])
    assert a["env"] == a["settings"]["SQUALL_NET_MBPS"]  # fed to later communicators
    assert "winner:" in a["report"] and "onebit" in a["report"]
    assert set(a["measured"]) == set(advise.METHODS) and all(
        v > 0 for v in a["measured"].values())


def test_cli_without_a_launcher():
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    r = subprocess.run([sys.executable, "-m", "squall", "advise", "--ranks", "8", "--mbps",
                        "1000", "--latency-us", "50", "--params", "25e6", "--compute-ms", "100"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    # The codecs' rates are measured on this machine (and slow down when it is
    # busy), so which code wins a codec-bound step is the machine's: onebit or
    # int2 on an idle one. Whatever wins is the fastest row of the table the
    # report printed, and at 1 Gbit/s it compresses.
    rows = {line.split()[0]: float(line.split()[1]) for line in r.stdout.splitlines()
            if line.split() and line.split()[0] in advise.METHODS}
    assert set(rows) == set(advise.METHODS), r.stdout
    winner = r.stdout.split("winner: ")[1].split()[0]
    assert rows[winner] == min(rows.values()) and winner != "fp32", r.stdout
    assert "SQUALL_NET_MBPS=1000" in r.stdout, r.stdout
    # every code's row says what it keeps; raw gradients get the fastest code
    # that keeps them, in the interposer's spelling
    for m in advise.METHODS:
        assert advise.QUALITY[m] in r.stdout, m
    fastest = min(rows[m] for m in advise.GRADIENT_CODES)
    raw = [m for m in advise.GRADIENT_CODES if rows[m] == fastest]  # ties as printed
    if winner not in raw:
        said = [m for m in raw if f"interposer sends raw gradients: {m} (" in r.stdout and
                f"SQUALL_PRELOAD_CODEC={advise.INTERPOSER_SPEC.get(m, m)})" in r.stdout]
        assert said or ("fp32" in raw and "do not preload" in r.stdout), r.stdout
    # a script's parameter count: file.py:function returning the model
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "net.py")
        with open(path, "w") as f:
            f.write("import torch\ndef build():\n    return torch.nn.Linear(1000, 1000)\n")
        r = subprocess.run([sys.executable, "-m", "squall", "advise", "--ranks", "2", "--mbps",
                            "1000", "--latency-us", "50", "--params", f"{path}:build"],
                           capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "model 1.0 M params" in r.stdout, r.stdout
