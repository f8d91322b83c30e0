"""Every way people start training (Lightning's Trainer with ddp and
ddp_spawn, Fabric, `accelerate launch`, Accelerate's notebook_launcher,
Hugging Face's Trainer under torchrun, torch.multiprocessing.spawn, and
FSDP2 under spawn), each run plain and
under every squallrun mode, and Squall in code through squall.lightning and
squall.ddp.register: each finishes, every rank's report shows what was
compressed (or, for the sharded model, says it was left uncompressed), and
the loss of the last 20 of 96 steps stays within the mode's bound of the
plain run (docs/python.md, "Frameworks"). Runs under PyPI's torch with
Lightning, Accelerate and transformers installed (scripts/pypi_torch.sh);
skips without them.
"""

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

pytest.importorskip("lightning", reason="Lightning is not installed (scripts/pypi_torch.sh "
                    "installs it in PyPI torch's venv)")
pytest.importorskip("accelerate", reason="Accelerate is not installed")

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "train.py")
STEPS = 96  # a multiple of SlowMo's tau: its ranks end on a sync, identical
ENV = {"GLOO_SOCKET_IFNAME": "lo", "SQUALL_SOCKET_IFNAME": "lo", "SQUALL_TRANSPORT": "tcp",
       "OMP_NUM_THREADS": "1", "SQUALL_TIMEOUT_S": "60"}
LAUNCHES = ["lightning-ddp", "lightning-ddp_spawn", "fabric-ddp", "accelerate", "notebook",
            "hf-trainer", "spawn", "spawn-fsdp2", "spawn-fsdp1"]
# mode: (squallrun options, optimizer, bound on the loss against plain, in %)
MODES = {
    "hook": (["--hook", "onebit", "--warmup", "20"], "sgd", 4.0),
    "apmsqueeze": (["--optimizer", "apmsqueeze", "--warmup", "20"], "adamw", 6.0),
    "slowmo": (["--slowmo", "8"], "adamw", 12.0),
}

FSDP_BOUND = 3.0  # squall.fsdp's compressed reduce-scatter against plain FSDP2, in %
IN, HIDDEN, CLASSES = 32, 256, 10  # train.py's model


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(launch, kind, out):
    port = str(_port())
    if launch.startswith("accelerate"):
        # On a machine without GPUs, --multi_gpu is how Accelerate starts
        # several CPU processes (through torchrun; they train on gloo).
        return [shutil.which("accelerate") or "accelerate", "launch", "--multi_gpu",
                "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
                "--dynamo_backend", "no", "--main_process_port", port, TRAIN, launch, kind,
                str(STEPS), out]
    if launch == "hf-trainer":
        return [shutil.which("torchrun") or "torchrun", "--nnodes", "1", "--nproc_per_node", "2",
                "--master_addr", "127.0.0.1", "--master_port", port, TRAIN, launch, kind,
                str(STEPS), out]
    return [sys.executable, TRAIN, launch, kind, str(STEPS), out, port]


def _run(launch, kind, options, tmp_path, name, world=2):
    out = tmp_path / name
    out.mkdir()
    cmd = _command(launch, kind, str(out))
    if options is not None:
        cmd = [sys.executable, "-m", "squall.run", *options, "--", *cmd]
    env = dict(os.environ, SQUALL_RUN_REPORT=str(out), **ENV)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, cwd=out)
    if r.returncode != 0 and "terminate called without an active exception" in r.stderr:
        # torch 2.15's gloo aborts a process at exit now and then, after the
        # job has finished (plain runs too: 1 in 3 plain FSDP1 runs once):
        # the job is run once more.
        for f in out.iterdir():
            f.unlink()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, cwd=out)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    ranks = [json.loads((out / f"rank{k}.json").read_text()) for k in range(world)]
    reports = [json.loads((out / f"squallrun-rank{k}.json").read_text())
               for k in (0, 1)] if options is not None else None
    return ranks, reports, r.stderr


def _loss(ranks):
    return sum(sum(r["losses"][-20:]) for r in ranks) / (20 * len(ranks))


_plain = {}


def _baseline(launch, kind, tmp_path):
    if (launch, kind) not in _plain:
        ranks, _, _ = _run(launch, kind, None, tmp_path, f"plain-{kind}")
        assert ranks[0]["params"] == ranks[1]["params"], "the plain run's replicas differ"
        _plain[(launch, kind)] = ranks
    return _plain[(launch, kind)]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("launch", LAUNCHES)
