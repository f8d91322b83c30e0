#!/usr/bin/env python3
"""Four ordinary Horovod + PyTorch training jobs (they know nothing of Squall).

Each is a plain data-parallel Horovod script in the style of
tests/plugin/preload/horovod_train.py: hvd.DistributedOptimizer with
named_parameters (Horovod at its defaults, tensor fusion on),
broadcast_parameters from rank 0, torch.set_num_threads(1), synthetic or
fixed data from a fixed generator sharded by rank (rank::size), a per-rank
batch, a constant learning rate, and a fixed number of steps (cycling
through the shard).

  horovod_jobs.py JOB OUT.json [--steps 400] [--lr X] [--batch 32]

JOB:
  mlp     the MLP of horovod_train.py (32-256-256-10, its data: 10 Gaussian
          classes, 10% labels flipped), SGD momentum 0.9, lr 0.05
  cnn     conv(1->8,3x3) conv(8->16,3x3) maxpool2 linear(1024->64) linear(64->10)
          on synthetic 1x16x16 10-class images (shifted class templates plus
          noise, 10% labels flipped), SGD momentum 0.9, lr 0.05
  charlm  character LM: the next character from the 16 before it
          (embedding(V,32) of each, linear(512->256), linear(256->V)) in
          /usr/share/common-licenses/*, SGD momentum 0.9, lr 0.1
  adam    the same character LM trained with torch.optim.Adam, lr 2e-3

Rank 0 writes OUT.json: `losses` (every step's training loss, each rank's
loss averaged over ranks: gathered once at the end with hvd.allgather, as
horovod_train.py does, so no extra allreduce runs during training),
`loss_last50` (mean of the last 50), `identical` (every rank's flat
parameters equal bit for bit, gathered with hvd.allgather, which the
interposer does not touch), `steps`, `step_ms`, `train_s`, `ranks`, and the
model's gradient sizes (`params`, `tensors`, `params_in_tensors_ge_64k`: the
elements in tensors of at least 64 KiB of fp32, the only ones the
interposer compresses at its default SQUALL_PRELOAD_MIN_BYTES).
"""
import argparse
import glob
import json
import os
import time

import horovod.torch as hvd
import torch
import torch.nn.functional as F

import horovod_train  # the MLP job's data, the ranks' agreement

DEFAULT_LR = {"mlp": 0.05, "cnn": 0.05, "charlm": 0.1, "adam": 2e-3}


# ---------------------------------------------------------------- data
def mlp_data():
    """horovod_train.py's training set."""
    return horovod_train.data()[0]


def cnn_data(seed=4321, n=12000):
    """10 smooth random 16x16 templates; each sample is its class's template
    shifted by up to 2 pixels, scaled, plus pixel noise; 10% labels flipped."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(10, 1, 4, 4, generator=g)
    templates = F.interpolate(coarse, size=(20, 20), mode="bilinear", align_corners=False)
    templates = templates / templates.std(dim=(2, 3), keepdim=True)
    y = torch.randint(0, 10, (n,), generator=g)
    dx = torch.randint(0, 5, (n,), generator=g)
    dy = torch.randint(0, 5, (n,), generator=g)
    scale = 0.7 + 0.6 * torch.rand(n, generator=g)
    x = torch.empty(n, 1, 16, 16)
    for i in range(n):
        x[i] = templates[y[i], :, dy[i]:dy[i] + 16, dx[i]:dx[i] + 16] * scale[i]
    x += 1.2 * torch.randn(n, 1, 16, 16, generator=g)
    flip = torch.rand(n, generator=g) < 0.1
    y = torch.where(flip, torch.randint(0, 10, (n,), generator=g), y)
    return x, y


def text_data(context=16, n=12000):
    """Next-character prediction from the `context` characters before it, on
    the licence texts (files in sorted order, symlinked duplicates skipped;
    bytes outside printable ASCII and newline mapped to one 'other' symbol):
    n positions drawn with a fixed generator."""
    seen, text = set(), bytearray()
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        real = os.path.realpath(path)
        if real in seen or not os.path.isfile(real):
            continue
        seen.add(real)
        with open(real, "rb") as f:
            text += f.read()
    alphabet = [10] + list(range(32, 127))
    lookup = torch.full((256,), len(alphabet), dtype=torch.long)
    lookup[torch.tensor(alphabet)] = torch.arange(len(alphabet))
    ids = lookup[torch.tensor(list(text), dtype=torch.long)]
    g = torch.Generator().manual_seed(777)
    at = torch.randint(context, len(ids), (n,), generator=g)
    x = torch.stack([ids[i - context:i] for i in at.tolist()])
    return x, ids[at], len(alphabet) + 1


# ---------------------------------------------------------------- models
class CharLM(torch.nn.Module):
    """Embeds each of the context characters, then an MLP over all of them."""

    def __init__(self, vocab, context=16, emb=32, hidden=256):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, emb)
        self.mlp = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(context * emb, hidden),
                                       torch.nn.ReLU(), torch.nn.Linear(hidden, vocab))

    def forward(self, x):
        return self.mlp(self.emb(x))


def build(job):
    if job == "mlp":
        x, y = mlp_data()
        model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 10))
        loss_fn = F.cross_entropy
    elif job == "cnn":
        x, y = cnn_data()
        model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(),
                                    torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(),
                                    torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                                    torch.nn.Linear(16 * 8 * 8, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 10))
        loss_fn = F.cross_entropy
    elif job in ("charlm", "adam"):
        x, y, vocab = text_data()
        model = CharLM(vocab)
        loss_fn = F.cross_entropy
    else:
        raise SystemExit(f"unknown job {job}")
    return x, y, model, loss_fn


def main():
    p = argparse.ArgumentParser()
    p.add_argument("job", choices=["mlp", "cnn", "charlm", "adam"])
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--lr", type=float)
    p.add_argument("--batch", type=int, default=32)
    a = p.parse_args()
    lr = a.lr if a.lr is not None else DEFAULT_LR[a.job]

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, y, model, loss_fn = build(a.job)
    x, y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]
    if a.job == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=lr)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    per_epoch = len(x) // a.batch
    steps, spent, losses = 0, 0.0, []
    while steps < a.steps:
        for i in range(0, per_epoch * a.batch, a.batch):
            if steps == a.steps:
                break
            start = time.perf_counter()
            opt.zero_grad()
            loss = loss_fn(model(x[i:i + a.batch]), y[i:i + a.batch])
            loss.backward()
            opt.step()
            spent += time.perf_counter() - start
            losses.append(loss.item())
            steps += 1

    identical, mean = horovod_train.agreement(model, losses)
    sizes = [q.numel() for q in model.parameters()]
    if hvd.rank() == 0:
        with open(a.out, "w") as f:
            json.dump({"job": a.job, "lr": lr, "batch": a.batch, "ranks": hvd.size(),
                       "identical": identical, "steps": steps,
                       "loss_first50": sum(mean[:50]) / len(mean[:50]),
                       "loss_last50": sum(mean[-50:]) / len(mean[-50:]), "losses": mean,
                       "step_ms": 1000 * spent / max(steps, 1), "train_s": spent,
                       "params": sum(sizes), "tensors": sizes,
                       "params_in_tensors_ge_64k": sum(s for s in sizes if 4 * s >= 65536),
                       "shard_samples": len(x)}, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()
