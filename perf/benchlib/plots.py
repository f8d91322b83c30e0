"""The figures of docs/benchmarks.md, drawn from run records (bench.json):
medians with the range over repeats (or seeds) as error bars. Each figure is
drawn when the records it needs are given, and skipped otherwise."""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

from . import common as C  # noqa: E402

METHODS = {"adam": "AdamW (fp32)", "apmsqueeze": "APMSqueeze", "apmsqueeze_old": "APMSqueeze, old defaults",
           "naive_onebit": "naive 1-bit + AdamW", "periodic_adam": "periodic averaging",
           "slowmo_adam": "SlowMo", "slowmo_adam_1bit": "SlowMo, 1-bit syncs",
           "local_sgd": "local SGD", "slowmo_sgd": "SlowMo over SGD"}
TASKS = {"digits": "digits MLP (test loss)", "digits_cnn": "digits CNN (test loss)",
         "charlm": "character GRU LM (validation loss)"}
DPI = 90
TIME_TICKS = [100, 200, 500, 1000, 2000, 5000]


def _err(rows, scale=1.0):
    """Error bar lengths (below, above the median) from each row's range."""
    return [[(r["median"] - r["min"]) * scale for r in rows], [(r["max"] - r["median"]) * scale for r in rows]]


def _pick(records, bench):
    return [r for r in records if r["bench"] == bench]


def allreduce_vs_link(records, path):
    links = _pick(records, "links")
    peers = _pick(records, "peers")
    if not links:
        return None
    rows = [r for rec in links for r in rec["rows"] if r["metric"] == "time"]
    nbytes = max(r["cell"]["bytes"] for r in rows)
    ranks = sorted({r["cell"]["ranks"] for r in rows})
    fig, axes = plt.subplots(1, len(ranks), figsize=(4.2 * len(ranks), 4.0), sharey=True, squeeze=False)
    styles = [("gloo", "gloo fp32 (loaded run)", "tab:gray", "s", peers),
              ("squall", "Squall fp32 (same loaded run)", "tab:blue", "^", peers),
              ("squall fp32 ring", "Squall fp32 ring (idle run)", "tab:blue", "o", links),
              ("squall onebit", "Squall onebit (idle run)", "tab:red", "o", links),
              ("bound max(wire, codec)", "onebit bound max(wire, codec)", "black", "_", links)]
    for ax, n in zip(axes[0], ranks):
        for series, label, color, marker, recs in styles:
            sel = [r for rec in recs for r in rec["rows"] if r["series"] == series and r["metric"] == "time"
                   and r["cell"].get("ranks") == n and r["cell"].get("bytes") == nbytes
                   and r["cell"].get("link", "loopback") != "loopback"]
            if not sel:
                continue
            sel.sort(key=lambda r: C.parse_rate(r["cell"]["link"]))
            x = [C.parse_rate(r["cell"]["link"]) / 1e9 for r in sel]
            scale = 1e-3 if sel[0]["unit"] == "us" else 1.0
            y = [r["median"] * scale for r in sel]
            dashed = "--" if recs is peers else ("-" if series != "bound max(wire, codec)" else ":")
            ax.errorbar(x, y, yerr=_err(sel, scale), label=label, color=color, marker=marker,
                        linestyle=dashed, capsize=3, markersize=7 if marker != "_" else 14)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks([0.1, 1, 10, 100])
        ax.set_xticklabels(["0.1", "1", "10", "100"])
        ax.set_xlim(0.5, 20)
        ax.set_yticks(TIME_TICKS)
        ax.yaxis.set_major_formatter(ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_title(f"{n} ranks, {C.human(nbytes).replace('M', ' MiB').replace('G', ' GiB')} of fp32 per rank",
                     fontsize=10)
        ax.set_xlabel("link rate per rank, Gbit/s")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("time per allreduce, ms")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.13, 1, 1))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def ddp_hooks(records, path):
    recs = _pick(records, "ddp-hooks")
    if not recs:
        return None
    rows = [r for rec in recs for r in rec["rows"] if r["metric"] == "step"]
    links = sorted({r["cell"]["link"] for r in rows}, key=C.parse_rate)
    hooks = list(dict.fromkeys(r["series"] for r in rows))
    fig, ax = plt.subplots(figsize=(8.4, 3.6))
    width = 0.8 / len(hooks)
    for i, hook in enumerate(hooks):
        sel = {r["cell"]["link"]: r for r in rows if r["series"] == hook}
        xs = [j + (i - (len(hooks) - 1) / 2) * width for j, link in enumerate(links) if link in sel]
        rs = [sel[link] for link in links if link in sel]
        ax.bar(xs, [r["median"] for r in rs], width, yerr=_err(rs), capsize=2, label=hook)
    ax.set_xticks(range(len(links)))
    ax.set_xticklabels([f"{C.parse_rate(link) / 1e9:g} Gbit/s" for link in links])
    ax.set_ylabel("step time, ms (median, range)")
    ax.set_title("DDP training step per communication hook, 2 ranks")
    ax.legend(fontsize=7, ncol=3)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def loss_vs_bytes(records, path):
    recs = _pick(records, "convergence")
    if not recs:
        return None
    rows = [r for rec in recs for r in rec["rows"]]
    tasks = [t for t in TASKS if any(r["cell"]["task"] == t for r in rows)]
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.0 * len(tasks), 4.2), squeeze=False)
    markers = "osD^v<>PX"
    for ax, task in zip(axes[0], tasks):
        loss = {r["series"]: r for r in rows if r["cell"]["task"] == task and r["unit"] == "loss"}
        sent = {r["series"]: r for r in rows if r["cell"]["task"] == task and r["metric"] == "sent_per_rank"}
        for k, method in enumerate(m for m in loss if m in sent):
            ly, sx = loss[method], sent[method]
            ax.errorbar([sx["median"] / 1e6], [ly["median"]], yerr=_err([ly]), xerr=_err([sx], 1e-6),
                        marker=markers[k % len(markers)], linestyle="none", capsize=3,
                        label=METHODS.get(method, method))
        ax.set_xscale("log")
        ax.set_xlabel("MB sent per rank, whole run")
        ax.set_title(TASKS[task], fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("final held-out loss (median, range)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def render(records, out):
    made = []
    for name, fn in (("allreduce_vs_link.png", allreduce_vs_link), ("ddp_hooks.png", ddp_hooks),
                     ("loss_vs_bytes.png", loss_vs_bytes)):
        path = fn(records, os.path.join(out, name))
        if path:
            made.append(path)
    return made
