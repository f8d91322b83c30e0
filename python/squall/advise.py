"""squall advise: will compression pay on this link?

Measures, on the actual ranks, what decides the answer: the link's latency
and bandwidth between them (a short probe of allreduces over the
communicator) and this machine's codec throughput. Then, for a model of
`params` fp32 gradients and a step of `compute_s` seconds of computation,
predicts the time per step of the full-precision allreduce and of the
compressed allreduce with every codec of the ladder (fp16, bf16, int8, int4,
int2, onebit), and names the winner with the settings to use. The fastest
code is not always good enough: each row also says what the code is measured
to keep for each use (docs/codecs.md, "The ladder").

The model (Squall's hooks and optimizers do not overlap communication with
computation, so a step is compute + communication):

* full precision, ring allreduce: 2(n-1) latencies + 2(n-1)/n * 4P bytes;
* compressed, two-phase: the same rounds with the encoded size E(P) in
  place of 4P; encoding about (1 + 1/n) P and decoding about 2P elements at
  the measured rates overlaps the transfer (the allreduce is pipelined in
  SQUALL_SEGMENT_BYTES chunks), so the slower of the two counts; the
  all-gather variant (one round, (n-1) E(P) bytes) where the library's own
  cost model picks it.

``advise(comm, apply=True)`` also sets SQUALL_NET_MBPS and
SQUALL_NET_LATENCY_US in this process's environment, which communicators
created afterwards read for the compressed allreduce's algorithm choice
(SQUALL_COMPRESSED_ALGO=auto); export them on every rank for the next run.
"""

import argparse
import math
import os
import sys
import time

from . import _lib
from .codec import encoded_size, parse_codec

METHODS = ("fp32", "fp16", "bf16", "int8", "int4", "int2", "onebit")
# What each code was measured to keep (docs/codecs.md, "The ladder"): the
# uses for which it trains within 3% of the uncompressed loss at equal steps.
QUALITY = {
    "fp32": "exact",
    "fp16": "any use",
    "bf16": "any use",
    "int8": "any use measured",
    "int4": "raw SGD and Adam gradients at block 256 (the interposer's default)",
    "int2": "momentum (APMSqueeze, the DDP hook); raw gradients of small SGD jobs only "
            "(an SGD char LM +19%, Adam +38%)",
    "onebit": "momentum (APMSqueeze, the DDP hook), not raw gradients (+5-36%)",
}
# The codes that kept raw gradients (an unmodified job under the interposer)
# within 3%, and the spec the interposer takes for each.
GRADIENT_CODES = ("fp32", "fp16", "bf16", "int8", "int4")
INTERPOSER_SPEC = {"int4": "int4:block=256"}
_PROBE_BIG = 4 << 20  # fp32 elements of the bandwidth probe (16 MiB)


def _np():
    import numpy as np

    return np


def _agree(comm, values):
    """The largest value of each entry over all ranks (every rank gets the same)."""
    np = _np()
    a = np.array(values, dtype=np.float64)
    if comm is not None and comm.size > 1:
        comm.allreduce(a, "max")
    return [float(v) for v in a]


def _time(fn, repeats):
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure_codecs(count=1 << 20, repeats=3):
    """{codec: (encode elements/s, decode-accumulate elements/s)} on this machine."""
    np = _np()
    from . import codec as c

    x = np.random.default_rng(0).standard_normal(count).astype(np.float32)
    out = np.zeros(count, dtype=np.float32)
    rates = {}
    for name in METHODS[1:]:
        residual = c.Residual(count)
        data = c.encode(x, name, residual)
        enc = _time(lambda: c.encode(x, name, residual), repeats)
        dec = _time(lambda: c.decode(data, out, accumulate=True), repeats)
        rates[name] = (count / enc, count / dec)
        residual.close()
    return rates


def measure_link(comm, repeats=5):
    """(latency s, bandwidth bytes/s) between the ranks of `comm`: one small
    allreduce is one round; a 16 MiB ring allreduce moves 2(n-1)/n of it
    in 2(n-1) rounds."""
    np = _np()
    n = comm.size
    if n < 2:
        return 0.0, math.inf
    small = np.zeros(1, dtype=np.float32)
    comm.allreduce(small)  # connections up
    latency = _time(lambda: comm.allreduce(small), repeats * 4)
    big = np.zeros(_PROBE_BIG, dtype=np.float32)
    comm.allreduce(big)
    t = _time(lambda: comm.allreduce(big), repeats)
    moved = 2.0 * (n - 1) / n * big.nbytes
    bandwidth = moved / max(t - 2 * (n - 1) * latency, t * 0.05)
    return latency, bandwidth


