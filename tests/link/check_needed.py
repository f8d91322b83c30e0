#!/usr/bin/env python3
"""Checks that shipped libraries need nothing on the loader path but the C
and C++ runtimes.

Squall's libraries go into processes that others assembled: a pip torch
whose CUDA runtime and NCCL live in site-packages/nvidia/ (on no loader
path), an MPI job, NCCL's proxy. A NEEDED entry beyond the runtimes either
stops the library from loading (ld.so skips an LD_PRELOAD library whose
dependencies it cannot find, printing one line) or binds the process to a
second copy of a library it already has.

    check_needed.py [--allow SONAME_PREFIX]... [--allow-runpath] [--preload] LIBRARY...

--allow adds a permitted prefix (libsquall-preload.so may need libmpi, and
--allow-runpath lets it keep the RUNPATH MPI's own link flags give it, where
the MPI job's libmpi is found); --preload also runs `env -i LD_PRELOAD=LIBRARY /bin/true`, which must
print nothing and succeed.
"""
import argparse
import shutil
import subprocess
import sys

# glibc's pieces (libdl, libpthread and librt are stubs inside libc since
# 2.34, but older links still name the first two) and the C++ runtime.
RUNTIMES = ("libc.so.", "libm.so.", "libstdc++.so.", "libgcc_s.so.", "libdl.so.",
            "libpthread.so.", "ld-linux")


def needed(lib):
    dynamic = subprocess.run(["readelf", "-d", "-W", lib], capture_output=True, text=True,
                             check=True).stdout
    entries = [line.split("[", 1)[1].rstrip("]") for line in dynamic.splitlines()
               if "(NEEDED)" in line]
    paths = [line.split("[", 1)[1].rstrip("]") for line in dynamic.splitlines()
             if "(RUNPATH)" in line or "(RPATH)" in line]
    return entries, paths


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--allow", action="append", default=[], help="another permitted prefix")
    ap.add_argument("--allow-runpath", action="store_true", help="permit a RUNPATH")
    ap.add_argument("--preload", action="store_true", help="also LD_PRELOAD it into /bin/true")
    ap.add_argument("libraries", nargs="+")
    args = ap.parse_args()
    if shutil.which("readelf") is None:
        print("SKIP: readelf not found (apt-get install binutils)")
        return 77
    allowed = RUNTIMES + tuple(args.allow)
    failed = False
    for lib in args.libraries:
        entries, paths = needed(lib)
        print(f"{lib}: NEEDED {', '.join(entries)}" + (f"; RUNPATH {':'.join(paths)}"
                                                        if paths else ""))
        extra = [e for e in entries if not e.startswith(allowed)]
        if extra:
            print(f"FAILED: {lib} needs {', '.join(extra)}, which a process assembled by "
                  "someone else may not have on its loader path (or has another copy of)")
            failed = True
        if paths and not args.allow_runpath:
            print(f"FAILED: {lib} has a RUNPATH/RPATH ({':'.join(paths)}): it would find "
                  "libraries by this machine's layout, not the process's")
            failed = True
        if args.preload:
            run = subprocess.run(["env", "-i", f"LD_PRELOAD={lib}", "/bin/true"],
                                 capture_output=True, text=True, timeout=60)
            said = (run.stdout + run.stderr).strip()
            if run.returncode != 0 or said:
                print(f"FAILED: env -i LD_PRELOAD={lib} /bin/true exited {run.returncode} "
                      f"and printed: {said or '(nothing)'}")
                failed = True
            else:
                print(f"{lib}: LD_PRELOAD into /bin/true prints nothing")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
