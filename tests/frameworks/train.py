"""One small training job, started the way each framework's users start it,
and knowing nothing of Squall: run plain, it is the baseline; run under
squallrun, it is what squallrun must compress without hanging.

    train.py LAUNCH OPTIMIZER STEPS OUT [PORT]

LAUNCH is how the ranks come to be:
  lightning-ddp, lightning-ddp_spawn   L.Trainer(strategy=...), devices=2; with ddp,
                                       rank 1 is started by Lightning itself
  lightning-squall     L.Trainer(strategy=squall.lightning.DDPStrategy(...)) (Squall in code)
  fabric-ddp           L.Fabric(strategy="ddp", devices=2).launch()
  accelerate           the script of `accelerate launch --cpu --num_processes 2`
  accelerate-squall    the same with squall.ddp.register after accelerator.prepare
  hf-trainer           transformers.Trainer, the script of `torchrun --nproc_per_node 2`
  notebook             accelerate.notebook_launcher(fn, num_processes=2) (forked ranks)
  spawn                torch.multiprocessing.spawn(fn, nprocs=2), DDP over gloo
  spawn-fsdp2, spawn-fsdp1    the same with FSDP2 (fully_shard) or FSDP1 instead of DDP
  spawn-fsdp2-squall-CODEC, spawn-fsdp1-squall-CODEC
                       and squall.fsdp.compress(model, codec=CODEC, warmup=20); CODEC+PCODEC
                       (FSDP2) also compresses the parameter all-gathers with PCODEC,
                       CODEC+PCODEC+overlap with overlap=True, CODEC+PCODEC+twice with
                       reuse_gathers=False (both: +overlap,twice), CODEC+PCODEC+keep
                       with fully_shard(reshard_after_forward=False)
  spawn-fsdp2-resume-CODEC    the FSDP2 one checkpointed 10 steps before the end and
                       resumed from it, with and without squall's state
  spawn-hsdp, spawn-hsdp-squall-CODEC    FSDP2's HSDP on 4 ranks (2 replicas of 2
                       shards), native, or sharded over the shard groups with the
                       all-reduce across replicas compressed (squall.fsdp, CODEC)
OPTIMIZER is sgd (momentum 0.9) or adamw. Every rank writes OUT/rank<R>.json:
its loss at every step and a digest of its final parameters.

The task: a fixed random teacher MLP labels Gaussian inputs (10 classes);
the student MLP learns it with cross-entropy, batch 32 per rank, each rank
drawing its own batches, the same at every run.
"""

import hashlib
import json
import os
import sys

import torch

IN, HIDDEN, CLASSES, BATCH = 32, 256, 10, 32
WORLD = 2


def batch(rank, step):
    g = torch.Generator().manual_seed(1_000_003 * (rank + 1) + step)
    teacher = torch.Generator().manual_seed(7)
    w1 = torch.randn(IN, 64, generator=teacher)
    w2 = torch.randn(64, CLASSES, generator=teacher)
    x = torch.randn(BATCH, IN, generator=g)
    return x, (torch.tanh(x @ w1) @ w2).argmax(dim=1)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, CLASSES))


def optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.AdamW(params, lr=2e-3)


def digest(state):
    """sha256 of a module's state (or a {name: full tensor} dict) in fp32."""
    if isinstance(state, torch.nn.Module):
        state = state.state_dict()
    h = hashlib.sha256()
    for p in state.values():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def write(out, rank, losses, state, extra=None):
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(dict(rank=rank, losses=losses, params=digest(state), **(extra or {})), f)


