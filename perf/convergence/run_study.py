#!/usr/bin/env python3
"""Convergence study: Adam vs APMSqueeze (new and old defaults) vs naive 1-bit vs SlowMo.

Spawns `--world` CPU ranks (torch.multiprocessing, gloo on 127.0.0.1, one
torch thread each) that join one Squall communicator and run, for every task
and seed, the methods in turn on the same model init, data order and LR
schedule. Each rank trains on a disjoint shard of every global batch.

Writes perf/convergence/results/results.json (all curves and finals) and
PNG plots (loss vs step, loss vs bytes sent per rank) per task.

    SQUALL_LIBRARY=$PWD/build/src/core/libsquall.so PYTHONPATH=$PWD/python \\
        python3 perf/convergence/run_study.py --doc      # the study + docs/convergence.md
    ... run_study.py --quick                               # smoke test (minutes)
    ... run_study.py --plots-only --doc                    # re-make tables, plots, doc
"""

import argparse
import datetime
import hashlib
import json
import math
import os
import socket
import sys
import time

import torch
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from benchlib.common import write_between_markers  # noqa: E402
METHODS = ["adam", "apmsqueeze", "apmsqueeze_old", "naive_onebit", "periodic_adam",
           "slowmo_adam", "slowmo_adam_1bit", "local_sgd", "slowmo_sgd"]
LABELS = {
    "adam": "Adam (full precision)",
    "apmsqueeze": "APMSqueeze (library defaults)",
    "apmsqueeze_old": "APMSqueeze (old defaults: fixed 15% warmup, time-model algorithm)",
    "naive_onebit": "naive 1-bit EF grads + Adam",
    "periodic_adam": "periodic averaging of local Adam (SlowMo beta=0)",
    "slowmo_adam": "SlowMo over local Adam",
    "slowmo_adam_1bit": "SlowMo over local Adam, 1-bit syncs",
    "local_sgd": "Local SGD (periodic averaging of SGD)",
    "slowmo_sgd": "SlowMo over local SGD",
}
# APMSqueeze with one setting changed from the library's defaults: what each part costs
APM_VARIANTS = {
    "apm_fp32_warmup": ({"warmup_codec": "none"}, "APMSqueeze, fp32 warmup (not bf16)"),
    "apm_allgather": ({"compressed_algo": "allgather"}, "APMSqueeze, all-gather (not two-phase)"),
    "apm_block2048": ({"codec": "onebit:block=2048:scale=rms"},
                      "APMSqueeze, 2048-element blocks (not 64)"),
    "apm_meanabs_scale": ({"codec": "onebit:block=64"},
                          "APMSqueeze, mean-abs block scale (not RMS; the previous default)"),
    "apm_fixed_warmup": ({"freeze_threshold": 0.0},
                         "APMSqueeze, fixed 15% warmup (no variance test)"),
    "apm_threshold_0.1": ({"freeze_threshold": 0.1}, "APMSqueeze, freeze threshold 0.1 (not 0.2)"),
    # diagnostics, not in the default plan
    "apm_fp32_momentum": ({"codec": "none"},
                          "APMSqueeze, fp32 momentum (frozen variance, no compression)"),
    "apm_warmup_30": ({"warmup": 0.3}, "APMSqueeze, warmup bound 30% (not 15%)"),
    # the codec ladder for the momentum (docs/codecs.md)
    "apm_int2": ({"codec": "int2:block=64"}, "APMSqueeze, 2-bit momentum (int2, blocks of 64)"),
    "apm_int4": ({"codec": "int4:block=64"}, "APMSqueeze, 4-bit momentum (int4, blocks of 64)"),
    "apm_int8": ({"codec": "int8:block=64"}, "APMSqueeze, 8-bit momentum (int8, blocks of 64)"),
}
# SlowMo over local Adam with its compressed sync in a given code (the ladder)
SLOWMO_CODECS = {
    "slowmo_adam_1bit": "onebit",
    "slowmo_adam_int2": "int2",
    "slowmo_adam_int4": "int4",
    "slowmo_adam_int8": "int8",
}
# SlowMo over local AdamW as SlowMo(base, tau=TAU, **kwargs) ("fragments"/"delay"/"merge" given
# as None come from --fragments/--delay/--merge): the defaults, DiLoCo's outer step, streaming.
# The forms that name beta 0.5 ran when 0.5 was the default at every period (now it is 0 from
# tau 100 on, squall.optim.SlowMo.LONG_PERIOD): they keep it so that they rerun as recorded.
SLOWMO_FORMS = {
    "slowmo_default": ({}, "SlowMo(AdamW, tau) with the library's defaults (int4 syncs; beta 0.5 "
                       "below tau 100, 0 from it on)"),
    "slowmo_beta5": ({"beta": 0.5}, "SlowMo(AdamW, tau, beta=0.5), int4 syncs"),
    "slowmo_int2": ({"codec": "int2", "beta": 0.5}, "SlowMo(AdamW, tau, beta=0.5), int2 syncs"),
    "slowmo_int8": ({"codec": "int8", "beta": 0.5}, "SlowMo(AdamW, tau, beta=0.5), int8 syncs"),
    "slowmo_full": ({"mode": "full", "beta": 0.5},
                    "SlowMo(AdamW, tau, beta=0.5), full-precision syncs"),
    "slowmo_beta0": ({"beta": 0.0}, "SlowMo(AdamW, tau, beta=0): plain averaging, int4 syncs"),
    "slowmo_beta7": ({"beta": 0.7}, "SlowMo(AdamW, tau, beta=0.7), int4 syncs"),
    "diloco": ({"nesterov": True, "alpha": 0.7, "beta": 0.9},
               "SlowMo with DiLoCo's outer step (Nesterov, alpha 0.7, beta 0.9), int4 syncs"),
    "diloco_full": ({"nesterov": True, "alpha": 0.7, "beta": 0.9, "mode": "full"},
                    "SlowMo with DiLoCo's outer step, full-precision syncs"),
    "streamed": ({"fragments": None, "delay": None, "merge": "replace", "beta": 0.5},
                 "streamed SlowMo (beta 0.5; merge replace)"),
    "streamed_carry": ({"fragments": None, "delay": None, "merge": "carry", "beta": 0.5},
                       "streamed SlowMo (beta 0.5; merge carry)"),
    "diloco_streamed": ({"nesterov": True, "alpha": 0.7, "beta": 0.9, "fragments": None,
                         "delay": None, "merge": "replace"},
                        "streamed SlowMo with DiLoCo's outer step (merge replace)"),
    "diloco_streamed_carry": ({"nesterov": True, "alpha": 0.7, "beta": 0.9, "fragments": None,
                               "delay": None, "merge": "carry"},
                              "streamed SlowMo with DiLoCo's outer step (merge carry)"),
}
METHODS += list(APM_VARIANTS)
METHODS += list(SLOWMO_FORMS)
LABELS.update({k: v[1] for k, v in SLOWMO_FORMS.items()})
LABELS.update({k: v[1] for k, v in APM_VARIANTS.items()})
for _m, _code in SLOWMO_CODECS.items():
    if _m not in METHODS:
        METHODS.append(_m)
        LABELS[_m] = f"SlowMo over local Adam, {_code} syncs"