def _encoded(method, params):
    return 4 * params if method == "fp32" else encoded_size(parse_codec(method), params)


def _allgather_pays(n, encoded, latency, bandwidth):
    # The library's rule (src/coll/compressed_allgather.cc): one round instead
    # of two when the extra bytes cost less than a message's latency.
    return n >= 2 and encoded * (n - 2) / n <= latency * bandwidth


def predict(params, compute_s, nranks, latency, bandwidth, codec_rates):
    """{method: (step seconds, communication seconds, algorithm)} for one step."""
    n, out = nranks, {}
    for method in METHODS:
        e = _encoded(method, params)
        if n < 2:
            out[method] = (compute_s, 0.0, "none")
            continue
        if method == "fp32":
            comm_s = 2 * (n - 1) * latency + 2.0 * (n - 1) / n * e / bandwidth
            algo = "ring"
        else:
            enc, dec = codec_rates[method]
            if _allgather_pays(n, e, latency, bandwidth):
                rounds, wire, algo = n - 1, (n - 1) * e / bandwidth, "allgather"
                codec_s = params / enc + (n - 1) * params / dec
            else:
                rounds, wire, algo = 2 * (n - 1), 2.0 * (n - 1) / n * e / bandwidth, "twophase"
                codec_s = (1 + 1.0 / n) * params / enc + 2.0 * params / dec
            comm_s = rounds * latency + max(wire, codec_s)
        out[method] = (compute_s + comm_s, comm_s, algo)
    return out