def finish():
    """Every rank done before any tears its process group down, and the group
    destroyed before exit: torch 2.15's gloo aborts a process now and then
    ("terminate called without an active exception") when it exits with
    the group still up."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def plain_loop(rank, kind, steps, net, opt, backward=None, first=0):
    """Steps first..steps-1; their losses."""
    losses = []
    for step in range(first, steps):
        x, y = batch(rank, step)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        (backward or (lambda t: t.backward()))(loss)
        opt.step()
        losses.append(loss.item())
    return losses


# -- Lightning -------------------------------------------------------------
# Module level, so that ddp_spawn can pickle them into its workers.
try:
    import lightning as L
except ImportError:  # the other launches need no Lightning
    L = None


class IndexData(torch.utils.data.Dataset):
    """The step numbers: each rank draws its batch from its rank and the step."""

    def __init__(self, steps):
        self.steps = steps

    def __len__(self):
        return self.steps

    def __getitem__(self, i):
        return i


if L is not None:
    class Module(L.LightningModule):
        def __init__(self, kind, out, squall_optimizer=False):
            super().__init__()
            self.net = model()
            self.kind, self.out, self.squall_optimizer = kind, out, squall_optimizer
            self.losses = []

        def training_step(self, index, _):
            x, y = batch(self.global_rank, int(index[0]))
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            if self.squall_optimizer:
                import squall.optim

                return squall.optim.APMSqueeze(self.parameters(), lr=2e-3, warmup=20)
            return optimizer(self.kind, self.parameters())

        def on_train_end(self):
            write(self.out, self.global_rank, self.losses, self.net)


def lightning(strategy, kind, steps, out):
    squall_optimizer = False
    if strategy == "squall":
        import squall.lightning

        strategy = squall.lightning.DDPStrategy(
            hook="onebit" if kind == "sgd" else "apmsqueeze", warmup=20)
        squall_optimizer = kind == "adamw"
    loader = torch.utils.data.DataLoader(IndexData(steps), batch_size=1, shuffle=False)
    trainer = L.Trainer(accelerator="cpu", devices=WORLD, strategy=strategy, max_steps=steps,
                        max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        use_distributed_sampler=False, num_sanity_val_steps=0)
    trainer.fit(Module(kind, out, squall_optimizer), loader)
    finish()


def fabric(kind, steps, out):
    f = L.Fabric(accelerator="cpu", devices=WORLD, strategy="ddp")
    f.launch()
    net = model()
    opt = optimizer(kind, net.parameters())
    wrapped, opt = f.setup(net, opt)
    losses = plain_loop(f.global_rank, kind, steps, wrapped, opt, backward=f.backward)
    write(out, f.global_rank, losses, net)
    finish()


# -- Accelerate ------------------------------------------------------------
def accelerate_job(kind, steps, out, squall_in_code=False):
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    net = model()
    opt = optimizer(kind, net.parameters())
    if squall_in_code:
        import squall
        import squall.ddp

        squall.init()
        if kind == "adamw":
            opt = squall.optim.APMSqueeze(net.parameters(), lr=2e-3, warmup=20)
    wrapped, opt = acc.prepare(net, opt)
    if squall_in_code:
        squall.ddp.register(wrapped, "onebit" if kind == "sgd" else "apmsqueeze",
                            optimizer=opt, warmup_steps=20)
    losses = plain_loop(acc.process_index, kind, steps, wrapped, opt, backward=acc.backward)
    write(out, acc.process_index, losses, net)
    finish()


# -- Hugging Face Trainer (under torchrun) ----------------------------------
def hf_trainer(kind, steps, out):
    from transformers import Trainer, TrainingArguments

    class Samples(torch.utils.data.Dataset):
        """Sample i is the i-th row of the batches rank i % WORLD would draw."""

        def __len__(self):
            return steps * BATCH * WORLD

        def __getitem__(self, i):
            x, y = batch(i % WORLD, i // (BATCH * WORLD))
            return {"x": x[i // WORLD % BATCH], "labels": y[i // WORLD % BATCH]}

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = model()
            self.losses = []

        def forward(self, x, labels):
            loss = torch.nn.functional.cross_entropy(self.net(x), labels)
            self.losses.append(loss.item())
            return {"loss": loss}

    # The arguments first: they create the process group.
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=BATCH, max_steps=steps,
                             use_cpu=True, ddp_backend="gloo", report_to=[],
                             save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             dataloader_num_workers=0, seed=0, data_seed=0)
    net = Net()
    opt = optimizer(kind, net.parameters())
    trainer = Trainer(model=net, args=args, train_dataset=Samples(),
                      optimizers=(opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)))
    trainer.train()
    write(out, args.process_index, net.losses, net.net)
    finish()


# -- torch.multiprocessing.spawn -----------------------------------------------
def spawned(rank, kind, steps, out, port):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    net = model()
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    opt = optimizer(kind, ddp.parameters())
    losses = plain_loop(rank, kind, steps, ddp, opt)
    write(out, rank, losses, net)
    finish()


def shard_fsdp2(net, **options):
    """FSDP2 the way these jobs use it: fully_shard per Linear and at the root."""
    from torch.distributed.fsdp import fully_shard

    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, **options)
    fully_shard(net, **options)
    return net


def spawned_fsdp(rank, kind, steps, out, port, version, squall_codec=None):
    """FSDP2 (fully_shard per Linear and at the root) or FSDP1 (a unit per
    Linear, use_orig_params) over gloo: Lightning's own fsdp strategy needs a
    GPU, so the CPU check of a sharded model is this one. With squall_codec:
    squall.fsdp.compress(codec=squall_codec, warmup=20)."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    codec, _, params = (squall_codec or "").partition("+")
    params, _, flags = params.partition("+")
    flags = flags.split(",")
    net = model()
    if version == "fsdp2":
        shard_fsdp2(net, **({"reshard_after_forward": False} if "keep" in flags else {}))
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        net = FSDP(net, device_id=torch.device("cpu"), use_orig_params=True,
                   auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}))
    compressed = None
    if squall_codec:
        import squall.fsdp

        compressed = squall.fsdp.compress(net, codec=codec, warmup=20, params=params or None,
                                          overlap="overlap" in flags,
                                          reuse_gathers="twice" not in flags)
    opt = optimizer(kind, net.parameters())
    losses = plain_loop(rank, kind, steps, net, opt)
    if version == "fsdp2":
        full = {k: v.full_tensor() for k, v in net.state_dict().items()}
    else:
        from torch.distributed.fsdp import FullStateDictConfig, StateDictType

        cfg = FullStateDictConfig(offload_to_cpu=False, rank0_only=False)
        with FSDP.state_dict_type(net, StateDictType.FULL_STATE_DICT, cfg):
            full = net.state_dict()
    write(out, rank, losses, full, extra=dict(
        fsdp=compressed.stats if compressed else None,
        forward_prefetch=len(compressed.forward_prefetch) if compressed else None))
    finish()