DEFAULT_METHODS = ("adam,apmsqueeze,periodic_adam,slowmo_adam,apm_fp32_warmup,apm_allgather,"
                   "apm_block2048,apm_meanabs_scale,apm_fixed_warmup,apm_threshold_0.1")
ENV = {
    "SQUALL_SOCKET_IFNAME": "lo",
    "SQUALL_TRANSPORT": "tcp",
    "SQUALL_TIMEOUT_S": "120",
    "GLOO_SOCKET_IFNAME": "lo",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


# ---------------------------------------------------------------- tasks ----

class DigitsTask:
    """sklearn's 8x8 digits, fixed 80/20 split (random_state=0), MLP 64-128-10."""
    name = "digits"

    def __init__(self, args):
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
        d = load_digits()
        x = torch.tensor(d.data, dtype=torch.float32) / 16.0
        y = torch.tensor(d.target, dtype=torch.int64)
        idx = torch.arange(len(y)).numpy()
        tr, te = train_test_split(idx, test_size=0.2, random_state=0, stratify=d.target)
        self.dropped = []
        if args.digits_drop_constant:
            # pixels that are 0 in every training image give exactly-zero weight
            # gradients, hence a frozen variance of 0 in APMSqueeze (see docs)
            keep = x[tr].std(0) > 0
            self.dropped = torch.nonzero(~keep).view(-1).tolist()
            x = x[:, keep]
        self.nin = x.shape[1]
        self.xtr, self.ytr = x[tr], y[tr]
        self.xte, self.yte = x[te], y[te]
        self.batch = args.digits_batch
        self.lr = {"adam": args.digits_lr, "sgd": args.digits_sgd_lr}

    def model(self):
        return torch.nn.Sequential(torch.nn.Linear(self.nin, 128), torch.nn.ReLU(),
                                   torch.nn.Linear(128, 10))

    def batch_for(self, seed, step, rank, world):
        """The global batch of `step` (the same on every rank), then this rank's shard."""
        n = len(self.ytr)
        per_epoch = n // self.batch
        epoch, i = divmod(step, per_epoch)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
        gb = perm[i * self.batch:(i + 1) * self.batch]
        mine = gb[rank::world]
        return self.xtr[mine], self.ytr[mine]

    def loss(self, model, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x), y)

    @torch.no_grad()
    def evaluate(self, model):
        out = model(self.xte)
        return {"test_loss": float(torch.nn.functional.cross_entropy(out, self.yte)),
                "test_acc": float((out.argmax(1) == self.yte).float().mean()) * 100.0}


class DigitsCNNTask(DigitsTask):
    """The digits data (same split) with a small CNN: a different model family."""
    name = "digits_cnn"

    def model(self):
        return torch.nn.Sequential(
            torch.nn.Unflatten(1, (1, 8, 8)),
            torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(32 * 2 * 2, 10))


class TextData:
    """The (deduplicated) texts of /usr/share/common-licenses, concatenated in
    name order; the last 10% is validation. Loaded once per process."""
    _cache = None

    @staticmethod
    def files():
        root = "/usr/share/common-licenses"
        return [os.path.join(root, f) for f in sorted(os.listdir(root))]

    @classmethod
    def load(cls):
        if cls._cache is None:
            seen, parts = set(), []
            for f in cls.files():
                real = os.path.realpath(f)
                if real in seen or not os.path.isfile(real):
                    continue
                seen.add(real)
                with open(real, "rb") as fh:
                    parts.append(fh.read().decode("utf-8", "replace"))
            text = "\n".join(parts)
            chars = sorted(set(text))
            stoi = {c: i for i, c in enumerate(chars)}
            data = torch.tensor([stoi[c] for c in text], dtype=torch.int64)
            cls._cache = (data, len(chars), sorted(seen))
        return cls._cache


class CodeData(TextData):
    """A text 16x larger, for the larger transformer (which overfits the
    licenses within a few thousand steps): the top-level modules of Debian 12's
    Python standard library (/usr/lib/python3.11/*.py, 171 files, 4.7 MB),
    concatenated in name order; the last 10% is validation."""
    _cache = None

    @staticmethod
    def files():
        root = "/usr/lib/python3.11"
        return [os.path.join(root, f) for f in sorted(os.listdir(root)) if f.endswith(".py")]


class CharLMTask:
    """Character-level LM on TextData. The GRU: 1 layer, embedding 32, hidden
    --lm-hidden. Evaluated on fixed validation windows: loss and next-character
    accuracy."""
    name = "charlm"
    data = TextData

    def __init__(self, args):
        data, self.vocab, self.files = self.data.load()
        self.nchars = len(data)
        cut = int(len(data) * 0.9)
        self.train, self.val = data[:cut], data[cut:]
        self.seq = args.lm_seq
        self.hidden = args.lm_hidden
        self.batch = args.lm_batch
        self.lr = {"adam": args.lm_lr, "sgd": args.lm_sgd_lr}
        # fixed validation windows: non-overlapping, up to lm_val_windows of them
        L = args.lm_val_seq
        nwin = min(args.lm_val_windows, (len(self.val) - 1) // L)
        starts = torch.arange(nwin) * ((len(self.val) - 1 - L) // max(nwin - 1, 1))
        self.vx = torch.stack([self.val[s:s + L] for s in starts])
        self.vy = torch.stack([self.val[s + 1:s + 1 + L] for s in starts])

    def model(self):
        return CharGRU(self.vocab, hidden=self.hidden)

    def batch_for(self, seed, step, rank, world):
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.train) - self.seq - 1, (self.batch,), generator=g)
        mine = starts[rank::world]
        x = torch.stack([self.train[s:s + self.seq] for s in mine])
        y = torch.stack([self.train[s + 1:s + 1 + self.seq] for s in mine])
        return x, y

    def loss(self, model, batch):
        x, y = batch
        out = model(x)
        return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    @torch.no_grad()
    def evaluate(self, model):
        out = model(self.vx)
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                                 self.vy.reshape(-1))
        acc = (out.argmax(-1) == self.vy).float().mean()
        return {"val_loss": float(loss), "val_acc": float(acc) * 100.0}