def advise(comm=None, params=25_000_000, compute_s=0.1, apply=True, latency=None,
           bandwidth=None, nranks=None, repeats=5):
    """Measures (unless latency and bandwidth are given), predicts and returns
    a dict: 'latency_s', 'bandwidth_Bps', 'codec_rates', 'predictions',
    'winner', 'settings' (environment variables to set on every rank)."""
    if latency is None or bandwidth is None:
        if comm is None:
            from ._comm import get_default

            comm = get_default()
        lat, bw = measure_link(comm, repeats)
        latency = lat if latency is None else latency
        bandwidth = bw if bandwidth is None else bandwidth
    rates = measure_codecs(repeats=max(2, repeats // 2))
    flat = [latency, 1.0 / bandwidth if bandwidth < math.inf else 0.0]
    for m in METHODS[1:]:
        flat += [1.0 / rates[m][0], 1.0 / rates[m][1]]
    flat = _agree(comm, flat)  # the slowest rank's figures, identical everywhere
    latency, bandwidth = flat[0], (1.0 / flat[1] if flat[1] > 0 else math.inf)
    rates = {m: (1.0 / flat[2 + 2 * i], 1.0 / flat[3 + 2 * i]) for i, m in enumerate(METHODS[1:])}
    n = nranks if nranks is not None else (comm.size if comm is not None else 1)
    preds = predict(int(params), float(compute_s), n, latency, bandwidth, rates)
    winner = min(METHODS, key=lambda m: preds[m][0])
    # An unmodified job under the interposer sends its raw gradients: the
    # fastest code that keeps them.
    interposed = min(GRADIENT_CODES, key=lambda m: preds[m][0])
    mbps = max(1, int(round(bandwidth * 8 / 1e6))) if bandwidth < math.inf else 100000
    settings = {"SQUALL_NET_MBPS": str(mbps),
                "SQUALL_NET_LATENCY_US": str(max(1, int(round(latency * 1e6))))}
    if winner != "fp32":
        settings["SQUALL_COMPRESSED_ALGO"] = preds[winner][2]
    if apply:
        os.environ.update({k: v for k, v in settings.items() if k.startswith("SQUALL_NET")})
    return {"latency_s": latency, "bandwidth_Bps": bandwidth, "codec_rates": rates,
            "predictions": preds, "winner": winner, "interposed": interposed,
            "settings": settings, "nranks": n,
            "params": int(params), "compute_s": float(compute_s)}


def measure_steps(comm, params, compute_s, steps=3):
    """Measured seconds per synthetic step (a sleep of compute_s, then the
    allreduce of `params` fp32 gradients) for each method, on `comm`."""
    np = _np()
    from ._comm import Compressor

    grad = np.random.default_rng(comm.rank).standard_normal(int(params)).astype(np.float32)
    out = {}
    for method in METHODS:
        comp = None if method == "fp32" else Compressor(comm, grad.size, method)

        def step():
            time.sleep(compute_s)
            if comp is None:
                comm.allreduce(grad)
            else:
                comp.allreduce(grad)

        comm.barrier()
        step()  # warm: connections, buffers
        comm.barrier()
        t = time.perf_counter()
        for _ in range(steps):
            step()
        comm.barrier()
        out[method] = _agree(comm, [(time.perf_counter() - t) / steps])[0]
        if comp is not None:
            comp.close()
    return out


def format_report(result, measured=None):
    lines = []
    bw = result["bandwidth_Bps"]
    lines.append(f"squall advise: {result['nranks']} ranks, latency "
                 f"{result['latency_s'] * 1e6:.0f} us, bandwidth "
                 f"{bw * 8 / 1e9:.2f} Gbit/s per rank; model {result['params'] / 1e6:.1f} M "
                 f"params, compute {result['compute_s'] * 1e3:.0f} ms per step")
    header = f"{'method':<8} {'step ms':>9} {'comm ms':>9} {'algorithm':>10}"
    if measured:
        header += f" {'measured ms':>12}"
    lines.append(header + "  keeps quality for")
    for m in METHODS:
        step, comm_s, algo = result["predictions"][m]
        row = f"{m:<8} {step * 1e3:>9.1f} {comm_s * 1e3:>9.1f} {algo:>10}"
        if measured:
            row += f" {measured[m] * 1e3:>12.1f}"
        lines.append(row + "  " + QUALITY[m])
    w = result["winner"]
    base = result["predictions"]["fp32"][0]
    speedup = base / result["predictions"][w][0]
    settings = " ".join(f"{k}={v}" for k, v in result["settings"].items())
    if w == "fp32":
        lines.append(f"winner: fp32 (compression does not pay here); set {settings}")
    else:
        block = parse_codec(w).blockSize
        lines.append(f"winner: {w} ({speedup:.2f}x the fp32 step): codec \"{w}\" (block "
                     f"{block}), e.g. squallrun --hook onebit / --optimizer apmsqueeze "
                     f"--codec {w}; set {settings} on every rank")
    i = result["interposed"]
    if i == "fp32" and w != "fp32":
        lines.append("an unmodified job under the interposer sends raw gradients: no code that "
                     "keeps them pays on this link; do not preload the interposer")
    elif i != w:
        lines.append(f"an unmodified job under the interposer sends raw gradients: {i} "
                     f"({base / result['predictions'][i][0]:.2f}x the fp32 step; "
                     f"SQUALL_PRELOAD_CODEC={INTERPOSER_SPEC.get(i, i)})")
    return "\n".join(lines)


def _params_of(text):
    """A number (25e6) or path.py:function returning a torch module."""
    try:
        return int(float(text))
    except ValueError:
        pass
    import importlib.util

    path, _, fn = text.partition(":")
    spec = importlib.util.spec_from_file_location("squall_advise_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = getattr(module, fn or "model")
    model = model() if callable(model) and not hasattr(model, "parameters") else model
    return sum(p.numel() for p in model.parameters())


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="squall advise",
        description="Measure the link and the codecs, and predict which allreduce wins. Run "
                    "it on the job's ranks (torchrun, srun or mpirun: the communicator comes "
                    "from their variables), or give --ranks, --mbps and --latency-us.")
    p.add_argument("--params", default="25e6",
                   help="gradient elements (25e6), or file.py:function returning the model")
    p.add_argument("--compute-ms", type=float, default=100.0,
                   help="computation per step, in ms (forward + backward + update)")
    p.add_argument("--ranks", type=int, help="predict for this many ranks (no measurement)")
    p.add_argument("--mbps", type=float, help="link bandwidth to assume, Mbit/s")
    p.add_argument("--latency-us", type=float, help="latency to assume, us")
    p.add_argument("--validate", action="store_true",
                   help="also run synthetic steps of each method and print measured times")
    p.add_argument("--steps", type=int, default=3, help="synthetic steps per method")
    args = p.parse_args(argv)
    params = _params_of(args.params)
    comm = None
    if args.ranks is None or args.validate:
        from ._comm import Communicator

        comm = Communicator.from_env()
    latency = args.latency_us * 1e-6 if args.latency_us is not None else None
    bandwidth = args.mbps * 1e6 / 8 if args.mbps is not None else None
    if comm is None and (latency is None or bandwidth is None):
        p.error("without a launcher (no communicator), give --mbps and --latency-us")
    result = advise(comm, params, args.compute_ms / 1e3, apply=True, latency=latency,
                    bandwidth=bandwidth, nranks=args.ranks)
    measured = measure_steps(comm, params, args.compute_ms / 1e3, args.steps) \
        if args.validate else None
    if comm is None or comm.rank == 0:
        print(format_report(result, measured), flush=True)
    if comm is not None:
        comm.barrier()  # nobody closes while a peer still finishes the last collective
        comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
