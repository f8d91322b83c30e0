"""What every subcommand of perf/bench.py shares: sizes and rates, the run
record (the one JSON schema every subcommand writes), the machine's state,
and how ranks are started (local processes on 127.0.0.1, or perf/links.sh's
shaped namespaces)."""

import datetime
import json
import os
import platform
import re
import shlex
import socket
import statistics
import subprocess
import sys

SCHEMA = "squall-bench/1"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # perf/
ROOT = os.path.dirname(HERE)
LINKS = os.path.join(HERE, "links.sh")
SKIP = 77  # links.sh's exit status when it cannot shape links here


def write_between_markers(path, begin, end, text):
    """Replaces what lies between the lines `begin` and `end` of the file at
    `path` (a generated table in a doc) with `text`."""
    with open(path) as f:
        doc = f.read()
    if begin not in doc or end not in doc:
        raise SystemExit(f"{path} lacks the markers {begin} ... {end}")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as f:
        f.write(head + begin + "\n\n" + text + "\n" + end + tail)
    print("wrote", path)


class Skip(Exception):
    """The measurement cannot run on this machine (no root, no namespaces);
    the driver exits 77 with the reason."""


def parse_size(text):
    """'64M' -> 67108864; K, M, G are powers of 1024, as the binaries read them."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGkmg]?)", str(text))
    if not m:
        raise ValueError(f"bad size {text!r} (want e.g. 4K, 64M, 1G)")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def human(nbytes):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def parse_rate(text):
    """'1gbit' -> 1e9 bits/s, '100mbit' -> 1e8."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(g|m)bit", text)
    if not m:
        raise ValueError(f"bad rate {text!r} (want e.g. 1gbit, 100mbit)")
    return float(m.group(1)) * (1e9 if m.group(2) == "g" else 1e6)


def sizes(lo, hi, factor):
    """The byte sizes -b lo -e hi -f factor visits, as squall_perf does."""
    out, b = [], float(parse_size(lo))
    while b <= parse_size(hi):
        out.append(int(b))
        b *= factor
    return out


def machine():
    """What the figures depend on: CPU, cores, load, kernel, date."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), "")
    except OSError:
        pass
    return {"host": socket.gethostname(), "cpu": model or platform.processor(),
            "cores": os.cpu_count(), "loadavg": list(os.getloadavg()),
            "kernel": platform.release(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def row(series, cell, metric, unit, values, **extra):
    """One figure of the schema: `values` are the repeats (each already a
    per-run median where the binary takes one), summarised by median and
    range."""
    values = [float(v) for v in values if v is not None]
    r = {"series": series, "cell": cell, "metric": metric, "unit": unit, "values": values,
         "median": statistics.median(values) if values else None,
         "min": min(values) if values else None, "max": max(values) if values else None}
    if extra:
        r["extra"] = extra
    return r


class Record:
    """The run record: what ran (the command that regenerates it), where and
    when, with which parameters, and its rows. Written as OUT/bench.json."""

    def __init__(self, bench, params, argv=None, source=None):
        self.data = {"schema": SCHEMA, "bench": bench,
                     "command": "perf/bench.py " + " ".join(shlex.quote(a) for a in (argv or [])),
                     "machine": machine(), "params": params, "rows": []}
        if source:
            # Derived from saved files: the figures are the original run's, on
            # its machine (its raw files say which); this machine only read them.
            self.data["source"] = source
            self.data["machine"] = {"measured": "see source"}
            self.data["derived_on"] = machine()

    def add(self, *args, **kw):
        self.data["rows"].append(row(*args, **kw))

    def finish(self, out):
        if "source" not in self.data:
            self.data["machine_end"] = {"loadavg": list(os.getloadavg()), "date": machine()["date"]}
        if out:
            os.makedirs(out, exist_ok=True)
            path = os.path.join(out, "bench.json")
            with open(path, "w") as f:
                json.dump(self.data, f, indent=1)
                f.write("\n")
            print(f"bench.py: {len(self.data['rows'])} rows in {path}", file=sys.stderr)
        return self.data


def validate(data):
    """Raises ValueError where `data` is not a run record of this schema."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA} record")
    for key in ("bench", "command", "machine", "params", "rows"):
        if key not in data:
            raise ValueError(f"record without {key!r}")
    for i, r in enumerate(data["rows"]):
        for key, kind in (("series", str), ("cell", dict), ("metric", str), ("unit", str),
                          ("values", list)):
            if not isinstance(r.get(key), kind):
                raise ValueError(f"row {i}: {key!r} missing or not a {kind.__name__}")
        if r["values"]:
            v = r["values"]
            if not (r["min"] == min(v) and r["max"] == max(v) and r["median"] == statistics.median(v)):
                raise ValueError(f"row {i}: median/min/max do not match its values")
    return data