class CharCNNTask(CharLMTask):
    """The same text with a gated, dilated, causal 1-D convolutional LM."""
    name = "charcnn"

    def __init__(self, args):
        super().__init__(args)
        self.seq, self.lr = args.cnnlm_seq, {"adam": args.cnnlm_lr, "sgd": args.lm_sgd_lr}

    def model(self):
        return GatedConvLM(self.vocab)


class TransformerLMTask(CharLMTask):
    """The same text with a small pre-norm causal transformer."""
    name = "transformer"

    def __init__(self, args):
        super().__init__(args)
        self.seq, self.lr = args.tflm_seq, {"adam": args.tflm_lr, "sgd": args.lm_sgd_lr}
        self.max_len = max(self.seq, args.lm_val_seq)

    def model(self):
        return TinyTransformerLM(self.vocab, self.max_len)


class LargerTransformerLMTask(TransformerLMTask):
    """A transformer 12x the small one's size (width 128, 4 layers, 4 heads,
    feed-forward 512: 0.8 M parameters) on CodeData, which it does not
    overfit within the runs here."""
    name = "transformer_large"
    data = CodeData

    def __init__(self, args):
        super().__init__(args)
        self.lr = {"adam": args.tflarge_lr, "sgd": args.lm_sgd_lr}

    def model(self):
        return TinyTransformerLM(self.vocab, self.max_len, d=128, layers=4, heads=4, ff=512)


class TabularTask:
    """A tabular MLP. tabular_small: sklearn's breast-cancer data (569 rows,
    30 features; stratified 80/20 split, 455 training rows), which an MLP
    overfits within a few epochs. tabular_large: a fixed synthetic
    4-class problem (sklearn make_classification, 20,000 rows, 32 features,
    random_state=0; 16,000 training rows). Features standardised with the
    training split's mean and std."""

    def __init__(self, args, name):
        from sklearn.model_selection import train_test_split
        self.name = name
        if name == "tabular_small":
            from sklearn.datasets import load_breast_cancer
            d = load_breast_cancer()
            x, y, hidden = d.data, d.target, 64
            self.batch, adam_lr = args.tab_small_batch, args.tab_small_lr
        else:
            from sklearn.datasets import make_classification
            x, y = make_classification(n_samples=20000, n_features=32, n_informative=16,
                                       n_redundant=8, n_classes=4, n_clusters_per_class=2,
                                       class_sep=1.0, flip_y=0.02, random_state=0)
            hidden = 128
            self.batch, adam_lr = args.tab_large_batch, args.tab_large_lr
        tr, te = train_test_split(torch.arange(len(y)).numpy(), test_size=0.2, random_state=0,
                                  stratify=y)
        x = torch.tensor(x, dtype=torch.float32)
        y = torch.tensor(y, dtype=torch.int64)
        mu, sd = x[tr].mean(0), x[tr].std(0).clamp_min(1e-6)
        x = (x - mu) / sd
        self.xtr, self.ytr, self.xte, self.yte = x[tr], y[tr], x[te], y[te]
        self.nin, self.nout, self.hidden = x.shape[1], int(y.max()) + 1, hidden
        self.lr = {"adam": adam_lr, "sgd": args.digits_sgd_lr}

    def model(self):
        h = self.hidden
        return torch.nn.Sequential(torch.nn.Linear(self.nin, h), torch.nn.ReLU(),
                                   torch.nn.Linear(h, h), torch.nn.ReLU(),
                                   torch.nn.Linear(h, self.nout))

    batch_for = DigitsTask.batch_for
    loss = DigitsTask.loss
    evaluate = DigitsTask.evaluate


class CharGRU(torch.nn.Module):
    def __init__(self, vocab, emb=32, hidden=128):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, emb)
        self.rnn = torch.nn.GRU(emb, hidden, batch_first=True)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.head(h)


class GatedConvLM(torch.nn.Module):
    """Embedding 32 -> 4 gated causal conv layers (48 channels, kernel 3,
    dilations 1, 2, 4, 8; GLU, residual) -> linear head."""

    def __init__(self, vocab, emb=32, channels=48, dilations=(1, 2, 4, 8)):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, emb)
        self.inp = torch.nn.Conv1d(emb, channels, 1)
        self.convs = torch.nn.ModuleList(
            torch.nn.Conv1d(channels, 2 * channels, 3, dilation=d) for d in dilations)
        self.dilations = dilations
        self.head = torch.nn.Linear(channels, vocab)

    def forward(self, x):
        h = self.inp(self.emb(x).transpose(1, 2))
        for conv, d in zip(self.convs, self.dilations):
            z = conv(torch.nn.functional.pad(h, (2 * d, 0)))  # causal: pad the past only
            h = h + torch.nn.functional.glu(z, dim=1)
        return self.head(h.transpose(1, 2))


class TinyTransformerLM(torch.nn.Module):
    """Embedding + learnt positions (64), 2 pre-norm causal layers (4 heads,
    feed-forward 128, no dropout), final norm, linear head."""

    def __init__(self, vocab, max_len, d=64, layers=2, heads=4, ff=128):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.zeros(max_len, d))
        torch.nn.init.normal_(self.pos, std=0.02)
        layer = torch.nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True,
                                                 norm_first=True)
        self.body = torch.nn.TransformerEncoder(layer, layers)
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, x):
        n = x.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf")), diagonal=1)
        h = self.body(self.emb(x) + self.pos[:n], mask=mask)
        return self.head(self.norm(h))


