"""squallrun: runs an unmodified torch training script with Squall.

    squallrun [--optimizer apmsqueeze] [--hook onebit] [--slowmo TAU]
              [--warmup STEPS] [--codec CODEC] [--preload] -- torchrun ... train.py ...

The command after ``--`` runs with a ``sitecustomize`` on ``PYTHONPATH``
(squall/_inject) that, in every worker process (where torchrun, srun or
mpirun set a rank), patches torch before the script starts:

* ``--hook onebit``: every DistributedDataParallel the script builds gets
  ``squall.ddp.onebit_hook`` (full-precision warmup, then 1-bit momentum when
  the model's optimizer has a momentum, else 1-bit gradients), and every
  module FSDP2's ``fully_shard`` makes and every FSDP1 unit gets squall.fsdp's
  compressed reduce-scatter (``--codec``, default int4:block=256);
* ``--optimizer apmsqueeze``: ``torch.optim.Adam`` / ``AdamW`` build
  ``squall.optim.APMSqueeze`` with the same hyper-parameters, and every DDP
  model gets ``squall.ddp.apmsqueeze_hook`` (so gradients are not averaged
  twice);
* ``--slowmo TAU``: every torch optimizer is wrapped in
  ``squall.optim.SlowMo(opt, tau=TAU)``, and DDP models get a hook that
  leaves gradients local (SlowMo averages the parameters itself);
* ``--preload``: ``LD_PRELOAD`` gets libsquall-preload-nccl.so (the NCCL
  interposer: it needs no MPI, so it loads into torchrun and every worker).

The Squall communicator is made with ``squall.init()`` over the script's
default process group, on first need. One line at start says what changed.
"""

import argparse
import ctypes
import json
import os
import sys

from . import _lib

ENV_CONFIG = "SQUALL_RUN_CONFIG"  # the choices, as JSON, for the injected sitecustomize
FSDP_CODEC = "int4:block=256"  # squall.fsdp.DEFAULT_CODEC (importing it here would need torch)


def _parser():
    p = argparse.ArgumentParser(
        prog="squallrun", description="Run an unmodified torch script with Squall.",
        usage="squallrun [options] -- torchrun ... train.py ...")
    p.add_argument("--optimizer", choices=["apmsqueeze"],
                   help="replace torch.optim.Adam/AdamW with squall.optim.APMSqueeze")
    p.add_argument("--hook", choices=["onebit"],
                   help="register squall.ddp.onebit_hook on every DistributedDataParallel")
    p.add_argument("--slowmo", type=int, metavar="TAU",
                   help="wrap every optimizer in squall.optim.SlowMo(tau=TAU)")
    p.add_argument("--slowmo-stream", metavar="FRAGMENTS:DELAY",
                   help="with --slowmo, stream the syncs: FRAGMENTS fragments on a staggered "
                        "schedule, each overlapped with the next DELAY steps (e.g. 5:4)")
    p.add_argument("--warmup", type=int, default=100, metavar="STEPS",
                   help="full-precision warmup steps of APMSqueeze and the 1-bit hook "
                        "(default 100)")
    p.add_argument("--codec", help="codec (default onebit; for FSDP's reduce-scatters "
                   "int4:block=256, squall.fsdp.DEFAULT_CODEC)")
    p.add_argument("--fsdp-params", metavar="CODE",
                   help="with --hook onebit, also compress FSDP2's parameter all-gathers with "
                        "CODE (e.g. int8:block=256; default: full precision)")
    p.add_argument("--fsdp-no-reuse", action="store_true",
                   help="with --fsdp-params, gather the parameters again in backward instead of "
                        "decoding forward's gather once more (about 0.5 bytes per parameter "
                        "less held from forward to backward at int4, twice the gather bytes)")
    p.add_argument("--preload", action="store_true",
                   help="set LD_PRELOAD to the NCCL interposer (libsquall-preload-nccl.so)")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="the launch command, after --")
    return p


def _preload_library():
    here = os.path.dirname(os.path.realpath(_lib.path))
    for candidate in (os.path.join(here, "libsquall-preload-nccl.so"),
                      os.path.join(here, "..", "..", "plugin", "preload",
                                   "libsquall-preload-nccl.so")):
        if os.path.exists(candidate):
            return os.path.normpath(candidate)
    return None


