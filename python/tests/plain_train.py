"""A training script that knows nothing of Squall: DDP over gloo, an
optimizer from torch.optim, a few steps; writes what it ended with."""

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)  # different initial models: DDP (or the optimizer) must equalise them
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
ddp = torch.nn.parallel.DistributedDataParallel(model)
kind = sys.argv[2]
if kind == "adamw":
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
else:
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
for step in range(int(sys.argv[3])):
    g = torch.Generator().manual_seed(100 * rank + step)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()
torch.save({"params": [p.detach().clone() for p in model.parameters()],
            "optimizer": type(opt).__module__ + "." + type(opt).__name__},
           os.path.join(sys.argv[1], f"rank{rank}.pt"))
dist.barrier()
dist.destroy_process_group()
