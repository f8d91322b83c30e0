"""How many levels, and which scale, for 2- and 4-bit gradient codes.

Simulates, in one process, an n-rank momentum-SGD data-parallel job whose
gradients go through a compressed two-phase allreduce with error feedback (a
worker residual per rank, a server residual per chunk), as the interposer
runs an unmodified job: the MLP and data of
tests/plugin/preload/horovod_train.py, 400 steps at a constant learning rate.
Prints the mean loss of the last 50 steps against the same run uncompressed.

  levels_sim.py CODES NRANKS BLOCK [SEEDS]      (HID=64 for a smaller MLP)
  e.g. levels_sim.py onebit,t2max,m2max,s4max 4 2048 2

Codes: onebit; int8; t2* ternary (s = max, or c * mean|z|); m2* the 2-bit
mid-rise code +-s/2, +-3s/2; s4* symmetric +-7; m4max mid-rise 16 levels.
docs/codecs.md ("Choosing the levels") has the results.
"""
import math
import os
import sys

import torch
torch.set_num_threads(1)

def blocks(z, B):
    n = z.numel(); pad = (-n) % B
    zz = torch.cat([z, z.new_zeros(pad)]) if pad else z
    return zz.view(-1, B), n

def q_onebit(z, B):
    zb, n = blocks(z, B)
    s = zb.abs().mean(1, keepdim=True)
    d = torch.where(zb >= 0, s, -s)
    return d.reshape(-1)[:n]

def q_sym(levels, scale_rule, c):
    # symmetric integers -L..L times s
    def f(z, B):
        zb, n = blocks(z, B)
        if scale_rule == "max":
            s = zb.abs().amax(1, keepdim=True) / levels
        elif scale_rule == "mean":
            s = c * zb.abs().mean(1, keepdim=True)
        elif scale_rule == "rms":
            s = c * zb.pow(2).mean(1, keepdim=True).sqrt()
        safe = torch.where(s > 0, s, torch.ones_like(s))
        q = torch.clamp(torch.round(zb / safe), -levels, levels)
        d = torch.where(s > 0, q * s, torch.zeros_like(zb))
        return d.reshape(-1)[:n]
    return f

def q_mid(levels, scale_rule, c):
    # mid-rise: 2*levels values +-(k+0.5) s, k = 0..levels-1 (no zero)
    def f(z, B):
        zb, n = blocks(z, B)
        if scale_rule == "max":
            s = zb.abs().amax(1, keepdim=True) / levels
        elif scale_rule == "mean":
            s = c * zb.abs().mean(1, keepdim=True)
        elif scale_rule == "rms":
            s = c * zb.pow(2).mean(1, keepdim=True).sqrt()
        safe = torch.where(s > 0, s, torch.ones_like(s))
        k = torch.clamp(torch.floor(zb.abs() / safe), 0, levels - 1)
        d = torch.sign(zb) * (k + 0.5) * s
        d = torch.where(zb == 0, (0.5 * s).expand_as(zb), d)
        d = torch.where(s > 0, d, torch.zeros_like(zb))
        return d.reshape(-1)[:n]
    return f

def q_int8(z, B):
    return q_sym(127, "max", 0)(z, B)

def data(seed=1234):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(10, 32, generator=g) * 0.8
    def draw(n):
        y = torch.randint(0, 10, (n,), generator=g)
        x = centers[y] + torch.randn(n, 32, generator=g)
        flip = torch.rand(n, generator=g) < 0.1
        y = torch.where(flip, torch.randint(0, 10, (n,), generator=g), y)
        return x, y
    return draw(12000)

def run(codec, nranks, B, seed=0, steps=400, lr=0.05, hidden=int(os.environ.get("HID", "256"))):
    torch.manual_seed(seed)
    xt, yt = data()
    model = torch.nn.Sequential(torch.nn.Linear(32, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, 10))
    params = list(model.parameters())
    N = sum(p.numel() for p in params)
    mom = torch.zeros(N)
    cuts = []; o = 0
    for p in params:
        cuts.append((o, o + p.numel())); o += p.numel()
    ew = [torch.zeros(N) for _ in range(nranks)]
    chunk = math.ceil(N / nranks / B) * B
    es = torch.zeros(chunk * nranks)
    shards = [(xt[r::nranks], yt[r::nranks]) for r in range(nranks)]
    batch = 32; losses = []
    per = len(shards[0][0]) // batch
    for t in range(steps):
        i = (t % per) * batch
        gs = []; ls = 0
        for r in range(nranks):
            x, y = shards[r]
            model.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[i:i+batch]), y[i:i+batch])
            loss.backward(); ls += loss.item()
            gs.append(torch.cat([p.grad.reshape(-1) for p in params]))
        losses.append(ls / nranks)
        if codec is None:
            g = sum(gs) / nranks
        else:
            dec = []
            for r in range(nranks):
                z = gs[r] + ew[r]
                d = torch.cat([codec(z[a:b], B) for a, b in cuts]); ew[r] = z - d; dec.append(d)
            g = sum(dec) / nranks
            if nranks > 1:
                gp = torch.cat([g, g.new_zeros(chunk * nranks - N)])
                out = []
                for c in range(nranks):
                    z = gp[c*chunk:(c+1)*chunk] + es[c*chunk:(c+1)*chunk]
                    d = codec(z, B); es[c*chunk:(c+1)*chunk] = z - d; out.append(d)
                g = torch.cat(out)[:N]
        mom = 0.9 * mom + g
        with torch.no_grad():
            off = 0
            for p in params:
                k = p.numel(); p -= lr * mom[off:off+k].view_as(p); off += k
    return sum(losses[-50:]) / 50

if __name__ == "__main__":
    cands = {
        "onebit": q_onebit,
        "int8": q_int8,
        "t2max": q_sym(1, "max", 0),
        "t2mean1.0": q_sym(1, "mean", 1.0),
        "t2mean1.5": q_sym(1, "mean", 1.5),
        "t2mean2.0": q_sym(1, "mean", 2.0),
        "m2max": q_mid(2, "max", 0),
        "m2mean0.8": q_mid(2, "mean", 0.8),
        "m2mean1.2": q_mid(2, "mean", 1.2),
        "s4max": q_sym(7, "max", 0),
        "m4max": q_mid(8, "max", 0),
        "s4mean0.5": q_sym(7, "mean", 0.5),
        "s4mean0.35": q_sym(7, "mean", 0.35),
    }
    which = sys.argv[1].split(",")
    nr = int(sys.argv[2]); B = int(sys.argv[3]); seeds = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    base = [run(None, nr, B, seed=s) for s in range(seeds)]
    print("base", nr, B, [round(b, 4) for b in base], flush=True)
    for w in which:
        v = [run(cands[w], nr, B, seed=s) for s in range(seeds)]
        rel = [100 * (a - b) / b for a, b in zip(v, base)]
        print(f"{w:12s} np={nr} B={B} loss {[round(x,4) for x in v]} rel% {[round(r,2) for r in rel]}", flush=True)