def test_launch_under_squallrun(launch, mode, tmp_path):
    if launch == "hf-trainer":
        pytest.importorskip("transformers", reason="transformers is not installed")
    options, kind, bound = MODES[mode]
    plain = _baseline(launch, kind, tmp_path)
    ranks, reports, stderr = _run(launch, kind, options, tmp_path, mode)
    assert ranks[0]["params"] == ranks[1]["params"], "the ranks' parameters differ at the end"
    rel = 100.0 * (_loss(ranks) / _loss(plain) - 1.0)
    if launch.startswith("spawn-fsdp") and mode == "hook":
        # FSDP's reduce-scatter compressed (squall.fsdp, int4:block=256).
        for rep in reports:
            assert rep["fsdp_modules"] >= 3 and not rep["uncompressed"], rep
            assert rep["fsdp_compressed_calls"] == 3 * (STEPS - 20), rep
        assert abs(rel) <= FSDP_BOUND, f"loss {rel:+.2f}% from plain (bound {FSDP_BOUND}%)"
        return
    if launch.startswith("spawn-fsdp"):
        # Sharded: the optimizers squallrun would swap in average whole
        # replicas, so it leaves the job as written and says so.
        assert all(r["uncompressed"] for r in reports), reports
        assert "left as the script wrote it, uncompressed: FSDP shards" in stderr, stderr[-2000:]
        assert ranks[0]["losses"] == plain[0]["losses"]
        return
    assert abs(rel) <= bound, f"{mode}: loss {_loss(ranks):.4f} is {rel:+.2f}% from plain " \
        f"{_loss(plain):.4f} (bound {bound}%)"
    for rep in reports:
        assert not rep["uncompressed"], rep
        if mode == "hook":
            assert rep["ddp_hooks"] == 1 and rep["compressed_buckets"] >= STEPS - 20, rep
        elif mode == "apmsqueeze":
            assert rep["optimizers"] == 1, rep
        else:
            assert rep["slowmo_optimizers"] == 1, rep


@pytest.mark.parametrize("version,codec", [("fsdp2", "none"), ("fsdp2", "int4:block=256"),
                                           ("fsdp2", "onebit:block=64:scale=rms"),
                                           ("fsdp2", "none+none"),
                                           ("fsdp2", "int4:block=256+int8:block=256"),
                                           ("fsdp1", "none"), ("fsdp1", "int4:block=256")])
def test_fsdp_compressed_reduce_scatter(version, codec, tmp_path):
    """squall.fsdp.compress on FSDP2 (fully_shard per Linear and the root)
    and FSDP1 (a unit per Linear), AdamW: 'none' is torch's result exactly;
    the codes hold the loss. CODE+PCODE compresses the parameter all-gathers
    too (FSDP2): 'none+none' is torch's result exactly, so the gathered
    layout is FSDP's."""
    plain = _baseline(f"spawn-{version}", "adamw", tmp_path)
    ranks, _, _ = _run(f"spawn-{version}-squall-{codec}", "adamw", None, tmp_path, "squall")
    stats = ranks[0]["fsdp"]
    assert stats["compressed_calls"] == 3 * (STEPS - 20), stats
    if "+" in codec:  # three Linear modules, gathered in forward and again in backward
        gathers = stats["all_gather"]
        assert gathers["compressed_calls"] == 2 * 3 * STEPS, gathers
        assert gathers["reused_calls"] == 3 * STEPS, gathers  # backward's: forward's bytes
        # Each rank sends its shards once per step (forward's gather): the
        # model's parameters over 2 ranks, in the code's bytes (header,
        # scales, padding: < 5%).
        numel = (IN * HIDDEN + HIDDEN) + (HIDDEN * HIDDEN + HIDDEN) + (HIDDEN * CLASSES + CLASSES)
        per_element = 4.0 if codec.endswith("none") else 1.0
        expected = STEPS * per_element * numel / 2
        assert expected <= gathers["bytes_sent"] <= 1.05 * expected, (gathers, expected)
    if codec.startswith("none"):
        assert ranks[0]["losses"] == plain[0]["losses"]
        return
    rel = 100.0 * (_loss(ranks) / _loss(plain) - 1.0)
    assert abs(rel) <= FSDP_BOUND, f"{codec}: loss {rel:+.2f}% from plain (bound {FSDP_BOUND}%)"
    assert ranks[0]["losses"] != plain[0]["losses"]