def spawned_hsdp(rank, kind, steps, out, port, squall_codec=None):
    """HSDP over 4 ranks, 2 replicas of 2 shards (shard groups {0, 1} and
    {2, 3}, replica groups {0, 2} and {1, 3}), each rank on its own batches.
    Without squall_codec: FSDP's native HSDP (fully_shard over the 2-D mesh).
    With it: fully_shard over the shard dimension alone and
    squall.fsdp.compress(codec=None, replicas=<replica group>,
    replicas_codec=squall_codec, warmup=20): the all-reduce across replicas
    compressed, the reduce-scatter inside each shard group FSDP's. squall_codec
    "refused": native HSDP, and what compress(replicas=...) says to it."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2 * WORLD)
    mesh = init_device_mesh("cpu", (2, WORLD), mesh_dim_names=("replicate", "shard"))
    net = model()
    refused = squall_codec == "refused"
    target = mesh["shard"] if squall_codec and not refused else mesh
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=target)
    fully_shard(net, mesh=target)
    compressed = None
    if squall_codec:
        import squall.fsdp

        try:
            compressed = squall.fsdp.compress(net, codec=None, warmup=20,
                                              replicas=mesh["replicate"].get_group(),
                                              replicas_codec="int4:block=256" if refused
                                              else squall_codec)
        except squall.SquallInvalidArgument as e:
            refused = str(e)
        steps = 0 if refused else steps
    opt = optimizer(kind, net.parameters())
    losses = plain_loop(rank, kind, steps, net, opt)
    full = {k: v.full_tensor() for k, v in net.state_dict().items()}
    write(out, rank, losses, full, extra=dict(fsdp=compressed.stats if compressed else None,
                                              refused=refused))
    finish()


def spawned_fsdp_resume(rank, kind, steps, out, port, codec):
    """A checkpoint mid-run and a resume from it, FSDP2 under
    squall.fsdp.compress(codec, warmup=20): the model's, the optimizer's and
    squall's state saved (through torch.save, as a job would) after `steps` - 10
    steps; then the last 10 steps run three ways: on (a), in a fresh model and
    optimizer loaded from the checkpoint with squall's state (b), and without
    it (c: residuals and warmup counters lost)."""
    import io

    import torch.distributed as dist

    import squall.fsdp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)

    def build():
        net = shard_fsdp2(model())
        compressed = squall.fsdp.compress(net, codec=codec, warmup=20)
        return net, optimizer(kind, net.parameters()), compressed

    cut = steps - 10
    net, opt, compressed = build()
    plain_loop(rank, kind, cut, net, opt)
    saved = io.BytesIO()
    torch.save({"model": net.state_dict(), "optim": opt.state_dict(),
                "squall": compressed.state_dict()}, saved)
    went_on = plain_loop(rank, kind, steps, net, opt, first=cut)
    resumed = {}
    for name, with_squall in (("resumed", True), ("without_squall_state", False)):
        saved.seek(0)
        ckpt = torch.load(saved, weights_only=False)
        net, opt, compressed = build()
        net.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optim"])
        if with_squall:
            compressed.load_state_dict(ckpt["squall"])
        resumed[name] = plain_loop(rank, kind, steps, net, opt, first=cut)
        resumed[name + "_stats"] = compressed.stats
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(dict(rank=rank, losses=went_on, **resumed), f)
    finish()


def main():
    launch, kind, steps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    port = int(sys.argv[5]) if len(sys.argv) > 5 else 29500
    torch.set_num_threads(1)
    if launch.startswith("lightning-"):
        lightning(launch.split("-", 1)[1], kind, steps, out)
    elif launch == "fabric-ddp":
        fabric(kind, steps, out)
    elif launch in ("accelerate", "accelerate-squall"):
        accelerate_job(kind, steps, out, squall_in_code=launch == "accelerate-squall")
    elif launch == "hf-trainer":
        hf_trainer(kind, steps, out)
    elif launch == "notebook":
        from accelerate import notebook_launcher

        notebook_launcher(accelerate_job, (kind, steps, out), num_processes=WORLD,
                          use_port=str(port))
    elif launch == "spawn":
        torch.multiprocessing.spawn(spawned, args=(kind, steps, out, port), nprocs=WORLD)
    elif launch in ("spawn-fsdp2", "spawn-fsdp1"):
        torch.multiprocessing.spawn(spawned_fsdp, nprocs=WORLD,
                                    args=(kind, steps, out, port, launch.split("-")[1]))
    elif launch.startswith("spawn-fsdp2-resume-"):  # the codec follows
        torch.multiprocessing.spawn(spawned_fsdp_resume, nprocs=WORLD,
                                    args=(kind, steps, out, port, launch.split("-", 3)[3]))
    elif launch == "spawn-hsdp" or launch.startswith("spawn-hsdp-squall-"):  # the codec follows
        codec = launch.split("-", 3)[3] if launch != "spawn-hsdp" else None
        torch.multiprocessing.spawn(spawned_hsdp, nprocs=2 * WORLD,
                                    args=(kind, steps, out, port, codec))
    elif launch.startswith(("spawn-fsdp2-squall-", "spawn-fsdp1-squall-")):  # the codec follows
        _, version, _, codec = launch.split("-", 3)
        torch.multiprocessing.spawn(spawned_fsdp, nprocs=WORLD,
                                    args=(kind, steps, out, port, version, codec))
    else:
        raise SystemExit(f"train.py: unknown launch {launch!r}")


if __name__ == "__main__":
    main()