def plan(args):
    """(config dict, one-line description) for the parsed arguments; raises
    SystemExit with the reason for a combination that cannot work."""
    if args.optimizer and args.slowmo:
        raise SystemExit("squallrun: --optimizer apmsqueeze and --slowmo exclude each other "
                         "(APMSqueeze communicates every step, SlowMo every TAU steps)")
    if args.hook and (args.optimizer or args.slowmo):
        raise SystemExit("squallrun: --hook onebit averages gradients; with --optimizer or "
                         "--slowmo the optimizer communicates instead: choose one")
    if args.slowmo is not None and args.slowmo < 1:
        raise SystemExit(f"squallrun: --slowmo TAU must be >= 1, not {args.slowmo}")
    stream = None
    if args.slowmo_stream is not None:
        if not args.slowmo:
            raise SystemExit("squallrun: --slowmo-stream streams SlowMo's syncs: give --slowmo "
                             "TAU too")
        try:
            fragments, delay = (int(v) for v in args.slowmo_stream.split(":"))
        except ValueError:
            raise SystemExit(f"squallrun: --slowmo-stream is FRAGMENTS:DELAY (e.g. 5:4), not "
                             f"{args.slowmo_stream!r}") from None
        if not 1 <= fragments <= args.slowmo or not 0 <= delay < args.slowmo:
            raise SystemExit(f"squallrun: --slowmo-stream {args.slowmo_stream}: FRAGMENTS must "
                             f"be 1 to TAU ({args.slowmo}) and DELAY 0 to TAU - 1")
        stream = (fragments, delay)
    if args.warmup < 1 and args.hook:
        raise SystemExit("squallrun: --warmup must be >= 1 with --hook onebit (DDP rebuilds "
                         "its buckets after the first iteration)")
    if args.fsdp_params and not args.hook:
        raise SystemExit("squallrun: --fsdp-params compresses FSDP2's parameter all-gathers "
                         "beside its reduce-scatters, which --hook onebit compresses: give both")
    if args.fsdp_no_reuse and not args.fsdp_params:
        raise SystemExit("squallrun: --fsdp-no-reuse is about compressed parameter all-gathers; "
                         "give --fsdp-params CODE too")
    if args.fsdp_params:
        spec = _lib.CodecSpec()
        if _lib.lib.squallCodecSpecParse(args.fsdp_params.encode(), ctypes.byref(spec)) != 0:
            raise SystemExit(f"squallrun: --fsdp-params {args.fsdp_params}: "
                             f"{_lib.lib.squallGetLastError().decode()}")
    codec = args.codec or "onebit"
    fsdp_codec = args.codec or FSDP_CODEC
    config = {"optimizer": args.optimizer, "hook": args.hook, "slowmo": args.slowmo,
              "slowmo_stream": stream,
              "warmup": args.warmup, "codec": codec, "fsdp_codec": fsdp_codec,
              "fsdp_params": args.fsdp_params, "fsdp_no_reuse": args.fsdp_no_reuse}
    said = []
    if args.hook:
        said.append(f"DDP comm hook squall.ddp.onebit_hook ({codec}, warmup "
                    f"{args.warmup} steps); FSDP's reduce-scatters compressed "
                    f"({fsdp_codec})" + (f" and FSDP2's parameter all-gathers "
                                         f"({args.fsdp_params}"
                                         + (", gathered again in backward"
                                            if args.fsdp_no_reuse else "")
                                         + ")" if args.fsdp_params else ""))
    if args.optimizer:
        said.append(f"torch.optim.Adam/AdamW -> squall.optim.APMSqueeze ({codec}, warmup "
                    f"{args.warmup} steps) with squall.ddp.apmsqueeze_hook on DDP models")
    if args.slowmo:
        streamed = (f", fragments={stream[0]}, delay={stream[1]}" if stream else "")
        said.append(f"every optimizer -> squall.optim.SlowMo(tau={args.slowmo}{streamed}); DDP "
                    "keeps gradients local")
    if args.preload:
        said.append("LD_PRELOAD=libsquall-preload-nccl.so")
    if not said:
        said.append("nothing (no option given)")
    return config, "squallrun: " + "; ".join(said)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        _parser().error("give the launch command after --, e.g. squallrun --hook onebit -- "
                        "torchrun --nproc_per_node 4 train.py")
    config, line = plan(args)
    env = dict(os.environ)
    inject = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_inject")
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(
        [inject, package_root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env[ENV_CONFIG] = json.dumps(config)
    env.setdefault("SQUALL_LIBRARY", _lib.path)  # the workers load the same library
    if args.preload:
        lib = _preload_library()
        if lib is None:
            raise SystemExit("squallrun: --preload: libsquall-preload-nccl.so is not next to "
                             f"{_lib.path}; build it (meson -Dpreload=enabled) or set LD_PRELOAD")
        env["LD_PRELOAD"] = " ".join(x for x in (lib, env.get("LD_PRELOAD")) if x)
    print(line, flush=True)
    try:
        os.execvpe(command[0], command, env)
    except OSError as e:
        raise SystemExit(f"squallrun: cannot run {command[0]}: {e}")


if __name__ == "__main__":
    main()