# name: (what builds it, default steps, label in the tables)
TASKS = {
    "digits": (DigitsTask, 300, "digits (MLP)"),
    "digits_cnn": (DigitsCNNTask, 300, "digits (CNN)"),
    "charlm": (CharLMTask, 160, "charlm (GRU)"),
    "charcnn": (CharCNNTask, 300, "charcnn (gated conv LM)"),
    "transformer": (TransformerLMTask, 300, "transformer LM"),
    "transformer_large": (LargerTransformerLMTask, 2000, "transformer LM, 0.8 M (code text)"),
    "tabular_small": (lambda a: TabularTask(a, "tabular_small"), 300,
                      "tabular, 455 rows (MLP)"),
    "tabular_large": (lambda a: TabularTask(a, "tabular_large"), 600,
                      "tabular, 16k rows (MLP)"),
}
DEFAULT_TASKS = "charcnn,tabular_small,digits_cnn,charlm,digits,tabular_large,transformer"


def make_task(name, args):
    return TASKS[name][0](args)


def steps_of(spec, task):
    """--steps: empty (each task's default), N (every task) or task=N,..."""
    steps = TASKS[task][1]
    for part in filter(None, (spec or "").split(",")):
        if "=" not in part:
            steps = int(part)
        elif part.split("=")[0] == task:
            steps = int(part.split("=")[1])
    return steps


# ------------------------------------------------------------- training ----

def flat_grad(params):
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in params])


def unflat_grad(params, flat):
    off = 0
    for p in params:
        n = p.numel()
        p.grad = flat[off:off + n].view_as(p).clone()
        off += n


def train_one(task, method, seed, steps, rank, world, args):
    import squall
    import squall.optim

    method, _, at = method.partition("@")  # a SlowMo method at its own period: name@TAU
    tau = int(at) if at else args.tau

    torch.manual_seed(seed)  # identical init on every rank
    model = task.model()
    params = [p for p in model.parameters()]
    nparam = sum(p.numel() for p in params)
    sgd = method in ("local_sgd", "slowmo_sgd")
    lr = task.lr["sgd" if sgd else "adam"]
    comp = None
    if method in ("adam", "naive_onebit"):
        opt = torch.optim.AdamW(params, lr=lr, eps=args.eps, weight_decay=0.0)
        if method == "naive_onebit":
            comp = squall.Compressor(None, nparam, "onebit")
    elif method == "apmsqueeze":
        # the library's defaults, except what the command line sets explicitly
        kw = {k: v for k, v in (("warmup", args.warmup), ("codec", args.apm_codec),
                                 ("warmup_codec", args.apm_warmup_codec),
                                 ("max_update", args.apm_max_update),
                                 ("freeze_threshold", args.apm_freeze_threshold),
                                 ("freeze_window", args.apm_freeze_window),
                                 ("compressed_algo", args.apm_algo)) if v is not None}
        opt = squall.optim.APMSqueeze(params, lr=lr, eps=args.eps, weight_decay=0.0,
                                      total_steps=steps, guard=bool(args.apm_guard), **kw)
    elif method in APM_VARIANTS:
        opt = squall.optim.APMSqueeze(params, lr=lr, eps=args.eps, weight_decay=0.0,
                                      total_steps=steps, **APM_VARIANTS[method][0])
    elif method == "apmsqueeze_old":
        opt = squall.optim.APMSqueeze(params, lr=lr, eps=args.eps, weight_decay=0.0,
                                      warmup=0.15, total_steps=steps, codec="onebit:block=2048",
                                      freeze_threshold=0, compressed_algo="time",
                                      warmup_codec="none")
    elif method in ("slowmo_adam", "periodic_adam") or method in SLOWMO_CODECS:
        base = torch.optim.AdamW(params, lr=lr, eps=args.eps, weight_decay=0.0)
        beta = 0.0 if method == "periodic_adam" else args.slowmo_beta
        code = SLOWMO_CODECS.get(method)
        opt = squall.optim.SlowMo(base, tau=tau, alpha=1.0, beta=beta,
                                  mode="full" if code is None else "compressed",
                                  codec=code or "onebit")
    elif method in SLOWMO_FORMS:
        kw = dict(SLOWMO_FORMS[method][0])
        for k in ("fragments", "delay"):
            if k in kw and kw[k] is None:
                kw[k] = getattr(args, k)
        base = torch.optim.AdamW(params, lr=lr, eps=args.eps, weight_decay=0.0)
        opt = squall.optim.SlowMo(base, tau=tau, **kw)
    elif sgd:
        opt = squall.optim.SlowMo(torch.optim.SGD(params, lr=lr, momentum=0.9), tau=tau,
                                  alpha=1.0, beta=0.0 if method == "local_sgd" else
                                  args.slowmo_sgd_beta, mode="full")
    else:
        raise ValueError(method)
    comm = squall.get_default()
    # the same schedule for every method: cosine from lr to lr/10 over the run
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=lr / 10)

    losses, bytes_cum, evals, vchange = [], [], [], []
    # counted by the library where it hands messages to the transport, from the start of the
    # loop on (streamed SlowMo's syncs move bytes between its steps)
    start = comm.stats["bytes_sent"]
    v_snap = None
    t0 = time.time()
    for step in range(steps):
        batch = task.batch_for(seed, step, rank, world)
        opt.zero_grad(set_to_none=True)
        loss = task.loss(model, batch)
        loss.backward()
        if method == "adam":
            g = flat_grad(params)
            squall.allreduce(g)  # full precision average
            unflat_grad(params, g)
        elif method == "naive_onebit":
            g = flat_grad(params)
            squall.allreduce(g, compressor=comp)
            unflat_grad(params, g)
        opt.step()
        sent = comm.stats["bytes_sent"] - start
        sched.step()
        if method == "adam" and (step + 1) % args.vchange_window == 0:
            # the adaptive warmup's signal, on full-precision Adam's own v (for
            # choosing the threshold): relative L1 change of v_hat over the window
            v = torch.cat([opt.state[p]["exp_avg_sq"].reshape(-1) for p in params]).double()
            v = v / (1 - 0.999 ** (step + 1))
            if v_snap is not None and float(v.sum()) > 0:
                vchange.append((step + 1, float((v - v_snap).abs().sum() / v.sum())))
            v_snap = v
        losses.append(float(loss))
        bytes_cum.append(sent)
        # evaluate at multiples of eval_every (multiples of tau: SlowMo ranks are synced)
        if rank == 0 and ((step + 1) % args.eval_every == 0 or step + 1 == steps):
            e = task.evaluate(model)
            e["step"] = step + 1
            evals.append(e)
    elapsed = time.time() - t0
    extra = {"vchange": vchange} if vchange else {}
    if method.startswith("apm"):
        inf = opt.info()
        extra = {"warmup_steps": inf["warmup_steps"], "skipped_steps": inf["skipped_steps"]}
        opt.close()
    if comp is not None:
        extra = {"compressor_calls": comp.stats["calls"],
                 "skipped_calls": comp.stats["skipped_calls"]}
        comp.close()
    # replicas of the methods that keep them equal every step: compared bit for bit
    digest = None
    if method == "adam" or method == "naive_onebit" or method.startswith("apm"):
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
    return {"losses": losses, "bytes": bytes_cum, "evals": evals, "nparam": nparam,
            "digest": digest,
            "elapsed_s": elapsed, "lr": lr, **extra}