def _same_job(tmp_path, first, second):
    """The FSDP2 job with int4 reduce-scatters and int8 parameter gathers,
    launched with two sets of flags (train.py's +FLAGS after the codes): the
    two give the same losses and parameters, bit for bit. Returns each
    rank's pair of records."""
    codec = "int4:block=256+int8:block=256"
    one, _, _ = _run(f"spawn-fsdp2-squall-{codec}{first}", "adamw", None, tmp_path, "first")
    two, _, _ = _run(f"spawn-fsdp2-squall-{codec}{second}", "adamw", None, tmp_path, "second")
    for a, b in zip(one, two):
        assert a["losses"] == b["losses"] and a["params"] == b["params"]
    return list(zip(one, two))


def test_fsdp_overlapped_gathers(tmp_path):
    """compress(params=..., overlap=True) runs the host all-gathers on a
    thread of their own, every module prefetching the next one's in forward
    (the root and three Linears, in the order the first step ran them):
    every gather went there, and the job's losses and parameters are the
    ones of the same job with each gather in FSDP's call (the default,
    overlap=False), bit for bit."""
    for a, b in _same_job(tmp_path, "+overlap", ""):
        gathers, alone = a["fsdp"]["all_gather"], b["fsdp"]["all_gather"]
        # forward's gathers (backward's reuse them, in the call)
        assert gathers["overlapped_calls"] == 3 * STEPS, a
        assert gathers["compressed_calls"] == 2 * 3 * STEPS, a
        assert alone["overlapped_calls"] == 0 and alone["compressed_calls"] == 2 * 3 * STEPS, b
        assert a["forward_prefetch"] == 4 and b["forward_prefetch"] == 0, (a, b)


@pytest.mark.parametrize("flags", ["", "+overlap"])
def test_fsdp_reused_gathers(flags, tmp_path):
    """compress(params=...) reuses gathers (reuse_gathers=True, the
    default): each Linear module's gather in backward decodes what its
    forward gather received, so the parameter bytes on the wire halve (one
    gather per module and step, not two), and the job is the one with
    reuse_gathers=False, which gathers again, bit for bit (the encoding of a
    shard that did not change is the same), in FSDP's call or on the
    gatherer thread."""
    for a, b in _same_job(tmp_path, flags, f"+twice{flags.replace('+', ',')}"):
        gathers, both = a["fsdp"]["all_gather"], b["fsdp"]["all_gather"]
        assert gathers["compressed_calls"] == both["compressed_calls"] == 2 * 3 * STEPS, a
        assert gathers["reused_calls"] == 3 * STEPS and both["reused_calls"] == 0, (a, b)
        assert 2 * gathers["bytes_sent"] == both["bytes_sent"], (gathers, both)


def test_fsdp_gathers_without_resharding(tmp_path):
    """fully_shard(reshard_after_forward=False) with compressed gathers: FSDP
    gathers each module once per step, in forward, so nothing is kept or
    reused, and backward computes with forward's values as the reused
    gathers do: the job is the default one (resharded, reusing) bit for
    bit, with the same gather bytes."""
    for a, b in _same_job(tmp_path, "+keep", ""):
        gathers, other = a["fsdp"]["all_gather"], b["fsdp"]["all_gather"]
        assert gathers["compressed_calls"] == 3 * STEPS and gathers["reused_calls"] == 0, a
        assert gathers["bytes_sent"] == other["bytes_sent"], (gathers, other)


def test_squallrun_fsdp_params(tmp_path):
    """squallrun --hook onebit --fsdp-params int8:block=256 on the unmodified
    FSDP2 job: its parameter all-gathers are compressed too (every one: 3
    modules, forward and backward, backward's decoding forward's bytes
    again), the replicas agree, the loss holds."""
    options = ["--hook", "onebit", "--warmup", "20", "--fsdp-params", "int8:block=256"]
    plain = _baseline("spawn-fsdp2", "sgd", tmp_path)
    ranks, reports, _ = _run("spawn-fsdp2", "sgd", options, tmp_path, "params")
    assert ranks[0]["params"] == ranks[1]["params"]
    for rep in reports:
        assert not rep["uncompressed"], rep
        assert rep["fsdp_all_gather_calls"] == 2 * 3 * STEPS, rep
        assert rep["fsdp_all_gather_reused_calls"] == 3 * STEPS, rep  # backward's
        assert rep["fsdp_compressed_calls"] == 3 * (STEPS - 20), rep
    rel = 100.0 * (_loss(ranks) / _loss(plain) - 1.0)
    assert abs(rel) <= FSDP_BOUND, f"loss {rel:+.2f}% from plain (bound {FSDP_BOUND}%)"