def load(path):
    with open(path) as f:
        return validate(json.load(f))


def build_tool(build, rel):
    """The path of a built benchmark binary, or a message saying how to build it."""
    path = os.path.join(build, rel)
    if not os.access(path, os.X_OK):
        sys.exit(f"bench.py: {path} is missing; build it first "
                 f"(ninja -C {build} {rel}, or --build DIR)")
    return path


def run(cmd, env=None, out=None, err=None, check=True, nice=None, quiet=False):
    """Runs cmd (a list); returns (status, stdout text). `out`/`err`: files that
    also receive stdout/stderr. links.sh's 77 raises Skip."""
    full = dict(os.environ, **(env or {}))
    if nice is not None:
        cmd = ["nice", "-n", str(nice)] + cmd
    if not quiet:
        print("bench.py: $ " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, env=full, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE if err else None, text=True)
    if out:
        with open(out, "w") as f:
            f.write(p.stdout)
    if err:
        with open(err, "w") as f:
            f.write(p.stderr)
    if p.returncode == SKIP and cmd_uses_links(cmd):
        raise Skip("perf/links.sh cannot shape links here (needs root and network namespaces)")
    if check and p.returncode != 0:
        tail = (p.stderr or "")[-2000:] if err else ""
        raise RuntimeError(f"{cmd[0]} exited {p.returncode}\n{tail}")
    return p.returncode, p.stdout


def cmd_uses_links(cmd):
    return any(os.path.basename(c) == "links.sh" for c in cmd)


def shaped(rate, ranks, cmd, per_host=1, delay=None):
    """cmd run by perf/links.sh: one namespace per host behind a link of `rate`."""
    extra = ["--ranks-per-host", str(per_host)] if per_host != 1 else []
    extra += ["--delay", delay] if delay else []
    return [LINKS, "--rate", rate, "--ranks", str(ranks)] + extra + ["--"] + cmd


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def local_ranks(n, cmd, env=None):
    """n processes of cmd on 127.0.0.1 with torchrun's variables; returns
    (status, rank 0's stdout), status the first failure's."""
    port = free_port()
    # One random secret for the ranks started here: nobody else can join, and
    # init has nothing to warn about.
    secret = os.environ.get("SQUALL_JOB_SECRET") or os.urandom(16).hex()
    procs = []
    for r in range(n):
        e = dict(os.environ, SQUALL_JOB_SECRET=secret, RANK=str(r), WORLD_SIZE=str(n),
                 LOCAL_RANK=str(r),
                 LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 SQUALL_PORT=str(port), GLOO_SOCKET_IFNAME="lo", **(env or {}))
        procs.append(subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate()[0] for p in procs]
    status = next((p.returncode for p in procs if p.returncode != 0), 0)
    return status, "".join(outs)


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.strip().startswith("{")]


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def md_table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def fmt_range(r, digits=1, scale=1.0):
    """'median [min-max]' of a row, or the one value."""
    if r is None or r["median"] is None:
        return "-"
    m, lo, hi = r["median"] * scale, r["min"] * scale, r["max"] * scale
    if len(r["values"]) == 1:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"