def _clock(seconds):
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Run k of N, elapsed and an ETA: the time per training step so far, per
    task (their steps cost differently), times the steps still planned."""

    def __init__(self, plan):
        self.plan, self.done, self.t0 = plan, 0, time.time()
        self.spent = {}  # task -> (seconds, steps) of finished runs
        self.run_t0 = self.t0

    def start(self, task, method, seed, steps):
        self.run_t0 = time.time()
        print(f"[run {self.done + 1}/{len(self.plan)}] {task} seed={seed} {method} ({steps} "
              f"steps) ...; elapsed {_clock(self.run_t0 - self.t0)}, ETA {self.eta()}",
              flush=True)
        self.task = task

    def finish(self, steps):
        secs, n = self.spent.get(self.task, (0.0, 0))
        self.spent[self.task] = (secs + time.time() - self.run_t0, n + steps)
        self.done += 1
        return f"[{self.done}/{len(self.plan)} done, ETA {self.eta()}]"

    def eta(self):
        rest = self.plan[self.done:]
        if not rest:
            return _clock(0)
        known = [s / n for s, n in self.spent.values() if n]
        if not known:
            return "unknown (after the first run)"
        fallback = sum(known) / len(known)
        total = 0.0
        for task, _, _, steps in rest:
            s, n = self.spent.get(task, (0.0, 0))
            total += steps * (s / n if n else fallback)
        return _clock(total)


def worker(rank, world, port, args, plan, out_path):
    os.environ.update(ENV)
    torch.set_num_threads(1)
    import torch.distributed as dist
    import squall

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=600))
    squall.init()
    tasks = {}
    records, meta = [], {}
    if rank == 0 and os.path.exists(out_path) and args.resume:
        with open(out_path) as f:
            records = json.load(f)["runs"]
    progress = Progress(plan) if rank == 0 else None
    for task_name, method, seed, steps in plan:
        if progress is not None:
            progress.start(task_name, method, seed, steps)
        if task_name not in tasks:
            tasks[task_name] = make_task(task_name, args)
        task = tasks[task_name]
        r = train_one(task, method, seed, steps, rank, world, args)
        # gather per-rank losses and bytes (measurement only; not counted)
        allr = [None] * world
        dist.all_gather_object(allr, {"losses": r["losses"], "bytes": r["bytes"][-1],
                                      "elapsed_s": r["elapsed_s"], "digest": r["digest"]})
        if rank == 0:
            losses = torch.tensor([a["losses"] for a in allr]).mean(0).tolist()
            rec = {"task": task_name, "method": method, "seed": seed, "steps": steps,
                   "world": world,
                   **{k: v for k, v in r.items() if k not in ("losses", "digest")},
                   "train_loss": losses,
                   "bytes_per_rank_final": [a["bytes"] for a in allr],
                   "elapsed_max_s": max(a["elapsed_s"] for a in allr)}
            if r["digest"] is not None:
                rec["replicas_identical"] = len({a["digest"] for a in allr}) == 1
            records = [x for x in records if not (x["task"] == task_name and
                       x["method"] == method and x["seed"] == seed)] + [rec]
            meta.update({"args": vars(args), "world": world,
                         "compressed_algo": os.environ.get("SQUALL_COMPRESSED_ALGO", "auto")})
            if task_name.startswith("digits"):
                meta[task_name] = {"dropped_pixels": task.dropped, "inputs": task.nin}
            if isinstance(task, CharLMTask):
                meta[task_name] = {"files": task.files, "chars": task.nchars,
                                   "vocab": task.vocab}
            with open(out_path + ".tmp", "w") as f:
                json.dump({"meta": meta, "runs": records}, f)
            os.replace(out_path + ".tmp", out_path)
            last = rec["evals"][-1]
            print(f"[{task_name} seed={seed} {method:>13}] {r['elapsed_s']:.0f}s "
                  f"final {last} bytes/rank {rec['bytes_per_rank_final'][0]:.3g} "
                  f"{progress.finish(steps)}", flush=True)
    squall.shutdown()
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------- report ----

def _mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs)


def _std(xs):  # sample std; NaN/inf pass through (statistics.stdev raises on them)
    xs = list(xs)
    if len(xs) < 2:
        return 0.0
    mu = _mean(xs)
    return math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1))


def summarize(runs):
    out = {}
    for task in sorted({r["task"] for r in runs}):
        rows = {}
        adam_bytes = None
        for m in METHODS:
            rs = [r for r in runs if r["task"] == task and r["method"] == m]
            if not rs:
                continue
            keys = [k for k in rs[0]["evals"][-1] if k != "step"]
            keys.append("final_train_loss")
            vals = {}
            for k in keys:
                if k == "final_train_loss":  # mean over the last 10% of steps
                    xs = [sum(r["train_loss"][-max(1, len(r["train_loss"]) // 10):]) /
                          max(1, len(r["train_loss"]) // 10) for r in rs]
                else:
                    xs = [r["evals"][-1][k] for r in rs]
                vals[k] = (_mean(xs), _std(xs))
            b = _mean(sum(r["bytes_per_rank_final"]) / len(r["bytes_per_rank_final"])
                                for r in rs)
            bmax = _mean(max(r["bytes_per_rank_final"]) for r in rs)
            if m == "adam":
                adam_bytes = b
            rows[m] = {"n_seeds": len(rs), "metrics": vals, "bytes_per_rank": b,
                       "bytes_max_rank": bmax}
        for m in rows:
            rows[m]["bytes_vs_adam"] = (adam_bytes / rows[m]["bytes_per_rank"]
                                        if adam_bytes and rows[m]["bytes_per_rank"] else None)
        out[task] = rows
    return out


def markdown_table(summary):
    lines = []
    for task, rows in summary.items():
        keys = list(next(iter(rows.values()))["metrics"].keys())
        lines.append(f"### {task}\n")
        lines.append("| method | seeds | " + " | ".join(keys) +
                     " | MB sent / rank (mean) | MB sent, busiest rank | Adam bytes / method bytes |")
        lines.append("|---" * (len(keys) + 5) + "|")
        for m, row in rows.items():
            cells = []
            for k in keys:
                mu, sd = row["metrics"][k]
                cells.append(f"{mu:.2f} ± {sd:.2f}" if k.endswith("acc") else
                             f"{mu:.4f} ± {sd:.4f}")
            ratio = row["bytes_vs_adam"]
            lines.append(f"| {LABELS[m]} | {row['n_seeds']} | " + " | ".join(cells) +
                         f" | {row['bytes_per_rank'] / 1e6:.3f} | {row['bytes_max_rank'] / 1e6:.3f} | "
                         f"{'%.1fx' % ratio if ratio else '-'} |")
        lines.append("")
    return "\n".join(lines)


def plot(runs, outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    palette = ["k", "tab:red", "tab:pink", "tab:orange", "tab:cyan", "tab:blue", "tab:purple",
               "tab:green", "tab:olive", "tab:brown", "tab:gray", "gold", "lime", "navy",
               "teal", "salmon"]
    colors = {m: palette[i % len(palette)] for i, m in enumerate(METHODS)}
    paths = []
    for task in sorted({r["task"] for r in runs}):
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), dpi=80)
        for m in METHODS:
            rs = [r for r in runs if r["task"] == task and r["method"] == m]
            if not rs:
                continue
            n = min(len(r["train_loss"]) for r in rs)
            mean = torch.tensor([r["train_loss"][:n] for r in rs]).mean(0)
            w = max(1, n // 30)  # moving average for readability
            sm = torch.nn.functional.avg_pool1d(mean.view(1, 1, -1), w, 1).view(-1)
            steps = torch.arange(len(sm)) + w
            bts = torch.tensor([sum(r["bytes"][:n][i] for r in rs) / len(rs)
                                for i in range(n)])[w - 1:]
            axes[0].plot(steps.tolist(), sm.tolist(), color=colors[m], label=LABELS[m], lw=1.2)
            ok = bts > 0
            axes[1].plot(bts[ok].tolist(), sm[ok].tolist(), color=colors[m], lw=1.2)
        axes[0].set_xlabel("step")
        axes[0].set_ylabel(f"train loss (mean over ranks & {len(set(r['seed'] for r in runs if r['task'] == task))} seeds, smoothed)")
        axes[1].set_xscale("log")
        axes[1].set_xlabel("cumulative bytes sent by rank 0 (the busiest)")
        axes[1].set_ylabel("train loss")
        for a in axes:
            a.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{task}: {runs[0]['world']} ranks")
        fig.tight_layout()
        p = os.path.join(outdir, f"{task}_loss.png")
        fig.savefig(p)
        plt.close(fig)
        paths.append(p)
    return paths


def _metric_keys(runs, task):
    """(loss key, accuracy key) of a task's evaluations."""
    e = next(r["evals"][-1] for r in runs if r["task"] == task)
    loss = next(k for k in e if k.endswith("_loss"))
    acc = next(k for k in e if k.endswith("_acc"))
    return loss, acc