def test_fsdp_checkpoint_resumes_exactly(tmp_path):
    """squall.fsdp's state in a checkpoint: FSDP2, AdamW, int4:block=256,
    saved 10 steps before the end (after 20 full and STEPS - 30 compressed
    reduce-scatters per module) with torch.save and loaded into a fresh model,
    optimizer and compress(): the last 10 losses are the ones the job that went
    on had, bit for bit; loading everything but squall's state does not give
    them (the residuals are lost and the warmup starts again)."""
    ranks, _, _ = _run("spawn-fsdp2-resume-int4:block=256", "adamw", None, tmp_path, "resume")
    for r in ranks:  # the counters go on too: 3 modules, each compressing after 20 calls
        assert r["resumed"] == r["losses"], r
        assert r["without_squall_state"] != r["losses"], r
        assert r["resumed_stats"]["compressed_calls"] == 3 * (STEPS - 20), r
        assert r["without_squall_state_stats"]["compressed_calls"] == 0, r


@pytest.mark.parametrize("codec", ["none", "int4:block=256"])
def test_hsdp_replicas_compressed(codec, tmp_path):
    """HSDP on 4 ranks, 2 replicas of 2 shards: sharded over the shard groups
    with squall.fsdp.compress(codec=None, replicas=<replica group>), every
    Linear module's all-reduce across replicas goes through Squall (20
    full-precision calls, then compressed), all 4 ranks end with the same
    parameters, and the loss is native HSDP's: within float rounding at
    'none' (the sums run in another order), within FSDP_BOUND at int4, which
    sends 7x fewer bytes than the fp32 all-reduce of 2 replicas would."""
    plain, _, _ = _run("spawn-hsdp", "adamw", None, tmp_path, "plain", world=4)
    ranks, _, _ = _run(f"spawn-hsdp-squall-{codec}", "adamw", None, tmp_path, "squall", world=4)
    assert len({r["params"] for r in plain}) == 1, "native HSDP's ranks differ"
    assert len({r["params"] for r in ranks}) == 1, "the replicas' parameters differ"
    stats = ranks[0]["fsdp"]
    assert stats["calls"] == 0, stats  # the reduce-scatter is FSDP's own
    average = stats["all_reduce"]
    assert average["calls"] == 3 * STEPS and average["full_calls"] == 3 * 20, average
    assert average["compressed_calls"] == 3 * (STEPS - 20), average
    # Each rank's shard of the three modules, every compressed step.
    shard = ((IN * HIDDEN + HIDDEN) + (HIDDEN * HIDDEN + HIDDEN) + (HIDDEN * CLASSES + CLASSES)) / 2
    fp32 = (STEPS - 20) * 4.0 * shard  # an fp32 all-reduce of 2 sends one copy
    rel = 100.0 * (_loss(ranks) / _loss(plain) - 1.0)
    if codec == "none":
        assert abs(rel) <= 0.01, f"loss {rel:+.4f}% from native HSDP"
        assert 0.98 * fp32 <= average["bytes_sent"] <= 1.02 * fp32, (average, fp32)
    else:
        assert abs(rel) <= FSDP_BOUND, f"{codec}: loss {rel:+.2f}% from native HSDP"
        assert average["bytes_sent"] <= fp32 / 7, (average, fp32)


def test_hsdp_native_mesh_refused(tmp_path):
    """compress(replicas=...) on a model sharded over the 2-D mesh (native
    HSDP, whose all-reduce FSDP makes itself before any hook) refuses on
    every rank, saying how to shard instead."""
    ranks, _, _ = _run("spawn-hsdp-squall-refused", "adamw", None, tmp_path, "refused", world=4)
    for r in ranks:
        assert "sharded over a 2-D mesh" in r["refused"], r
        assert "mesh=mesh['shard']" in r["refused"], r


@pytest.mark.parametrize("launch,kind", [("lightning-squall", "sgd"),
                                         ("lightning-squall", "adamw"),
                                         ("accelerate-squall", "sgd"),
                                         ("accelerate-squall", "adamw")])
def test_squall_in_the_framework(launch, kind, tmp_path):
    """squall.lightning.DDPStrategy and squall.ddp.register after
    accelerator.prepare: the same job with no launcher's help."""
    base = "lightning-ddp" if launch.startswith("lightning") else "accelerate"
    plain = _baseline(base, kind, tmp_path)
    ranks, _, _ = _run(launch, kind, None, tmp_path, "squall")
    assert ranks[0]["params"] == ranks[1]["params"]
    bound = MODES["hook" if kind == "sgd" else "apmsqueeze"][2]
    rel = 100.0 * (_loss(ranks) / _loss(plain) - 1.0)
    assert abs(rel) <= bound, f"loss {rel:+.2f}% from plain (bound {bound}%)"
    assert ranks[0]["losses"] != plain[0]["losses"], "nothing was compressed"
