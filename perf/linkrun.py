"""Launches a perf script's worker on shaped links (perf/links.sh), once per
link rate and repeat, and collects what each launch's rank 0 wrote.

    runs = linkrun.measure(args, script, lambda order: [...worker args...])
    runs = linkrun.load(out_dir)            # the same list, from earlier launches

Each run is (rate, repeat, result): result is the JSON rank 0 wrote to the
path it was given as `--worker-out`. Variants run in an order rotated from
repeat to repeat, and the rates alternate, so drift in the machine's speed
spreads over all cells.
"""

import json
import os
import subprocess
import time

LINKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "links.sh")


def measure(args, script, worker_args):
    """args: .out, .repeats, .rates, .ranks, .python, .variants (and perhaps
    .ranks_per_host); worker_args(order) gives the worker's arguments for the
    variants in that order."""
    os.makedirs(args.out, exist_ok=True)
    runs = []
    for rep in range(args.repeats):
        k = rep % len(args.variants)
        order = args.variants[k:] + args.variants[:k]
        for rate in (args.rates if rep % 2 == 0 else args.rates[::-1]):
            path = os.path.join(args.out, f"{rate}_{rep}.json")
            per_host = getattr(args, "ranks_per_host", 1)
            cmd = [LINKS, "--rate", rate, "--ranks", str(args.ranks),
                   "--ranks-per-host", str(per_host), "--", args.python,
                   os.path.abspath(script), "--worker-out", path, *worker_args(order),
                   *(["--ranks-per-host", str(per_host)] if per_host > 1 else [])]
            t0 = time.monotonic()
            rc = subprocess.run(cmd).returncode
            if rc == 77:
                raise SystemExit("perf/links.sh cannot shape links here (needs root)")
            print(f"repeat {rep} {rate}: rc {rc}, {time.monotonic() - t0:.0f} s", flush=True)
            if rc == 0:
                with open(path) as f:
                    runs.append((rate, rep, json.load(f)))
    return runs


def load(out):
    runs = []
    for name in sorted(os.listdir(out)):
        if name.endswith(".json"):
            rate, rep = name[:-5].rsplit("_", 1)
            with open(os.path.join(out, name)) as f:
                runs.append((rate, int(rep), json.load(f)))
    return runs


def eth0_tx_bytes():
    """Bytes this rank's namespace has put on its shaped link so far."""
    with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
        return int(f.read())


def tcp_counters():
    """This namespace's TCP retransmitted segments and retransmission
    timeouts so far (/proc/net/snmp, /proc/net/netstat)."""
    out = {}
    for path, table, keys in (("/proc/net/snmp", "Tcp:", ("RetransSegs",)),
                              ("/proc/net/netstat", "TcpExt:", ("TCPTimeouts", "TCPLossProbes"))):
        try:
            with open(path) as f:
                rows = [line.split() for line in f if line.startswith(table)]
        except OSError:
            continue
        for names, values in zip(rows[::2], rows[1::2]):
            for k in keys:
                if k in names:
                    out[k] = int(values[names.index(k)])
    return out


def teacher_mlp(torch, sizes, batch, rank):
    """(model, batch_of): a fresh MLP of `sizes` (the same weights every call)
    and step -> this rank's batch, labelled by a fixed random linear teacher."""

    def model():
        torch.manual_seed(1)
        layers = []
        for a, b in zip(sizes, sizes[1:]):
            layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers[:-1])

    torch.manual_seed(7)
    teacher = torch.nn.Linear(sizes[0], sizes[-1])

    def batch_of(step):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(batch, sizes[0], generator=g)
        with torch.no_grad():
            y = teacher(x).argmax(1)
        return x, y

    return model, batch_of
