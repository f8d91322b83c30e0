#!/usr/bin/env python3
"""Checks that an interposer loads without MPI: neither it nor anything it
pulls in needs libmpi, and it exports no MPI symbol (ld.so ignores an
LD_PRELOAD library whose dependencies it cannot find, and one that defined
MPI_Allreduce would need MPI to forward it).

    check_no_mpi.py LIBRARY
"""
import shutil
import subprocess
import sys


def main():
    lib = sys.argv[1]
    if shutil.which("readelf") is None:
        print("SKIP: readelf not found (apt-get install binutils)")
        return 77
    dynamic = subprocess.run(["readelf", "-d", "-W", lib], capture_output=True, text=True,
                             check=True).stdout
    needed = [line.split("[", 1)[1].rstrip("]") for line in dynamic.splitlines()
              if "(NEEDED)" in line]
    print("NEEDED:", ", ".join(needed))
    failed = [n for n in needed if "mpi" in n.lower()]
    if shutil.which("ldd") is not None:
        closure = subprocess.run(["ldd", lib], capture_output=True, text=True).stdout
        failed += [line.split()[0] for line in closure.splitlines() if "libmpi" in line]
    symbols = subprocess.run(["readelf", "--dyn-syms", "-W", lib], capture_output=True,
                             text=True, check=True).stdout
    exported = [f[7] for f in (line.split() for line in symbols.splitlines())
                if len(f) >= 8 and f[6] != "UND" and f[4] in ("GLOBAL", "WEAK")]
    if "ncclAllReduce" not in exported:
        print(f"FAILED: {lib} does not export ncclAllReduce")
        return 1
    failed += [s for s in exported if s.startswith(("MPI_", "PMPI_", "ompi_"))]
    if failed:
        print(f"FAILED: {lib} needs or defines MPI: {', '.join(sorted(set(failed)))}")
        return 1
    print(f"{lib}: no MPI")
    return 0


if __name__ == "__main__":
    sys.exit(main())