def _paired(runs, task, method, key, unit):
    """Per seed, method - Adam on the same seed: points, or % of Adam's loss."""
    adam = {r["seed"]: r["evals"][-1][key] for r in runs
            if r["task"] == task and r["method"] == "adam"}
    d = [(r["evals"][-1][key] - adam[r["seed"]]) * (1.0 if unit == "points" else
                                                   100.0 / adam[r["seed"]])
         for r in runs if r["task"] == task and r["method"] == method and r["seed"] in adam]
    return (_mean(d), d) if d else (None, [])


def verdicts(runs):
    """Per task: the paired deltas of every method and whether the goals hold.
    APMSqueeze (defaults): >= 8x fewer bytes, loss within +2%, accuracy within
    -0.5 points. SlowMo: loss and accuracy at least those of periodic
    averaging of the same base optimizer (paired means)."""
    summary = summarize(runs)
    out = {}
    for task in [t for t in TASKS if t in summary]:
        lk, ak = _metric_keys(runs, task)
        rows = {}
        for m, row in summary[task].items():
            dl, dls = _paired(runs, task, m, lk, "%")
            da, das = _paired(runs, task, m, ak, "points")
            ws = [r["warmup_steps"] for r in runs if r["task"] == task and r["method"] == m
                  and r.get("warmup_steps") is not None]
            same = [r["replicas_identical"] for r in runs if r["task"] == task and
                    r["method"] == m and "replicas_identical" in r]
            rows[m] = {"loss": row["metrics"][lk], "acc": row["metrics"][ak], "d_loss": dl,
                       "d_loss_seeds": dls, "d_acc": da, "d_acc_seeds": das,
                       "ratio": row["bytes_vs_adam"], "mb": row["bytes_per_rank"] / 1e6,
                       "warmup": ws, "seeds": row["n_seeds"],
                       "identical": (all(same) if same else None)}
        apm, per, slo = rows.get("apmsqueeze"), rows.get("periodic_adam"), rows.get("slowmo_adam")
        goal = {}
        if apm and apm["d_loss"] is not None:
            goal["apmsqueeze"] = [name for name, ok in (
                ("bytes", apm["ratio"] >= 8.0), ("loss", apm["d_loss"] <= 2.0),
                ("accuracy", apm["d_acc"] >= -0.5)) if not ok]
        if per and slo and per["d_loss"] is not None:
            goal["slowmo_adam"] = [name for name, ok in (
                ("loss", slo["d_loss"] <= per["d_loss"]),
                ("accuracy", slo["d_acc"] >= per["d_acc"])) if not ok]
        out[task] = {"rows": rows, "goal": goal, "loss_key": lk, "acc_key": ak,
                     "steps": next(r["steps"] for r in runs if r["task"] == task),
                     "nparam": next(r["nparam"] for r in runs if r["task"] == task),
                     "world": next(r["world"] for r in runs if r["task"] == task)}
    return out


