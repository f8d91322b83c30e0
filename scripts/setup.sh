#!/usr/bin/env bash
# Installs what building and testing Squall needs, when it is missing.
# Sourced by demo.sh and test.sh; safe to run repeatedly (does nothing when
# everything is present). Needs root (or sudo) only when something is missing.
set -euo pipefail

SQUALL_PACKAGES=(
  meson ninja-build pkg-config g++ clang-format clang-tidy
  libgtest-dev
  libucx-dev libopenmpi-dev openmpi-bin
  iproute2 python3
  python3-torch python3-numpy python3-pytest python3-wheel python3-venv
  # the LD_PRELOAD interposer's tests: mpi4py, and what Horovod 0.28.1 builds
  # against (tests/plugin/preload/horovod_test.py pip-installs Horovod itself)
  python3-mpi4py libtorch-dev pybind11-dev python3-cloudpickle cmake
  # the convergence study (perf/convergence): its data sets and plots
  python3-sklearn python3-matplotlib
)

missing=()
for p in "${SQUALL_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "squall setup: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || {
      echo "squall setup: need root (or sudo) to install: ${missing[*]}" >&2
      exit 1
    }
    SUDO=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# nvcc is optional; the build finds it here when the CUDA toolkit is present.
if [[ -x /usr/local/cuda/bin/nvcc ]] && ! command -v nvcc >/dev/null; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
