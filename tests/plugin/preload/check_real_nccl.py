#!/usr/bin/env python3
"""Checks that the NCCL interposer resolves every NCCL entry point it
forwards to from a real libnccl.so.2 (no GPU needed: dlopen, dlsym and
ncclGetVersion).

    check_real_nccl.py INTERPOSER LIBNCCL [VERSION]

A Python process that links no NCCL runs with LD_PRELOAD=INTERPOSER and
SQUALL_NCCL_LIBRARY=LIBNCCL, and calls ncclGetVersion through the
interposer's export: that makes the interposer resolve its table of the real
NCCL's functions, which it reports at INFO (the version, the library, and
any entry point the library lacks). The check fails when an entry point is
missing or the version is not VERSION. An optional entry point (one of a
newer NCCL, like ncclAllReduceConfig of 2.31) may be absent from an older
library, but not from one of its version or later.
"""
import os
import re
import subprocess
import sys

PROBE = r"""
import ctypes
f = ctypes.CDLL(None).ncclGetVersion
f.argtypes = [ctypes.POINTER(ctypes.c_int)]
v = ctypes.c_int()
rc = f(ctypes.byref(v))
print(f"ncclGetVersion -> {rc}, {v.value}")
"""


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    interposer, nccl = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    want = sys.argv[3] if len(sys.argv) > 3 else None
    env = dict(os.environ, LD_PRELOAD=interposer, SQUALL_NCCL_LIBRARY=nccl,
               SQUALL_DEBUG="INFO", SQUALL_DEBUG_SUBSYS="API", CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                       timeout=120, env=env)
    out = r.stdout + r.stderr
    print(out.strip())
    failed = []
    m = re.search(r"ncclGetVersion -> (\d+), (\d+)", out)
    code = None
    if r.returncode != 0 or m is None or m.group(1) != "0":
        failed.append(f"ncclGetVersion through the interposer failed (exit {r.returncode})")
    else:
        code = int(m.group(2))
        got = f"{code // 10000}.{code // 100 % 100}.{code % 100}"
        if want and got != want:
            failed.append(f"the interposer reached NCCL {got}, not {want}")
    optional = re.search(r"lacks the optional ([^;]+), whose calls fail", out)
    for name, major, minor in re.findall(r"(\w+) \(NCCL (\d+)\.(\d+)\+\)",
                                         optional.group(1) if optional else ""):
        if code is not None and code >= int(major) * 10000 + int(minor) * 100:
            failed.append(f"the interposer lacks {name}, which NCCL {major}.{minor} and later have")
    resolved = re.search(r"forwards to NCCL \S+ at (\S+) \([^)]*\): every one of its (\d+) entry "
                         r"points",
                         out)
    if resolved is None:
        lacks = re.search(r"lacks ([^;]+)", out)
        failed.append("the interposer did not resolve every entry point"
                      + (f": it lacks {lacks.group(1)}" if lacks else " (no INFO line)"))
    elif os.path.realpath(resolved.group(1)) != os.path.realpath(nccl):
        failed.append(f"the interposer forwards to {resolved.group(1)}, not {nccl}")
    for f in failed:
        print("FAILED:", f)
    if not failed:
        print(f"check_real_nccl: {interposer} resolves all {resolved.group(2)} entry points "
              f"from {nccl}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