def _goal_cell(missed):
    return "met" if not missed else "**missed**: " + ", ".join(missed)


def _range(xs):
    return "–" if not xs else (f"{min(xs)}" if min(xs) == max(xs) else f"{min(xs)}–{max(xs)}")


def vchange_table(runs, steps=(16, 24, 32, 40, 48, 56), seeds=(0, 1)):
    """The adaptive warmup's signal on full-precision Adam's own v (the Adam
    runs' log): the relative change over the window ending at each step."""
    rows = []
    for task in TASKS:
        logs = {r["seed"]: dict(map(tuple, r["vchange"])) for r in runs
                if r["task"] == task and r["method"] == "adam" and r.get("vchange")
                and r["seed"] in seeds}
        if logs:
            rows.append(f"| {TASKS[task][2]} | " + " | ".join(
                ", ".join(f"{logs[sd][st]:.2f}" for sd in sorted(logs) if st in logs[sd]) or "–"
                for st in steps) + " |")
    if not rows:
        return ""
    return ("The warmup's signal on Adam's own variance (relative change over the 8 steps "
            f"ending at each step; seeds {', '.join(map(str, seeds))}): the default "
            "threshold is 0.2.\n\n| family | " + " | ".join(str(st) for st in steps) + " |\n"
            + "|---" * (len(steps) + 1) + "|\n" + "\n".join(rows) + "\n")


def goal_tables(runs):
    """docs/convergence.md's tables: the goal per family, what each part of
    the defaults costs, then every method per family, all paired against
    Adam of the same seeds."""
    v = verdicts(runs)
    out = ["| family | parameters, steps, seeds | bytes vs Adam (≥ 8x) | loss vs Adam (≤ +2%) "
           "| accuracy vs Adam (≥ −0.5 points) | warmup steps | APMSqueeze | SlowMo vs periodic "
           "(loss; points) | SlowMo |", "|---|---|---|---|---|---|---|---|---|"]
    for task, t in v.items():
        a = t["rows"].get("apmsqueeze")
        if a is None or a["d_loss"] is None:
            continue
        s, p = t["rows"].get("slowmo_adam"), t["rows"].get("periodic_adam")
        sp = (f"{s['d_loss'] - p['d_loss']:+.1f}%; {s['d_acc'] - p['d_acc']:+.2f}"
              if s and p and s["d_loss"] is not None and p["d_loss"] is not None else "–")
        out.append(f"| {TASKS[task][2]} | {t['nparam']:,}, {t['steps']}, {a['seeds']} | "
                   f"{a['ratio']:.1f}x | {a['d_loss']:+.2f}% | {a['d_acc']:+.2f} | "
                   f"{_range(a['warmup'])} | {_goal_cell(t['goal'].get('apmsqueeze', []))} | "
                   f"{sp} | {_goal_cell(t['goal']['slowmo_adam']) if 'slowmo_adam' in t['goal'] else '–'} |")
    out.append("")
    variants = [m for m in ["apmsqueeze"] + list(APM_VARIANTS) + ["apmsqueeze_old"]
                if any(m in t["rows"] for t in v.values())]
    if len(variants) > 1:
        fams = [task for task in v if "apmsqueeze" in v[task]["rows"]]
        out.append("What each part of the defaults costs: APMSqueeze with one setting changed, "
                   "paired against Adam (loss %; accuracy points; bytes ratio).\n")
        out.append("| variant | " + " | ".join(TASKS[f][2] for f in fams) + " |")
        out.append("|---" * (len(fams) + 1) + "|")
        for m in variants:
            cells = []
            for f in fams:
                r = v[f]["rows"].get(m)
                cells.append("–" if r is None or r["d_loss"] is None else
                             f"{r['d_loss']:+.1f}%; {r['d_acc']:+.2f}; {r['ratio']:.1f}x")
            out.append(f"| {LABELS[m]} | " + " | ".join(cells) + " |")
        out.append("")
    out.append(vchange_table(runs))
    for task, t in v.items():
        out.append(f"**{TASKS[task][2]}**: {t['nparam']:,} parameters, {t['steps']} steps, "
                   f"{t['world']} ranks; {t['loss_key']} and {t['acc_key']} at the last step.\n")
        out.append("| method | seeds | loss | vs Adam | accuracy (%) | vs Adam (points) | "
                   "MB sent / rank | Adam bytes / method bytes | warmup steps | replicas |")
        out.append("|---|---|---|---|---|---|---|---|---|---|")
        for m, r in t["rows"].items():
            ident = {True: "identical", False: "**differ**", None: "–"}[r["identical"]]
            dl = "–" if m == "adam" else f"{r['d_loss']:+.2f}%"
            da = "–" if m == "adam" else f"{r['d_acc']:+.2f}"
            out.append(f"| {LABELS[m]} | {r['seeds']} | {r['loss'][0]:.4f} ± {r['loss'][1]:.4f} | "
                       f"{dl} | {r['acc'][0]:.2f} ± {r['acc'][1]:.2f} | {da} | {r['mb']:.2f} | "
                       f"{r['ratio']:.1f}x | {_range(r['warmup'])} | {ident} |")
        per = [(m, t["rows"][m]) for m in ("apmsqueeze", "slowmo_adam", "periodic_adam")
               if m in t["rows"]]
        if per:
            out.append("")
            out.append("Per seed vs Adam (loss %, accuracy points): " + "; ".join(
                f"{LABELS[m].split(' (')[0]} " + ", ".join(
                    f"{x:+.1f}%/{y:+.2f}" for x, y in zip(r["d_loss_seeds"], r["d_acc_seeds"]))
                for m, r in per) + ".")
        out.append("")
    return "\n".join(out)


DOC = os.path.join(HERE, "..", "..", "docs", "convergence.md")
BEGIN, END = "<!-- study:begin (run_study.py --doc writes this) -->", "<!-- study:end -->"


def write_doc(res):
    write_between_markers(DOC, BEGIN, END, goal_tables(res["runs"]))


def report(out_path, outdir, doc=False):
    with open(out_path) as f:
        res = json.load(f)
    summary = summarize(res["runs"])
    with open(os.path.join(outdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    table = markdown_table(summary)
    with open(os.path.join(outdir, "table.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # the runs and tables are written; only the pictures need it
        print("no matplotlib in this Python: plots skipped (pip install matplotlib, then "
              "rerun with --plots-only)")
    else:
        for p in plot(res["runs"], outdir):
            print("wrote", p, os.path.getsize(p), "bytes")
    if doc:
        write_doc(res)


def parser():
    """The study's options (perf/fsdp/study.py takes the tasks' from here)."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--tasks", default=DEFAULT_TASKS, help="from: " + ",".join(TASKS))
    ap.add_argument("--methods", default=DEFAULT_METHODS,
                    help="comma-separated, from: " + ",".join(METHODS))
    ap.add_argument("--seeds", type=int, default=5, help="seeds of every task")
    ap.add_argument("--steps", default="",
                    help="N (every task) or task=N,...; default: each task's own (" +
                         ", ".join(f"{t} {v[1]}" for t, v in TASKS.items()) + ")")
    ap.add_argument("--digits-batch", type=int, default=64, help="global batch")
    ap.add_argument("--digits-drop-constant", type=int, default=0,
                    help="drop input pixels constant (0) over the training set (1/0)")
    ap.add_argument("--digits-lr", type=float, default=3e-3)
    ap.add_argument("--digits-sgd-lr", type=float, default=0.1)
    ap.add_argument("--lm-batch", type=int, default=16, help="global batch (sequences)")
    ap.add_argument("--lm-seq", type=int, default=32)
    ap.add_argument("--lm-hidden", type=int, default=96, help="GRU width")
    ap.add_argument("--lm-lr", type=float, default=3e-3)
    ap.add_argument("--lm-sgd-lr", type=float, default=0.5)
    ap.add_argument("--cnnlm-seq", type=int, default=64, help="charcnn's windows")
    ap.add_argument("--cnnlm-lr", type=float, default=3e-3)
    ap.add_argument("--tflm-seq", type=int, default=32, help="transformer's windows")
    ap.add_argument("--tflm-lr", type=float, default=3e-3)
    ap.add_argument("--tflarge-lr", type=float, default=1e-3, help="transformer_large's")
    ap.add_argument("--tab-small-batch", type=int, default=32, help="global batch")
    ap.add_argument("--tab-small-lr", type=float, default=3e-3)
    ap.add_argument("--tab-large-batch", type=int, default=128, help="global batch")
    ap.add_argument("--tab-large-lr", type=float, default=3e-3)
    ap.add_argument("--lm-val-seq", type=int, default=128)
    ap.add_argument("--lm-val-windows", type=int, default=48)
    ap.add_argument("--warmup", type=float, default=None,
                    help="APMSqueeze warmup fraction (default: the library's)")
    ap.add_argument("--apm-freeze-threshold", type=float, default=None,
                    help="APMSqueeze adaptive warmup threshold (0: fixed warmup)")
    ap.add_argument("--apm-freeze-window", type=int, default=None)
    ap.add_argument("--apm-algo", default=None, help="bytes, time, twophase, allgather")
    ap.add_argument("--apm-warmup-codec", default=None, help="none, fp16, bf16")
    ap.add_argument("--slowmo-beta", type=float, default=0.5, help="SlowMo over Adam")
    ap.add_argument("--slowmo-sgd-beta", type=float, default=0.5, help="SlowMo over SGD")
    ap.add_argument("--vchange-window", type=int, default=8,
                    help="window of the variance-change log of the Adam runs")
    ap.add_argument("--eps", type=float, default=1e-8, help="Adam eps (every Adam method)")
    ap.add_argument("--apm-codec", default=None, help="APMSqueeze's codec (default: the library's)")
    ap.add_argument("--apm-guard", type=int, default=1,
                    help="APMSqueeze's guard (1, default) or the plain update (0)")
    ap.add_argument("--apm-max-update", type=float, default=None,
                    help="APMSqueeze's clip (default: the bound of Adam for the betas)")
    ap.add_argument("--tau", type=int, default=12)
    ap.add_argument("--fragments", type=int, default=4, help="streamed SlowMo's fragments")
    ap.add_argument("--delay", type=int, default=2, help="streamed SlowMo's delay (steps)")
    ap.add_argument("--eval-every", type=int, default=48)
    ap.add_argument("--quick", action="store_true", help="1 seed, 48 steps: smoke test")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="the seeds are first-seed .. first-seed + seeds - 1")
    ap.add_argument("--resume", action="store_true",
                    help="keep runs already in results.json (others are replaced)")
    ap.add_argument("--plots-only", action="store_true")
    ap.add_argument("--replot-all", action="store_true",
                    help="re-make table.md, summary.json and the plots of every results.json "
                         "under --out (the study and all its variants), then exit")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--doc", action="store_true",
                    help="also rewrite the goal tables of docs/convergence.md from results.json")
    return ap


def register_periods(methods):
    """Methods named name@TAU (a SlowMo method at period TAU) join the tables."""
    for m in methods.split(","):
        name, _, at = m.partition("@")
        if at and m not in METHODS:
            METHODS.append(m)
            LABELS[m] = f"{LABELS[name]}, tau={int(at)}"


def main():
    args = parser().parse_args()
    register_periods(args.methods)
    if args.quick:
        args.seeds, args.steps = 1, "48"
        args.eval_every = 24
    os.makedirs(args.out, exist_ok=True)
    if args.replot_all:
        found = sorted(d for d, _, files in os.walk(args.out) if "results.json" in files)
        for i, d in enumerate(found):
            print(f"[{i + 1}/{len(found)}] {os.path.relpath(d, args.out) or '.'}", flush=True)
            report(os.path.join(d, "results.json"), d)
        return 0
    out_path = os.path.join(args.out, "results.json")
    if not args.plots_only:
        plan = []
        for t in args.tasks.split(","):
            steps = steps_of(args.steps, t)
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                for m in args.methods.split(","):
                    plan.append((t, m, seed, steps))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        t0 = time.time()
        mp.start_processes(worker, args=(args.world, port, args, plan, out_path),
                           nprocs=args.world, join=True, start_method="spawn")
        print(f"study took {time.time() - t0:.0f} s", flush=True)
    report(out_path, args.out, doc=args.doc)


if __name__ == "__main__":
    sys.exit(main())
